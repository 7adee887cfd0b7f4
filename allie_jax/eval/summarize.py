"""The report (report.json's dict) from per-position records alone (``allie_jax.eval.records``).

A direct run and ``launch.evaluate --report_only`` both call ``build_report``, so slicing the
records (``--filter``) or merging shards gives the same numbers a run over that slice would.

What each number is computed on (the paper's protocol, SPEC §5):
- move matching: rows where a human move was made, after ply ``min_ply``, with at least
  ``min_clock`` s on the mover's clock (``positions.protocol_mask``), that the Allie policy scored
  (inside its context) and the system scored; a system's move is its top-1 (``{s}.top_moves[0]``).
- legality, think time, value, resignation: the Allie policy (``policy.*``) at the rows it scored.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from allie_jax.eval import metrics, stats
from allie_jax.eval.positions import SPECIAL_MOVES, protocol_mask
from allie_jax.eval.records import Records, column, top1_array

THINK_TIME_EDGES = (0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 45, 60)


class Columns:
    """The numpy views of a records table the metric blocks read (nulls filled)."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.n = table.num_rows
        # games as integer codes (grouping for the game bootstrap), not millions of Python strings
        ids = pc.dictionary_encode(table.column("game_id").combine_chunks())
        self.game_id = ids.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        self.ply = column(table, "ply", np.int64, -1)
        self.num_moves = column(table, "num_moves", np.int64, 0)
        self.moving = self.ply < self.num_moves
        self.final = self.ply == self.num_moves
        white = self.ply % 2 == 0
        self.mover_elo = np.where(white, column(table, "white_elo"), column(table, "black_elo"))
        self.clock_before = column(table, "clock_before")
        self.human_think = column(table, "human_think_time")
        self.in_check = column(table, "in_check", bool, False)
        self.num_legal = column(table, "num_legal", np.int64, 0)
        self.special = {k: column(table, k, bool, False) for k in SPECIAL_MOVES}
        self.result = column(table, "result")
        self.resigned = column(table, "resigned", bool, False)
        self.loser_to_move = column(table, "loser_to_move", bool, False)

    def correct(self, system: str) -> np.ndarray:
        """bool [R]: the system's top move is the human's (False where either is missing)."""
        same = pc.equal(top1_array(self.table, system), self.table.column("human_move"))
        return pc.fill_null(same, False).to_numpy(zero_copy_only=False).astype(bool)

    def has(self, system: str) -> bool:
        return f"{system}.scored" in self.table.column_names

    def scored(self, system: str) -> np.ndarray:
        return column(self.table, f"{system}.scored", bool, False)

    def get(self, system: str, field: str, dtype=np.float64, fill=np.nan) -> np.ndarray:
        return column(self.table, f"{system}.{field}", dtype, fill)


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


def move_accuracy(
    c: Columns, systems: list[str], info: dict, *, min_ply: int, min_clock: float, seed: int = 0
) -> dict:
    """Per system: Wilson intervals over positions (``overall``), a game-level bootstrap
    (``overall_by_game``: positions of one game are not independent) and, next to the Allie
    policy, the paired difference on exactly the same positions (``minus_policy``)."""
    proto = protocol_mask(c.ply, c.num_moves, c.clock_before, min_ply, min_clock)
    has_policy = c.has("policy")
    if has_policy:  # positions inside the Allie model's context: every system on the same ones
        proto &= c.scored("policy")
        policy_correct = c.correct("policy")
    out = {}
    for name in systems:
        sub = dict(info.get(name, {}))
        subsample = bool(sub.pop("subsample", False))
        rows = proto & c.scored(name)
        correct = c.correct(name)[rows]
        block = {
            **accuracy_block(
                correct,
                c.mover_elo[rows],
                {k: v[rows] for k, v in c.special.items()},
            ),
            "subsample": subsample,
            **sub,
        }
        ids = c.game_id[rows]
        block["overall_by_game"] = stats.game_rate(correct, ids, seed=seed)
        if has_policy and name != "policy":
            block["minus_policy"] = stats.paired_difference(
                correct, policy_correct[rows], ids, seed=seed
            )
        if subsample:
            if has_policy:
                block["policy_same_positions"] = metrics.rate(policy_correct[rows])
            sims = c.get(name, "num_sims")[rows]
            block["mean_sims"] = float(sims.mean()) if sims.size else math.nan
        out[name] = block
    return out


def legal_block(c: Columns, seed: int) -> dict:
    """Top-move legality and invalid mass over the positions where a move was made."""
    rows = c.moving & c.scored("policy")
    top = c.get("policy", "top_legal", bool, False)[rows]
    inv = c.get("policy", "invalid_mass")[rows]
    chk = c.in_check[rows]
    return {
        "all": {
            "top_legal": metrics.rate(top),
            "invalid_mass": metrics.mean_with_ci(inv, seed=seed),
        },
        "check": {
            "top_legal": metrics.rate(top[chk]),
            "invalid_mass": metrics.mean_with_ci(inv[chk], seed=seed),
        },
    }


def think_time_block(c: Columns) -> dict:
    """Pearson r of predicted vs human seconds (labels clipped to [0, 60] s, the training target)."""
    rows = c.moving & c.scored("policy") & (c.human_think >= 0)
    pred = c.get("policy", "think_time")[rows]
    human = np.clip(c.human_think[rows], 0.0, 60.0)
    return {
        "pearson_r": metrics.pearson(pred, human),
        "positions": int(pred.size),
        "by_human_time": metrics.quantiles_by_bin(pred, human, THINK_TIME_EDGES),
        "mean_predicted_s": float(pred.mean()) if pred.size else math.nan,
        "mean_human_s": float(human.mean()) if human.size else math.nan,
    }


def resign_block(c: Columns) -> dict:
    """TPR on final boards of games the side to move lost by resigning; FPR on every other board.

    Final boards come from the partial-game pass (no termination or EOS in the input), so the
    answer cannot leak. Resigned games whose final board has the *winner* to move (the loser
    resigned on the opponent's turn) count for neither rate: the rule is the mover's decision.
    """
    scored = c.scored("policy")
    resign = c.get("policy", "resign", bool, False)
    finals = c.final
    res_final = finals & c.resigned
    positives = res_final & scored & c.loser_to_move
    negatives = (c.moving & scored) | (finals & ~c.resigned & scored & (c.num_legal > 0))
    return {
        "tpr": metrics.rate(resign[positives]),
        "fpr": metrics.rate(resign[negatives]),
        "resigned_games": int(res_final.sum()),
        "resigned_games_winner_to_move": int((res_final & scored & ~c.loser_to_move).sum()),
        "resigned_games_truncated": int((res_final & ~scored).sum()),
    }


def value_block(c: Columns) -> dict:
    """Pearson r of the value (White's view) with the game result per game-progress decile."""
    rows = c.scored("policy") & ~np.isnan(c.result)
    v = c.get("policy", "value")[rows]
    o = c.result[rows]
    d = metrics.progress_decile(c.ply[rows], c.num_moves[rows])
    return {
        "overall": metrics.pearson(v, o),
        "by_progress": metrics.pearson_by_group(v, o, d, range(10)),
        "positions": int(v.size),
    }


def stockfish_block(c: Columns, nodes: int) -> dict:
    """Stockfish's WDL expectation (White's view, in [−1, 1]) vs the result and vs Allie's value on
    the positions Stockfish analysed, per progress decile and overall."""
    rows = c.scored("stockfish") & c.scored("policy") & ~np.isnan(c.result)
    sf = c.get("stockfish", "value")[rows]
    allie = c.get("policy", "value")[rows]
    out = c.result[rows]
    dec = metrics.progress_decile(c.ply[rows], c.num_moves[rows])
    return {
        "positions": int(sf.size),
        "nodes": nodes,
        "stockfish_vs_outcome": metrics.pearson(sf, out),
        "value_vs_outcome": metrics.pearson(allie, out),
        "value_vs_stockfish": metrics.pearson(allie, sf),
        "stockfish_by_progress": metrics.pearson_by_group(sf, out, dec, range(10)),
    }


def build_report(records: Records, *, filter: str | None = None) -> dict:
    """report.json's dict from merged records (``records.load_records``)."""
    job = records.manifests[0]["job"]
    cfg = job["config"]
    c = Columns(records.human)
    if c.n == 0:
        raise ValueError(f"no record left to report on (filter {filter!r})")
    report: dict = {
        "move_accuracy": move_accuracy(
            c,
            list(job["systems"]),
            job.get("system_info", {}),
            min_ply=cfg["min_ply"],
            min_clock=cfg["min_clock"],
            seed=cfg["seed"],
        )
    }
    if c.has("policy"):  # the Allie model's own heads (absent from a Maia-only run)
        report["legal"] = {"human": legal_block(c, cfg["seed"])}
        if records.random is not None and records.random.num_rows:
            r = Columns(records.random)
            report["legal"]["random"] = legal_block(r, cfg["seed"])
            report["legal"]["random_games"] = int(r.final.sum())
        report["think_time"] = think_time_block(c)
        report["resign"] = resign_block(c)
        report["value"] = value_block(c)
        if c.has("stockfish"):
            report["value"]["stockfish"] = stockfish_block(c, cfg["stockfish_nodes"])
    if records.calibration is not None:
        report["calibration"] = records.calibration

    chunks = [ch for m in records.manifests for ch in m["chunks"]]
    timings: dict[str, float] = {}
    for ch in chunks:
        for k, v in ch.get("timings_s", {}).items():
            timings[k] = timings.get(k, 0.0) + v
    for m in records.manifests:
        for k, v in m.get("timings_s", {}).items():
            timings[k] = timings.get(k, 0.0) + v
    policy_rows = c.scored("policy") if c.has("policy") else np.ones(c.n, bool)
    games = len(np.unique(c.game_id[c.final])) if c.final.any() else 0
    parse = records.manifests[0].get("parse", {})
    pass_s = timings.get("policy_pass_s", math.nan)
    report["meta"] = {
        "checkpoint": job["checkpoint"],
        "games_file": job["games_file"],
        "games": games,
        "games_rejected": sum(ch.get("games_rejected", 0) for ch in chunks) if not filter else None,
        **parse,
        "positions_scored": int(policy_rows.sum()),
        "positions_truncated": int((~policy_rows).sum()),
        "systems": list(job["systems"]),
        "config": cfg,
        "model": job.get("model"),
        "accuracy_rule": (
            f"top-1 of the legal policy vs the human move; plies < {cfg['min_ply']} and moves made "
            f"with < {cfg['min_clock']:g} s on the mover's clock excluded"
        ),
        "timings_s": timings,
        "policy_positions_per_s": (
            int(policy_rows.sum()) / pass_s if pass_s and pass_s > 0 else math.nan
        ),
        "elapsed_s": sum(timings.values()),
        "records": records.root,
        "shards": len(records.manifests),
        "filter": filter,
    }
    return report
