"""``evaluate(...)``: every offline result of the paper (SPEC §5) from a checkpoint and a PGN.

What each system's "top move" is (the paper's move matching):
- ``policy``: argmax of the policy restricted to legal moves, conditioned on the game's true Elos
  (the paper's Allie-Policy accuracy uses the model's top-1 move; it samples only when playing).
- ``greedy``: the same argmax with both header Elos set to ``SearchConfig.greedy_elo`` (2500), as
  the Allie-Greedy preset plays.
  Both come from one causal pass per game over all of its positions.
- ``search`` / ``adaptive``: argmax of the final search policy (π̄) returned by
  ``allie_jax.search.Searcher`` for the preset, on a seeded subsample of the accuracy positions
  (``search_positions``), since each search costs tens of model evaluations. The policy's
  accuracy on the same positions is reported next to it for a paired comparison.

The other metrics (legality, think time, resignation, value) describe the model itself and come
from the true-Elo causal pass.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
from collections.abc import Sequence

import numpy as np

from allie_jax import vocab
from allie_jax.eval import metrics
from allie_jax.eval.positions import SPECIAL_MOVES, GamePositions, game_positions, random_game
from allie_jax.eval.scoring import CausalScorer, PositionOutputs
from allie_jax.game import Game

SYSTEMS = ("policy", "greedy", "search", "adaptive")
THINK_TIME_EDGES = (0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 45, 60)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    systems: tuple[str, ...] = SYSTEMS
    max_games: int = 1000
    search_positions: int = 200  # subsample of accuracy positions for search / adaptive
    search_batch_size: int = 64  # fewer, larger batches: fewer search programs to compile
    random_games: int = 100  # random legal games for the out-of-distribution legality check
    batch_size: int = 16  # games per causal pass
    min_ply: int = 10  # move matching skips the first 5 moves (10 plies) ...
    min_clock: float = 30.0  # ... and moves made with less than 30 s on the mover's clock
    resign_value: float = -0.9
    stockfish: str | None = None  # path of a UCI Stockfish for the oracle value comparison
    stockfish_positions: int = 200
    stockfish_nodes: int = 20_000
    calibration_pgn: str | None = None  # games played by systems (the match tool's PGN) ...
    calibration_systems: tuple[str, ...] = ()  # ... and the system names in its headers
    system_options: tuple[tuple[str, str], ...] = ()  # key=value pairs for system factories
    top_k: int = 5  # moves kept per position and system in the records
    seed: int = 0
    progress: bool = True
    plots: bool = True

    def __post_init__(self) -> None:
        from allie_jax.eval.systems import check_names

        check_names(self.systems)
        for name in ("max_games", "batch_size", "search_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        for name in ("search_positions", "random_games", "stockfish_positions"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be non-negative")
        if bool(self.calibration_pgn) != bool(self.calibration_systems):
            raise ValueError("calibration needs both calibration_pgn and calibration_systems")


@dataclasses.dataclass
class GameResult:
    """The per-position quantities of one game that the metrics need (logits are not kept)."""

    pred: np.ndarray  # int32 [K] argmax of the legal policy (−1 where no legal move)
    top_legal: np.ndarray  # bool [K] the top move token is legal
    invalid_mass: np.ndarray  # float64 [K]
    resign: np.ndarray  # bool [K] the resign rule fires
    value_white: np.ndarray  # float32 [K]
    time_s: np.ndarray  # float32 [K]


def reduce_outputs(
    out: PositionOutputs, gp: GamePositions, *, resign_value: float = -0.9
) -> GameResult:
    """Reduce one game's log-probabilities to the per-position facts the metrics use."""
    k = len(out.value_white)
    mask = gp.legal_mask()[:k]
    has_legal = mask.any(axis=1)
    moves = out.log_probs[:, : vocab.NUM_MOVES]
    legal_logp = np.where(mask, moves, -np.inf)
    pred = np.where(has_legal, legal_logp.argmax(axis=1), -1).astype(np.int32)
    top_legal, invalid = metrics.legal_move_stats(out.log_probs, mask)
    value_to_move = np.where(gp.white_to_move[:k], out.value_white, -out.value_white)
    resign = metrics.resign_decisions(
        out.log_probs[:, vocab.TERMINATION],
        legal_logp.max(axis=1),
        value_to_move,
        value_threshold=resign_value,
    )
    return GameResult(pred, top_legal, invalid, resign & has_legal, out.value_white, out.time_s)


def _progress(total: int, desc: str, enabled: bool, unit: str = "game"):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False)


def _score_all(
    scorer: CausalScorer,
    games: Sequence[Game],
    gps: Sequence[GamePositions],
    *,
    desc: str,
    cfg: EvalConfig,
    elo_override: int | None = None,
) -> list[GameResult]:
    results: list[GameResult | None] = [None] * len(games)
    with _progress(len(games), desc, cfg.progress) as bar:
        for i, out in scorer.score(games, elo_override=elo_override, on_batch=bar.update):
            results[i] = reduce_outputs(out, gps[i], resign_value=cfg.resign_value)
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Metric assembly


def accuracy_block(
    correct: np.ndarray, mover_elo: np.ndarray, special: dict[str, np.ndarray]
) -> dict:
    """``{"overall", "by_elo", "special", "positions"}`` for one system over its positions."""
    known = ~np.isnan(mover_elo)
    return {
        "overall": metrics.rate(correct),
        "by_elo": metrics.rate_by_bin(correct[known], metrics.elo_bin(mover_elo[known])),
        "special": {k: metrics.rate(correct[special[k]]) for k in SPECIAL_MOVES},
        "positions": int(correct.size),
    }


@dataclasses.dataclass
class _AccuracyPositions:
    game: np.ndarray  # int [P]
    ply: np.ndarray  # int [P]
    human: np.ndarray  # int32 [P]
    mover_elo: np.ndarray  # float [P]
    special: dict[str, np.ndarray]


def accuracy_positions(
    gps: Sequence[GamePositions], covered: Sequence[int], cfg: EvalConfig
) -> _AccuracyPositions:
    """The positions counted for move matching (after ply 10, mover's clock ≥ 30 s, inside max_len)."""
    game, ply = [], []
    for g, (gp, k) in enumerate(zip(gps, covered, strict=True)):
        mask = gp.accuracy_mask(min_ply=cfg.min_ply, min_clock=cfg.min_clock)
        mask[min(k, gp.num_moves) :] = False
        idx = np.flatnonzero(mask)
        game.append(np.full(idx.size, g))
        ply.append(idx)
    game_a = np.concatenate(game) if game else np.zeros(0, int)
    ply_a = np.concatenate(ply) if ply else np.zeros(0, int)
    human = np.array([gps[g].move_ids[i] for g, i in zip(game_a, ply_a, strict=True)], np.int32)
    elo = np.array([gps[g].mover_elo[i] for g, i in zip(game_a, ply_a, strict=True)], np.float64)
    special = {
        k: np.array([gps[g].special[k][i] for g, i in zip(game_a, ply_a, strict=True)], bool)
        for k in SPECIAL_MOVES
    }
    return _AccuracyPositions(game_a, ply_a, human, elo, special)


def legal_block(results: Sequence[GameResult], gps: Sequence[GamePositions], seed: int) -> dict:
    """Top-move legality and invalid mass over the positions where a move was made."""
    top, invalid, check = [], [], []
    for r, gp in zip(results, gps, strict=True):
        k = min(len(r.pred), gp.num_moves)
        top.append(r.top_legal[:k])
        invalid.append(r.invalid_mass[:k])
        check.append(gp.in_check[:k])
    top_a, inv_a, chk_a = (np.concatenate(x) for x in (top, invalid, check))
    return {
        "all": {
            "top_legal": metrics.rate(top_a),
            "invalid_mass": metrics.mean_with_ci(inv_a, seed=seed),
        },
        "check": {
            "top_legal": metrics.rate(top_a[chk_a]),
            "invalid_mass": metrics.mean_with_ci(inv_a[chk_a], seed=seed),
        },
    }


def think_time_block(results: Sequence[GameResult], gps: Sequence[GamePositions]) -> dict:
    """Pearson r of predicted vs human seconds (labels clipped to [0, 60] s, the training target)."""
    pred, human = [], []
    for r, gp in zip(results, gps, strict=True):
        k = min(len(r.pred), gp.num_moves)
        t = gp.think_time[:k]
        sel = t >= 0
        pred.append(r.time_s[:k][sel])
        human.append(np.clip(t[sel], 0.0, 60.0))
    pred_a = np.concatenate(pred).astype(np.float64)
    human_a = np.concatenate(human)
    return {
        "pearson_r": metrics.pearson(pred_a, human_a),
        "positions": int(pred_a.size),
        "by_human_time": metrics.quantiles_by_bin(pred_a, human_a, THINK_TIME_EDGES),
        "mean_predicted_s": float(pred_a.mean()) if pred_a.size else math.nan,
        "mean_human_s": float(human_a.mean()) if human_a.size else math.nan,
    }


def resign_block(results: Sequence[GameResult], gps: Sequence[GamePositions]) -> dict:
    """TPR on final boards of games the side to move lost by resigning; FPR on every other board.

    Final boards are read from the partial-game pass (no termination or EOS in the input), so the
    answer cannot leak. Resigned games whose final board has the *winner* to move (the loser
    resigned on the opponent's turn) count for neither rate: the rule is the mover's decision.
    """
    positives, negatives = [], []
    resigned_games = skipped_winner_to_move = uncovered = 0
    for r, gp in zip(results, gps, strict=True):
        k = len(r.pred)
        n = gp.num_moves
        final_covered = k == n + 1
        negatives.append(r.resign[: min(k, n)])
        if gp.resigned:
            resigned_games += 1
            if not final_covered:
                uncovered += 1
            elif gp.loser_to_move:
                positives.append(bool(r.resign[n]))
            else:
                skipped_winner_to_move += 1
        elif final_covered and len(gp.legal_ids[n]):
            negatives.append(r.resign[n : n + 1])
    neg = np.concatenate(negatives) if negatives else np.zeros(0, bool)
    return {
        "tpr": metrics.rate(np.array(positives, bool)),
        "fpr": metrics.rate(neg),
        "resigned_games": resigned_games,
        "resigned_games_winner_to_move": skipped_winner_to_move,
        "resigned_games_truncated": uncovered,
    }


def value_block(results: Sequence[GameResult], gps: Sequence[GamePositions]) -> dict:
    """Pearson r of the value (White's view) with the game result per game-progress decile."""
    value, outcome, decile = [], [], []
    for r, gp in zip(results, gps, strict=True):
        if gp.result is None:
            continue
        k = len(r.pred)
        value.append(r.value_white)
        outcome.append(np.full(k, gp.result))
        decile.append(metrics.progress_decile(np.arange(k), np.full(k, gp.num_moves)))
    v, o, d = (np.concatenate(x) for x in (value, outcome, decile))
    return {
        "overall": metrics.pearson(v, o),
        "by_progress": metrics.pearson_by_group(v, o, d, range(10)),
        "positions": int(v.size),
    }


def stockfish_block(
    path: str,
    gps: Sequence[GamePositions],
    games: Sequence[Game],
    results: Sequence[GameResult],
    cfg: EvalConfig,
) -> dict:
    """Oracle comparison on a seeded subsample: Stockfish's WDL expectation (White's view, in
    [−1, 1]) vs the game result and vs the model's value, per progress decile and overall."""
    import chess
    import chess.engine

    cands = [
        (g, i)
        for g, (gp, r) in enumerate(zip(gps, results, strict=True))
        if gp.result is not None
        for i in range(min(len(r.pred), gp.num_moves))
    ]
    rng = np.random.default_rng(cfg.seed + 2)
    picks = rng.choice(len(cands), size=min(cfg.stockfish_positions, len(cands)), replace=False)
    sf, allie, outcome, decile = [], [], [], []
    with chess.engine.SimpleEngine.popen_uci(path) as engine:
        for p in sorted(picks):
            g, i = cands[p]
            board = chess.Board()
            for uci in games[g].moves[:i]:
                board.push_uci(uci)
            info = engine.analyse(board, chess.engine.Limit(nodes=cfg.stockfish_nodes))
            expectation = info["score"].white().wdl(model="sf").expectation()
            sf.append(2.0 * expectation - 1.0)
            allie.append(float(results[g].value_white[i]))
            outcome.append(gps[g].result)
            decile.append(int(metrics.progress_decile([i], [gps[g].num_moves])[0]))
    sf_a, al_a, out_a, dec_a = (np.array(x, np.float64) for x in (sf, allie, outcome, decile))
    return {
        "positions": int(sf_a.size),
        "nodes": cfg.stockfish_nodes,
        "stockfish_vs_outcome": metrics.pearson(sf_a, out_a),
        "value_vs_outcome": metrics.pearson(al_a, out_a),
        "value_vs_stockfish": metrics.pearson(al_a, sf_a),
        "stockfish_by_progress": metrics.pearson_by_group(sf_a, out_a, dec_a, range(10)),
    }


# ---------------------------------------------------------------------------------------------
# The entry point


def load_games(path: str | pathlib.Path, max_games: int) -> tuple[list[Game], dict]:
    from allie_jax.pgn import ParseStats, read_games

    stats = ParseStats()
    games = []
    for game in read_games(str(path), stats=stats):
        games.append(game)
        if len(games) >= max_games:
            break
    return games, {"games_read": stats.games_read, "dropped": dict(stats.dropped)}


def evaluate(
    checkpoint,
    games_path: str | pathlib.Path,
    output_dir: str | pathlib.Path | None = None,
    config: EvalConfig = EvalConfig(),
) -> dict:
    """Run every offline metric; write report.json, report.md and plots when ``output_dir`` is set.

    ``checkpoint`` is a checkpoint directory, a training workdir (``load_model`` picks its best,
    else latest, checkpoint) or an already built ``AllieModel``.
    """
    cfg = config
    t0 = time.perf_counter()
    if isinstance(checkpoint, str | pathlib.Path):
        from allie_jax.model.checkpoint import load_model

        model = load_model(checkpoint)
        checkpoint_name = str(checkpoint)
    else:
        model, checkpoint_name = checkpoint, type(checkpoint).__name__
    games, parse = load_games(games_path, cfg.max_games)
    if not games:
        raise ValueError(f"no usable game in {games_path} (parse stats: {parse})")

    gps: list[GamePositions] = []
    kept: list[Game] = []
    rejected = 0
    with _progress(len(games), "rules", cfg.progress) as bar:
        for g in games:
            try:
                gps.append(game_positions(g))
                kept.append(g)
            except ValueError as e:
                logging.warning("skipping game: %s", e)
                rejected += 1
            bar.update(1)
    games = kept
    scorer = CausalScorer(model, batch_size=cfg.batch_size)

    t_pass = time.perf_counter()
    results = _score_all(scorer, games, gps, desc="policy", cfg=cfg)
    pass_s = time.perf_counter() - t_pass
    covered = [len(r.pred) for r in results]
    acc = accuracy_positions(gps, covered, cfg)
    policy_correct = (
        np.array([results[g].pred[i] for g, i in zip(acc.game, acc.ply, strict=True)], np.int32)
        == acc.human
    )

    report: dict = {"move_accuracy": {}}
    timings = {"policy_pass_s": pass_s}
    if "policy" in cfg.systems:
        report["move_accuracy"]["policy"] = {
            **accuracy_block(policy_correct, acc.mover_elo, acc.special),
            "subsample": False,
        }
    from allie_jax.eval.systems import Positions, SystemContext, make_systems

    others = [s for s in cfg.systems if s != "policy"]
    context = SystemContext(model=model, config=cfg, options=dict(cfg.system_options))
    systems = make_systems(others, context) if others else []  # policy alone (make demo)
    everywhere = Positions(games, gps, acc.game, acc.ply, seed=cfg.seed)
    sub = np.zeros(0, int)
    if any(s.subsample for s in systems) and cfg.search_positions > 0 and acc.game.size:
        rng = np.random.default_rng(cfg.seed)
        sub = np.sort(
            rng.choice(acc.game.size, size=min(cfg.search_positions, acc.game.size), replace=False)
        )
    for system in systems:
        rows = sub if system.subsample else np.arange(acc.game.size)
        if system.subsample and not rows.size:
            continue
        t = time.perf_counter()
        with _progress(rows.size, system.name, cfg.progress, unit="pos") as bar:
            system.on_batch = bar.update if hasattr(system, "on_batch") else None
            scores = system.score(
                Positions(games, gps, everywhere.game[rows], everywhere.ply[rows], seed=cfg.seed)
            )
        key = f"{system.name}_s" if system.subsample else f"{system.name}_pass_s"
        timings[key] = time.perf_counter() - t
        correct = scores.top1 == acc.human[rows]
        block = {
            **accuracy_block(
                correct, acc.mover_elo[rows], {k: v[rows] for k, v in acc.special.items()}
            ),
            "subsample": bool(system.subsample),
            **dict(system.info),
        }
        if system.subsample:
            block["policy_same_positions"] = metrics.rate(policy_correct[rows])
            block["mean_sims"] = float(scores.num_sims.mean()) if rows.size else math.nan
        report["move_accuracy"][system.name] = block

    report["legal"] = {"human": legal_block(results, gps, cfg.seed)}
    if cfg.random_games:
        rng = np.random.default_rng(cfg.seed)
        rgames = [random_game(rng) for _ in range(cfg.random_games)]
        rgps = [game_positions(g) for g in rgames]
        rresults = _score_all(scorer, rgames, rgps, desc="random", cfg=cfg)
        report["legal"]["random"] = legal_block(rresults, rgps, cfg.seed)
        report["legal"]["random_games"] = len(rgames)
    report["think_time"] = think_time_block(results, gps)
    report["resign"] = resign_block(results, gps)
    report["value"] = value_block(results, gps)
    if cfg.stockfish:
        report["value"]["stockfish"] = stockfish_block(cfg.stockfish, gps, games, results, cfg)

    if cfg.calibration_pgn:
        from allie_jax.eval.calibration import calibration_from_pgn

        table = calibration_from_pgn(cfg.calibration_pgn, cfg.calibration_systems)
        report["calibration"] = table.to_dict()

    positions = sum(covered)
    report["meta"] = {
        "checkpoint": checkpoint_name,
        "games_file": str(games_path),
        "games": len(games),
        "games_rejected": rejected,
        **parse,
        "positions_scored": positions,
        "positions_truncated": sum(gp.num_moves + 1 for gp in gps) - positions,
        "systems": list(cfg.systems),
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("progress",)},
        "model": dataclasses.asdict(model.config),
        "accuracy_rule": (
            f"top-1 of the legal policy vs the human move; plies < {cfg.min_ply} and moves made "
            f"with < {cfg.min_clock:g} s on the mover's clock excluded"
        ),
        "timings_s": timings,
        "policy_positions_per_s": positions / pass_s if pass_s > 0 else math.nan,
        "elapsed_s": time.perf_counter() - t0,
    }
    if output_dir is not None:
        write_outputs(report, output_dir, plots=cfg.plots)
    return report


def write_outputs(report: dict, output_dir: str | pathlib.Path, *, plots: bool = True) -> None:
    from allie_jax.eval.report import to_markdown

    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        from allie_jax.eval.plots import write_plots

        report.setdefault("meta", {})["plots"] = write_plots(report, out)
    (out / "report.json").write_text(
        json.dumps(_jsonable(report), indent=2, allow_nan=False) + "\n"
    )
    (out / "report.md").write_text(to_markdown(report))


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None  # strict JSON has no NaN: "not measurable" (no positions, constant series)
    return x
