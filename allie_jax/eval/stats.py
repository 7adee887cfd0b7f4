"""Confidence intervals that respect games: resample games, not positions.

Positions of one game are not independent (the same players, the same opening, one plan), so an
interval that treats them as i.i.d. (Wilson on positions, a position bootstrap) is too narrow. Here
the unit of resampling is the game: each bootstrap replicate draws G games with replacement and
recomputes the pooled statistic Σ values / Σ counts over the drawn games' positions (a ratio
estimator, which is the position-weighted mean the point estimate reports).

Comparisons between systems are *paired*: both systems are scored on the same positions, the
per-position difference is formed first, and the game bootstrap resamples those differences, so
the between-game variance that both systems share cancels.

Results are dicts in the shape of ``allie_jax.eval.metrics.rate`` (``value``, ``ci95``, ``n``)
plus ``games``, so reports and plots can read them alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

NUM_RESAMPLES = 2000


def _per_game(values: np.ndarray, game_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums and counts of ``values`` per distinct game id (ids may be any integers or strings)."""
    _, inverse = np.unique(game_ids, return_inverse=True)
    sums = np.bincount(inverse, weights=values)
    counts = np.bincount(inverse).astype(np.float64)
    return sums, counts


def _check(values: np.ndarray, game_ids: np.ndarray, what: str) -> None:
    if values.shape != game_ids.shape:
        raise ValueError(f"{what}: {values.size} values but {game_ids.size} game ids")


def game_bootstrap(
    values: Sequence[float] | np.ndarray,
    game_ids: Sequence | np.ndarray,
    *,
    num_resamples: int = NUM_RESAMPLES,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict:
    """Pooled mean of per-position ``values`` with a game-level percentile bootstrap interval.

    Returns ``{"value", "ci95": [lo, hi], "n" (positions), "games"}``; NaNs when empty.
    """
    values = np.asarray(values, np.float64).reshape(-1)
    game_ids = np.asarray(game_ids).reshape(-1)
    _check(values, game_ids, "game_bootstrap")
    if values.size == 0:
        return {"value": math.nan, "ci95": [math.nan, math.nan], "n": 0, "games": 0}
    sums, counts = _per_game(values, game_ids)
    num_games = sums.size
    rng = np.random.default_rng(seed)
    stats = []
    per_chunk = max(1, 2_000_000 // num_games)
    for start in range(0, num_resamples, per_chunk):
        rows = min(per_chunk, num_resamples - start)
        weights = rng.multinomial(num_games, np.full(num_games, 1.0 / num_games), size=rows)
        stats.append((weights @ sums) / np.maximum(weights @ counts, 1e-300))
    lo, hi = np.quantile(np.concatenate(stats), [alpha / 2, 1 - alpha / 2])
    return {
        "value": float(sums.sum() / counts.sum()),
        "ci95": [float(lo), float(hi)],
        "n": int(values.size),
        "games": int(num_games),
    }


def game_rate(
    flags: Sequence[bool] | np.ndarray, game_ids: Sequence | np.ndarray, **kwargs
) -> dict:
    """A proportion (e.g. move-matching accuracy) with a game-level interval; adds ``successes``."""
    flags = np.asarray(flags, bool).reshape(-1)
    out = game_bootstrap(flags.astype(np.float64), game_ids, **kwargs)
    out["successes"] = int(flags.sum())
    return out


def paired_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    game_ids: Sequence | np.ndarray,
    **kwargs,
) -> dict:
    """Mean of ``a − b`` over the same positions (e.g. two systems' correctness flags), with a
    game-level bootstrap interval of the difference; ``significant`` when 0 is outside it."""
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.asarray(b, np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(
            f"paired_difference: {a.size} vs {b.size} positions (must be the same ones)"
        )
    out = game_bootstrap(a - b, game_ids, **kwargs)
    lo, hi = out["ci95"]
    out["significant"] = bool(lo > 0 or hi < 0)
    return out


def compare_systems(
    correct: Mapping[str, np.ndarray],
    game_ids: np.ndarray,
    *,
    baseline: str,
    groups: np.ndarray | None = None,
    labels: Sequence | None = None,
    **kwargs,
) -> dict:
    """Accuracy of every system and its paired difference to ``baseline``, overall and per group.

    ``correct[name]``: bool ``[P]`` on one shared set of positions; ``groups`` (e.g. Elo bins) with
    ``labels`` (the bins to report, in order) splits the positions.
    """
    if baseline not in correct:
        raise ValueError(f"compare_systems: baseline {baseline!r} not among {sorted(correct)}")
    game_ids = np.asarray(game_ids)

    def block(mask: np.ndarray) -> dict:
        out = {}
        for name, flags in correct.items():
            flags = np.asarray(flags, bool)
            row = {"accuracy": game_rate(flags[mask], game_ids[mask], **kwargs)}
            if name != baseline:
                row["minus_" + baseline] = paired_difference(
                    flags[mask], np.asarray(correct[baseline], bool)[mask], game_ids[mask], **kwargs
                )
            out[name] = row
        return out

    everything = np.ones(game_ids.size, bool)
    result = {"overall": block(everything)}
    if groups is not None:
        groups = np.asarray(groups)
        result["by_group"] = [
            {"group": g, **block(groups == g)}
            for g in (labels if labels is not None else np.unique(groups))
        ]
    return result
