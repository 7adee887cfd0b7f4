"""Move accuracy of board-state and move-history models on the same held-out positions.

The board-vs-history comparison (seed 001's question): every model scores every position (with a next move) of the
same games; a model's move is its most probable *legal* move; accuracies get game-level bootstrap
intervals and paired differences to a baseline (``allie_jax.eval.stats.compare_systems``).

A board checkpoint with refinement is also scored with the refinement pass skipped
(``NAME/pass1``), which isolates what the second pass adds to the same weights. Throughput of
the board models (positions/s with and without the refinement pass) is measured interleaved
(ABAB..., ``rounds`` times) so the ratio holds under a shared machine's load.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from allie_jax import vocab
from allie_jax.data import board_features
from allie_jax.game import Game

CHUNK = 256


@dataclasses.dataclass
class HeldOut:
    """Positions of the held-out games: inputs for the board models, labels, legal moves."""

    games: list[Game]
    game_ids: np.ndarray  # int [P] index of the game
    plies: np.ndarray  # int [P]
    human: np.ndarray  # int [P] move id played
    legal: np.ndarray  # bool [P, 1968]
    inputs: dict[str, np.ndarray]  # board_features.INPUT_FIELDS, [P, ...]


def held_out_positions(games: Sequence[Game]) -> HeldOut:
    rows, gids, plies = [], [], []
    for g, game in enumerate(games):
        for ply, ex in enumerate(board_features.game_examples(game)):
            rows.append(ex)
            gids.append(g)
            plies.append(ply)
    batch = board_features.stack(rows)
    return HeldOut(
        games=list(games),
        game_ids=np.asarray(gids),
        plies=np.asarray(plies),
        human=batch["policy_target"].astype(np.int64),
        legal=batch["move_info"] >= 0,
        inputs={k: batch[k] for k in board_features.INPUT_FIELDS},
    )


def _legal_argmax(scores: np.ndarray, legal: np.ndarray) -> np.ndarray:
    return np.where(legal, scores, -np.inf).argmax(-1)


def board_predictions(forward, data: HeldOut, *, refine: bool = True) -> np.ndarray:
    """Most probable legal move per position of a ``engine.board.BoardForward``."""
    preds = []
    for start in range(0, len(data.human), CHUNK):
        sl = slice(start, start + CHUNK)
        lp, _, _, _ = forward.outputs_from_inputs(
            {k: v[sl] for k, v in data.inputs.items()}, refine=refine
        )
        preds.append(_legal_argmax(lp, data.legal[sl]))
    return np.concatenate(preds)


def allie_predictions(model, data: HeldOut, *, batch_size: int = 16) -> np.ndarray:
    """Most probable legal move per position of a decoder (one causal pass per game).

    Positions beyond the decoder's context get −1 (counted wrong; none in blitz-length games).
    """
    from allie_jax.eval.scoring import CausalScorer

    scorer = CausalScorer(model, batch_size=batch_size)
    per_game: dict[int, np.ndarray] = {}
    for i, res in scorer.score(data.games):
        per_game[i] = res.log_probs[:, : vocab.NUM_MOVES]
    preds = np.full(len(data.human), -1, np.int64)
    for p, (g, ply) in enumerate(zip(data.game_ids, data.plies, strict=True)):
        lp = per_game[int(g)]
        if ply < len(lp):
            preds[p] = int(np.where(data.legal[p], lp[ply], -np.inf).argmax())
    return preds


def throughput(forward, data: HeldOut, *, rounds: int = 5, positions: int = 512) -> dict:
    """Positions/s with and without the refinement pass, interleaved; median ratio and range."""
    sl = slice(0, min(positions, len(data.human)))
    inputs = {k: v[sl] for k, v in data.inputs.items()}
    n = sl.stop

    def timed(refine: bool) -> float:
        t = time.perf_counter()
        for start in range(0, n, CHUNK):
            forward.outputs_from_inputs(
                {k: v[start : start + CHUNK] for k, v in inputs.items()}, refine=refine
            )
        return n / (time.perf_counter() - t)

    timed(True), timed(False)  # compile both
    with_refine, without = [], []
    for _ in range(rounds):
        with_refine.append(timed(True))
        without.append(timed(False))
    ratios = [a / b for a, b in zip(with_refine, without, strict=True)]
    return {
        "positions_per_s_refine": statistics.median(with_refine),
        "positions_per_s_pass1": statistics.median(without),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds": rounds,
        "positions": n,
    }


def compare(
    checkpoints: Mapping[str, str],
    games: Sequence[Game],
    *,
    baseline: str,
    rounds: int = 5,
    cache_dir=None,
) -> dict[str, Any]:
    """Accuracies (game bootstrap) of every checkpoint, paired differences to ``baseline``.

    ``cache_dir``: keep each model's per-position results there (keyed by name, checkpoint and
    the number of positions), so a comparison can grow one model at a time.
    """
    import json

    from etils import epath

    from allie_jax.engine.board import BoardForward, is_board_model
    from allie_jax.eval.stats import compare_systems
    from allie_jax.model.checkpoint import load_model

    data = held_out_positions(games)
    correct: dict[str, np.ndarray] = {}
    speed: dict[str, dict] = {}
    info: dict[str, dict] = {}
    cache = epath.Path(cache_dir) if cache_dir else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    for name, path in checkpoints.items():
        entry = cache / f"{name}.json" if cache is not None else None
        key = {"checkpoint": str(path), "positions": int(len(data.human))}
        if entry is not None and entry.exists():
            saved = json.loads(entry.read_text())
            if saved["key"] == key:
                for k, flags in saved["correct"].items():
                    correct[k] = np.asarray(flags, bool)
                info[name] = saved["info"]
                if saved.get("speed"):
                    speed[name] = saved["speed"]
                continue
        before = set(correct)
        model = load_model(path)
        if is_board_model(model):
            forward = BoardForward(model)
            correct[name] = board_predictions(forward, data) == data.human
            info[name] = {"family": "board", **model.config.to_dict()}
            if model.config.refinement:
                correct[f"{name}/pass1"] = (
                    board_predictions(forward, data, refine=False) == data.human
                )
                speed[name] = throughput(forward, data, rounds=rounds)
        else:
            correct[name] = allie_predictions(model, data) == data.human
            info[name] = {"family": "allie", **model.config.to_dict()}
        if entry is not None:
            flags = {k: correct[k].astype(int).tolist() for k in set(correct) - before}
            record = {"key": key, "correct": flags, "info": info[name], "speed": speed.get(name)}
            entry.write_text(json.dumps(record))
    result = compare_systems(correct, data.game_ids, baseline=baseline)
    return {
        "games": len(games),
        "positions": int(len(data.human)),
        "accuracy": result["overall"],
        "throughput": speed,
        "models": info,
    }


def markdown(report: Mapping[str, Any], baseline: str) -> str:
    lines = [
        f"Held-out: {report['games']} games, {report['positions']} positions. "
        "95% CIs resample games.",
        "",
        f"| model | move accuracy | 95% CI | minus {baseline} | 95% CI |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in report["accuracy"].items():
        acc = row["accuracy"]
        diff = row.get("minus_" + baseline)
        d = (
            f"{100 * diff['value']:+.1f} pp | [{100 * diff['ci95'][0]:+.1f}, "
            f"{100 * diff['ci95'][1]:+.1f}]"
            if diff
            else "— | —"
        )
        lines.append(
            f"| {name} | {100 * acc['value']:.1f}% | [{100 * acc['ci95'][0]:.1f}, "
            f"{100 * acc['ci95'][1]:.1f}] | {d} |"
        )
    if report["throughput"]:
        lines += [
            "",
            "| board model | positions/s (2 passes) | positions/s (pass 1 only) | ratio (median, min–max) |",
            "| --- | --- | --- | --- |",
        ]
        for name, t in report["throughput"].items():
            lines.append(
                f"| {name} | {t['positions_per_s_refine']:.0f} | {t['positions_per_s_pass1']:.0f} | "
                f"{t['ratio_median']:.2f} ({t['ratio_min']:.2f}–{t['ratio_max']:.2f}) |"
            )
    return "\n".join(lines)
