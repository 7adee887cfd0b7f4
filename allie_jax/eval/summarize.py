"""The report (report.json's dict) from per-position records, one chunk at a time.

Each chunk of records (``allie_jax.eval.records.iter_chunks``) is reduced to per-cluster sums
(``allie_jax.eval.tally``): hits and positions of every system, per mover-Elo bin and special
move, paired differences with each system's baseline, cross-entropies, legality, resignation
flags, and exact moment sums for correlations. The report is computed from those sums alone, so
memory grows with the number of games, not positions, and a direct run, ``--report_only`` and any
sharding give the same numbers.

Every interval of a rate or a mean is a cluster bootstrap: clusters are games (default) or, with
``cluster="player"``, the player who moved (positions of one game, or of one player, are not
independent). Correlations too: their interval is the same cluster bootstrap, from per-cluster
sums of x, y, x², y², xy and n (Fisher's interval over positions would treat the positions of a
game as independent draws and come out too narrow).

What each number is computed on (the paper's protocol, SPEC §5):
- move matching: rows where a human move was made, after ply ``min_ply``, with at least
  ``min_clock`` s on the mover's clock (``positions.protocol_mask``), that the Allie policy scored
  (inside its context; no such condition in a run without Allie) and the system scored; a
  system's move is its top-1 (``{s}.top_moves[0]``).
- paired comparisons: a system and its baseline (``baselines``) on the rows both scored.
- legality, think time, value, resignation: the Allie policy (``policy.*``) at the rows it scored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from allie_jax.eval import metrics
from allie_jax.eval.positions import SPECIAL_MOVES, protocol_mask
from allie_jax.eval.records import Records, column, top1_array
from allie_jax.eval.tally import Interval, Tally

THINK_TIME_EDGES = (0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 45, 60)
THINK_RESOLUTION = 0.01  # seconds: the predicted think-time quantiles come from a histogram
THINK_MAX = 600.0
CE_FLOOR = 1e-6  # cross-entropy counts a probability below this as this (a search may give 0)
MIN_CLUSTERS = 30  # fewer games (or players) than this: the report warns about its intervals
CLUSTERS = ("game", "player")


class Columns:
    """The numpy views of a records table the reduction reads (nulls filled)."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.n = table.num_rows
        self.game_ids = table.column("game_id").to_numpy(zero_copy_only=False).astype(object)
        self.ply = column(table, "ply", np.int64, -1)
        self.num_moves = column(table, "num_moves", np.int64, 0)
        self.moving = self.ply < self.num_moves
        self.final = self.ply == self.num_moves
        self.white = self.ply % 2 == 0
        self.mover_elo = np.where(
            self.white, column(table, "white_elo"), column(table, "black_elo")
        )
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

    def cluster_keys(self, cluster: str) -> np.ndarray:
        """Each row's cluster: its game, or the player to move (``player:NAME``; a game without
        player names falls back to ``game:ID:white`` / ``game:ID:black``)."""
        if cluster == "game":
            return self.game_ids
        names = {}
        for side in ("white", "black"):
            if side in self.table.column_names:
                col = pc.fill_null(self.table.column(side), "")
                names[side] = col.to_numpy(zero_copy_only=False).astype(object)
            else:
                names[side] = np.full(self.n, "", dtype=object)
        mover = np.where(self.white, names["white"], names["black"])
        side = np.where(self.white, ":white", ":black")
        return np.array(
            [
                f"player:{m}" if m else f"game:{g}{s}"
                for m, g, s in zip(mover, self.game_ids, side, strict=True)
            ],
            dtype=object,
        )


# ------------------------------------------------------------------------------------------------
# Baselines: what each system is paired with


def own_base(name: str) -> str:
    """The system a search system is compared with: ``search`` / ``adaptive`` / ``gumbel`` ...
    → ``policy``; ``maia+search`` → ``maia``; ``maia-1500+gumbel`` → ``maia-1500``;
    ``board+search`` → ``board``; anything else → ``policy`` (the Allie policy)."""
    base, plus, _ = name.partition("+")
    return base if plus else "policy"


def baselines(
    systems: Sequence[str], available: Iterable[str], baseline: str | None = None
) -> list[tuple[str, str]]:
    """``(system, baseline)`` pairs: each system with its own base (``own_base``) and with the
    ``baseline`` the user names, when that system was scored."""
    have = set(available)
    pairs = []
    for name in systems:
        for base in (own_base(name), baseline):
            if base and base != name and base in have and (name, base) not in pairs:
                pairs.append((name, base))
    return pairs


# ------------------------------------------------------------------------------------------------
# One chunk → sums


class Spec:
    """What the reduction needs to know about the job (from the manifests)."""

    def __init__(
        self,
        systems: Sequence[str],
        *,
        min_ply: int,
        min_clock: float,
        cluster: str = "game",
        baseline: str | None = None,
    ):
        if cluster not in CLUSTERS:
            raise ValueError(f"--cluster={cluster!r}: expected one of {list(CLUSTERS)}")
        self.systems = list(systems)
        self.min_ply, self.min_clock = min_ply, min_clock
        self.cluster = cluster
        self.baseline = baseline


def _cross_entropy(p: np.ndarray) -> np.ndarray:
    return -np.log(np.maximum(p, CE_FLOOR))


def reduce_human(tally: Tally, table: pa.Table, spec: Spec) -> None:
    """Add one chunk of human-game records to ``tally``."""
    c = Columns(table)
    if not c.n:
        return
    cl = tally.clusters(c.cluster_keys(spec.cluster))
    tally.add_count("rows", c.n)
    tally.add_count("games", int(c.final.sum()))
    has_policy = c.has("policy")
    proto = protocol_mask(c.ply, c.num_moves, c.clock_before, spec.min_ply, spec.min_clock)
    if has_policy:
        policy_rows = c.scored("policy")
        proto &= policy_rows
        tally.add_count("policy_scored", int(policy_rows.sum()))
    bins = metrics.elo_bin(np.nan_to_num(c.mover_elo, nan=-1e9))
    known = ~np.isnan(c.mover_elo)
    present = [s for s in dict.fromkeys([*spec.systems, "policy"]) if c.has(s)]
    correct = {s: c.correct(s) for s in present}
    rows = {s: proto & c.scored(s) for s in present}
    p_human = {s: c.get(s, "p_human") for s in present}

    def add_rate(stat, mask, flags):
        tally.add(stat, cl[mask], flags[mask].astype(np.float64))

    for s in spec.systems:
        if s not in present:
            continue
        r, ok = rows[s], correct[s]
        add_rate(("acc", s), r, ok)
        for b in np.unique(bins[r & known]):
            add_rate(("acc_elo", s, int(b)), r & known & (bins == b), ok)
        for k, flag in c.special.items():
            add_rate(("acc_special", s, k), r & flag, ok)
        has_p = r & ~np.isnan(p_human[s])
        tally.add(("ce", s), cl[has_p], _cross_entropy(p_human[s][has_p]))
        sims = c.get(s, "num_sims")
        if np.isfinite(sims[r]).any():
            tally.add(("sims", s), cl[r], np.nan_to_num(sims[r]))
    for s, base in baselines(spec.systems, present, spec.baseline):
        both = rows[s] & rows[base]
        diff = correct[s].astype(np.float64) - correct[base]
        tally.add(("pair", s, base), cl[both], diff[both])
        add_rate(("pair_a", s, base), both, correct[s])
        add_rate(("pair_b", s, base), both, correct[base])
        for b in np.unique(bins[both & known]):
            m = both & known & (bins == b)
            tally.add(("pair_elo", s, base, int(b)), cl[m], diff[m])
        p = both & ~np.isnan(p_human[s]) & ~np.isnan(p_human[base])
        ce = _cross_entropy(np.nan_to_num(p_human[s])) - _cross_entropy(
            np.nan_to_num(p_human[base])
        )
        tally.add(("pair_ce", s, base), cl[p], ce[p])
        for b in np.unique(bins[p & known]):
            m = p & known & (bins == b)
            tally.add(("pair_ce_elo", s, base, int(b)), cl[m], ce[m])
    if has_policy:
        _reduce_policy(tally, c, cl, "human")
        if c.has("stockfish"):
            m = c.scored("stockfish") & c.scored("policy") & ~np.isnan(c.result)
            sf, allie, out = (
                c.get("stockfish", "value")[m],
                c.get("policy", "value")[m],
                c.result[m],
            )
            _moments(tally, ("sf", "sf_outcome"), cl[m], sf, out)
            _moments(tally, ("sf", "value_outcome"), cl[m], allie, out)
            _moments(tally, ("sf", "value_sf"), cl[m], allie, sf)
            dec = metrics.progress_decile(c.ply[m], c.num_moves[m])
            for d in range(10):
                k = dec == d
                _moments(tally, ("sf_decile", d), cl[m][k], sf[k], out[k])


def reduce_random(tally: Tally, table: pa.Table) -> None:
    """Add the random games of the legality check (each game its own cluster)."""
    c = Columns(table)
    if not c.n or not c.has("policy"):
        return
    game_index = np.cumsum(c.ply == 0)
    cl = tally.clusters(np.array([f"random:{g}" for g in game_index], dtype=object))
    tally.add_count("random_games", int(c.final.sum()))
    _legal(tally, c, cl, "random")


def _legal(tally: Tally, c: Columns, cl: np.ndarray, source: str) -> None:
    rows = c.moving & c.scored("policy")
    top = c.get("policy", "top_legal", bool, False)
    inv = c.get("policy", "invalid_mass")
    for subset, mask in (("all", rows), ("check", rows & c.in_check)):
        tally.add(("legal", source, subset, "top"), cl[mask], top[mask].astype(np.float64))
        tally.add(("legal", source, subset, "inv"), cl[mask], inv[mask])


def _moments(tally: Tally, name, cl: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """Exact sums of n, x, y, x², y², xy (a correlation that does not depend on the chunking),
    and the same sums per cluster (its cluster-bootstrap interval)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    tally.add_count((name, "n"), x.size)
    for k, v in (("x", x), ("y", y), ("xx", x * x), ("yy", y * y), ("xy", x * y)):
        tally.add_sum((name, k), v)
    tally.add_moments(name, cl, x, y)


def _reduce_policy(tally: Tally, c: Columns, cl: np.ndarray, source: str) -> None:
    scored = c.scored("policy")
    _legal(tally, c, cl, source)
    # think time
    rows = c.moving & scored & (c.human_think >= 0)
    pred = c.get("policy", "think_time")[rows]
    pred = np.nan_to_num(pred)
    human = np.clip(c.human_think[rows], 0.0, 60.0)
    _moments(tally, ("think",), cl[rows], pred, human)
    edges = np.asarray(THINK_TIME_EDGES, np.float64)
    which = np.clip(np.searchsorted(edges, human, side="right") - 1, 0, len(edges) - 2)
    size = int(THINK_MAX / THINK_RESOLUTION) + 1
    cell = np.clip(np.round(pred / THINK_RESOLUTION), 0, size - 1).astype(np.int64)
    tally.add_hist("think_hist", which * size + cell, (len(edges) - 1) * size)
    # resignation
    resign = c.get("policy", "resign", bool, False)
    res_final = c.final & c.resigned
    positives = res_final & scored & c.loser_to_move
    negatives = (c.moving & scored) | (c.final & ~c.resigned & scored & (c.num_legal > 0))
    tally.add(("resign", "tpr"), cl[positives], resign[positives].astype(np.float64))
    tally.add(("resign", "fpr"), cl[negatives], resign[negatives].astype(np.float64))
    tally.add_count("resigned_games", int(res_final.sum()))
    tally.add_count("resigned_winner_to_move", int((res_final & scored & ~c.loser_to_move).sum()))
    tally.add_count("resigned_truncated", int((res_final & ~scored).sum()))
    # value vs outcome
    rows = scored & ~np.isnan(c.result)
    v, o = c.get("policy", "value")[rows], c.result[rows]
    _moments(tally, ("value",), cl[rows], v, o)
    dec = metrics.progress_decile(c.ply[rows], c.num_moves[rows])
    for d in range(10):
        k = dec == d
        _moments(tally, ("value_decile", d), cl[rows][k], v[k], o[k])


# ------------------------------------------------------------------------------------------------
# Sums → report


class Reader:
    """Report values from a finished tally (bootstrap settings fixed per report)."""

    def __init__(self, tally: Tally, seed: int, num_resamples: int):
        self.t, self.seed, self.r = tally, seed, num_resamples

    def iv(self, stat) -> Interval:
        return self.t.interval(stat, num_resamples=self.r, seed=self.seed)

    def rate(self, stat) -> dict:
        i = self.iv(stat)
        return {
            "value": i.value,
            "ci95": [i.lo, i.hi],
            "n": int(round(i.den)),
            "successes": int(round(i.num)),
            "games": i.clusters,
        }

    def mean(self, stat) -> dict:
        i = self.iv(stat)
        return {"value": i.value, "ci95": [i.lo, i.hi], "n": int(round(i.den)), "games": i.clusters}

    def pearson(self, name) -> dict:
        t = self.t
        n = t.counts.get((name, "n"), 0)
        nan = {"r": math.nan, "ci95": [math.nan, math.nan], "n": n, "games": 0}
        if n < 2:
            return nan
        sx, sy = t.total((name, "x")), t.total((name, "y"))
        vx = t.total((name, "xx")) - sx * sx / n
        vy = t.total((name, "yy")) - sy * sy / n
        cov = t.total((name, "xy")) - sx * sy / n
        if not (vx > 1e-12 * max(1.0, t.total((name, "xx")))) or not (
            vy > 1e-12 * max(1.0, t.total((name, "yy")))
        ):
            return nan
        r = float(np.clip(cov / math.sqrt(vx * vy), -1.0, 1.0))
        lo, hi, games = t.correlation(name, num_resamples=self.r, seed=self.seed)
        return {"r": r, "ci95": [lo, hi], "n": n, "games": games}


def _stats_of(tally: Tally, kind: str) -> list[tuple]:
    return [s for s in tally.stat_ids if isinstance(s, tuple) and s[0] == kind]


def move_accuracy(rd: Reader, spec: Spec, info: dict) -> tuple[dict, list[dict]]:
    """Per system: accuracy (overall, per mover-Elo bin, per special move) with cluster-bootstrap
    intervals, cross-entropy, and its paired comparisons; and report.json's ``paired`` list."""
    out: dict = {}
    present = {s[1] for s in _stats_of(rd.t, "acc")}
    for name in spec.systems:
        if name not in present:
            continue
        sub = dict(info.get(name, {}))
        subsample = bool(sub.pop("subsample", False))
        bins = sorted(s[2] for s in _stats_of(rd.t, "acc_elo") if s[1] == name)
        block = {
            "overall": rd.rate(("acc", name)),
            "by_elo": {str(b): rd.rate(("acc_elo", name, b)) for b in bins},
            "special": {k: rd.rate(("acc_special", name, k)) for k in SPECIAL_MOVES},
            "cross_entropy": rd.mean(("ce", name)),
            "subsample": subsample,
            **sub,
        }
        block["positions"] = block["overall"]["n"]
        if ("sims", name) in rd.t.stat_ids:
            block["mean_sims"] = rd.mean(("sims", name))["value"]
        out[name] = block
    paired = []
    for _, s, base in _stats_of(rd.t, "pair"):
        d = rd.iv(("pair", s, base))
        bins = sorted(k[3] for k in _stats_of(rd.t, "pair_elo") if k[1:3] == (s, base))
        entry = {
            "system": s,
            "baseline": base,
            "positions": int(round(d.den)),
            "difference": d.value,
            "ci_low": d.lo,
            "ci_high": d.hi,
            "games": d.clusters,
            "significant": bool(d.lo > 0 or d.hi < 0),
            "system_accuracy": rd.rate(("pair_a", s, base)),
            "baseline_accuracy": rd.rate(("pair_b", s, base)),
            "cross_entropy_difference": rd.mean(("pair_ce", s, base)),
            "by_elo": {str(b): rd.mean(("pair_elo", s, base, b)) for b in bins},
            "cross_entropy_by_elo": {
                str(k[3]): rd.mean(k)
                for k in sorted(
                    (k for k in _stats_of(rd.t, "pair_ce_elo") if k[1:3] == (s, base)),
                    key=lambda k: k[3],
                )
            },
        }
        paired.append(entry)
        if s in out:
            out[s].setdefault("paired", {})[base] = {
                k: entry[k]
                for k in ("positions", "difference", "ci_low", "ci_high", "games", "significant")
            }
    return out, paired


def _quantiles(tally: Tally) -> list[dict]:
    edges = THINK_TIME_EDGES
    size = int(THINK_MAX / THINK_RESOLUTION) + 1
    hist = tally.hists.get("think_hist")
    rows = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        h = hist[i * size : (i + 1) * size] if hist is not None else np.zeros(size, np.int64)
        n = int(h.sum())
        q = [math.nan] * 3
        if n:
            cdf = np.cumsum(h)
            q = [float(np.searchsorted(cdf, f * n) * THINK_RESOLUTION) for f in (0.25, 0.5, 0.75)]
        rows.append(
            {"bin": [float(lo), float(hi)], "n": n, "q25": q[0], "median": q[1], "q75": q[2]}
        )
    return rows


def report_from_tally(
    tally: Tally,
    manifests: list[dict],
    spec: Spec,
    *,
    filter: str | None = None,
    root: str = "",
    calibration: dict | None = None,
    num_resamples: int | None = None,
) -> dict:
    """report.json's dict from the sums of every chunk."""
    from allie_jax.eval.tally import NUM_RESAMPLES

    job = manifests[0]["job"]
    cfg = job["config"]
    if not tally.counts.get("rows"):
        raise ValueError(f"no record left to report on (filter {filter!r})")
    rd = Reader(tally, cfg["seed"], num_resamples or NUM_RESAMPLES)
    acc, paired = move_accuracy(rd, spec, job.get("system_info", {}))
    report: dict = {"move_accuracy": acc, "paired": paired}
    has_policy = ("legal", "human", "all", "top") in tally.stat_ids
    if has_policy:
        legal = {
            "human": {
                sub: {
                    "top_legal": rd.rate(("legal", "human", sub, "top")),
                    "invalid_mass": rd.mean(("legal", "human", sub, "inv")),
                }
                for sub in ("all", "check")
            }
        }
        if tally.counts.get("random_games"):
            legal["random"] = {
                sub: {
                    "top_legal": rd.rate(("legal", "random", sub, "top")),
                    "invalid_mass": rd.mean(("legal", "random", sub, "inv")),
                }
                for sub in ("all", "check")
            }
            legal["random_games"] = tally.counts["random_games"]
        report["legal"] = legal
        n_think = tally.counts.get((("think",), "n"), 0)
        report["think_time"] = {
            "pearson_r": rd.pearson(("think",)),
            "positions": n_think,
            "by_human_time": _quantiles(tally),
            "mean_predicted_s": tally.total((("think",), "x")) / n_think if n_think else math.nan,
            "mean_human_s": tally.total((("think",), "y")) / n_think if n_think else math.nan,
            "quantile_resolution_s": THINK_RESOLUTION,
        }
        report["resign"] = {
            "tpr": rd.rate(("resign", "tpr")),
            "fpr": rd.rate(("resign", "fpr")),
            "resigned_games": tally.counts.get("resigned_games", 0),
            "resigned_games_winner_to_move": tally.counts.get("resigned_winner_to_move", 0),
            "resigned_games_truncated": tally.counts.get("resigned_truncated", 0),
        }
        report["value"] = {
            "overall": rd.pearson(("value",)),
            "by_progress": [{"group": d, **rd.pearson(("value_decile", d))} for d in range(10)],
            "positions": tally.counts.get((("value",), "n"), 0),
        }
        if (("sf", "sf_outcome"), "n") in tally.counts:
            report["value"]["stockfish"] = {
                "positions": tally.counts[(("sf", "sf_outcome"), "n")],
                "nodes": cfg["stockfish_nodes"],
                "stockfish_vs_outcome": rd.pearson(("sf", "sf_outcome")),
                "value_vs_outcome": rd.pearson(("sf", "value_outcome")),
                "value_vs_stockfish": rd.pearson(("sf", "value_sf")),
                "stockfish_by_progress": [
                    {"group": d, **rd.pearson(("sf_decile", d))} for d in range(10)
                ],
            }
    if calibration is not None:
        report["calibration"] = calibration

    chunks = [ch for m in manifests for ch in m["chunks"]]
    timings: dict[str, float] = {}
    for ch in chunks:
        for k, v in ch.get("timings_s", {}).items():
            timings[k] = timings.get(k, 0.0) + v
    for m in manifests:
        for k, v in m.get("timings_s", {}).items():
            timings[k] = timings.get(k, 0.0) + v
    rows = tally.counts["rows"]
    scored = tally.counts.get("policy_scored", rows)
    pass_s = timings.get("policy_pass_s", math.nan)
    games = tally.counts.get("games", 0)
    clusters = len([k for k in tally.cluster_ids if not k.startswith("random:")])
    parse: dict = {}
    for m in manifests:  # every task parses its own share (index) or the whole input (stream)
        for k, v in m.get("parse", {}).items():
            parse.setdefault(k, v)
    warnings = []
    if clusters < MIN_CLUSTERS:
        warnings.append(
            f"only {clusters} {spec.cluster}{'s' if clusters != 1 else ''}: intervals clustered "
            f"by {spec.cluster} from fewer than {MIN_CLUSTERS} are unreliable (they can come out "
            "narrower than the truth)"
        )
    report["warnings"] = warnings
    paths = manifests[0].get("paths", {})
    report["meta"] = {
        "checkpoint": paths.get("checkpoint", job["checkpoint"]),
        "games_file": paths.get("games_file", job["games_file"]),
        "checkpoint_sha256": job["checkpoint"],
        "games_sha256": job["games_file"],
        "games": games,
        "games_rejected": sum(ch.get("games_rejected", 0) for ch in chunks) if not filter else None,
        **parse,
        "positions_scored": scored,
        "positions_truncated": rows - scored,
        "systems": list(job["systems"]),
        "config": cfg,
        "model": job.get("model"),
        "accuracy_rule": (
            f"top-1 of the legal policy vs the human move; plies < {cfg['min_ply']} and moves made "
            f"with < {cfg['min_clock']:g} s on the mover's clock excluded"
        ),
        "intervals": (
            f"95% percentile bootstrap over {spec.cluster}s ({clusters:,}; Poisson weights, "
            f"{rd.r} replicates)"
        ),
        "cluster": spec.cluster,
        "clusters": clusters,
        "baseline": spec.baseline,
        "timings_s": timings,
        "policy_positions_per_s": scored / pass_s if pass_s and pass_s > 0 else math.nan,
        "elapsed_s": sum(timings.values()),
        "records": root,
        "shards": len(manifests),
        "filter": filter,
    }
    return report


def spec_from(manifests: list[dict], *, cluster: str = "game", baseline: str | None = None) -> Spec:
    job = manifests[0]["job"]
    cfg = job["config"]
    systems = list(job.get("record_systems") or job["systems"])
    systems = [s for s in dict.fromkeys([*job["systems"], *systems]) if s != "stockfish"]
    return Spec(
        systems,
        min_ply=cfg["min_ply"],
        min_clock=cfg["min_clock"],
        cluster=cluster,
        baseline=baseline,
    )


def build_report(
    records: Records,
    *,
    filter: str | None = None,
    cluster: str = "game",
    baseline: str | None = None,
) -> dict:
    """report.json's dict from records held in memory (``records.load_records``); the streamed
    path (``stream_report``) gives the same numbers without holding them."""
    spec = spec_from(records.manifests, cluster=cluster, baseline=baseline)
    tally = Tally()
    reduce_human(tally, records.human, spec)
    if records.random is not None:
        reduce_random(tally, records.random)
    return report_from_tally(
        tally,
        records.manifests,
        spec,
        filter=filter,
        root=records.root,
        calibration=records.calibration,
    )


def stream_report(
    path,
    *,
    filter: str | None = None,
    cluster: str = "game",
    baseline: str | None = None,
    num_resamples: int | None = None,
) -> dict:
    """report.json's dict from a records directory (or a parent of per-task records
    directories), one chunk in memory at a time."""
    from allie_jax.eval import records as rec

    job = rec.open_job(path)
    spec = spec_from(job.manifests, cluster=cluster, baseline=baseline)
    if baseline is not None and baseline not in spec.systems:
        raise ValueError(f"--baseline {baseline!r} was not scored (systems: {spec.systems})")
    tally = Tally()
    for table in job.human_chunks(filter=filter, columns=needed_columns(spec, filter)):
        reduce_human(tally, table, spec)
    random = job.random_table()
    if random is not None:
        reduce_random(tally, random)
    return report_from_tally(
        tally,
        job.manifests,
        spec,
        filter=filter,
        root=job.root,
        calibration=job.calibration(),
        num_resamples=num_resamples,
    )


def needed_columns(spec: Spec, filter: str | None) -> list[str] | None:
    """The record columns the reduction reads (None: all, when a filter may name any)."""
    if filter:
        return None
    base = [
        "game_id", "ply", "num_moves", "white_elo", "black_elo", "clock_before", "human_move",
        "human_think_time", "in_check", "num_legal", *SPECIAL_MOVES, "result", "resigned",
        "loser_to_move",
    ]  # fmt: skip
    if spec.cluster == "player":
        base += ["white", "black"]
    fields = ["scored", "top_moves", "top1", "p_human", "num_sims"]
    for s in dict.fromkeys([*spec.systems, "policy", "stockfish"]):
        base += [f"{s}.{f}" for f in fields]
    base += [f"policy.{f}" for f in ("top_legal", "invalid_mass", "think_time", "value", "resign")]
    base.append("stockfish.value")
    return base
