"""Metric functions of the offline evaluation (SPEC §5), pure numpy so they test on crafted inputs.

Every rate travels as a ``Rate`` dict ``{"value", "ci95": [lo, hi], "n", "successes"}`` (Wilson
interval: it stays inside [0, 1] and behaves at 0 % / 100 %, where the paper's 100.0 ± 0.0 rows
live), every mean as ``{"value", "ci95", "n"}`` (seeded percentile bootstrap) and every Pearson
correlation as ``{"r", "ci95", "n"}`` (Fisher z interval). The report and the other tools read
these keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (nan, nan) when there is nothing to count."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


def rate(flags: Sequence[bool] | np.ndarray) -> dict:
    """Proportion of true flags with its Wilson 95 % interval."""
    flags = np.asarray(flags, dtype=bool).reshape(-1)
    n, k = int(flags.size), int(flags.sum())
    lo, hi = wilson_interval(k, n)
    return {"value": k / n if n else math.nan, "ci95": [lo, hi], "n": n, "successes": k}


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[[np.ndarray], float] = np.mean,
    *,
    num_resamples: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` (seeded, so reports are reproducible)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    # resample in chunks so 1,000 resamples of ~10^5 positions stay within a few MB
    per_chunk = max(1, 4_000_000 // values.size)
    stats = []
    for start in range(0, num_resamples, per_chunk):
        rows = min(per_chunk, num_resamples - start)
        samples = values[rng.integers(0, values.size, size=(rows, values.size))]
        if statistic is np.mean:
            stats.append(samples.mean(axis=1))
        else:
            stats.append(np.array([statistic(row) for row in samples]))
    stats = np.concatenate(stats)
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return (float(lo), float(hi))


def mean_with_ci(values: Sequence[float] | np.ndarray, *, seed: int = 0) -> dict:
    """Mean with a bootstrap 95 % interval (used for probability masses, not proportions)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    lo, hi = bootstrap_ci(values, seed=seed)
    mean = float(values.mean()) if values.size else math.nan
    return {"value": mean, "ci95": [lo, hi], "n": int(values.size)}


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> dict:
    """Pearson r with a Fisher-z 95 % interval; r is nan when either side is constant or n < 3."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"pearson needs equal lengths, got {x.size} and {y.size}")
    n = int(x.size)
    nan = {"r": math.nan, "ci95": [math.nan, math.nan], "n": n}
    if n < 2:
        return nan
    dx, dy = x - x.mean(), y - y.mean()
    sx, sy = math.sqrt(float(dx @ dx)), math.sqrt(float(dy @ dy))
    if sx == 0.0 or sy == 0.0:
        return nan
    r = float(np.clip((dx @ dy) / (sx * sy), -1.0, 1.0))
    if n <= 3 or abs(r) == 1.0:
        return {"r": r, "ci95": [r, r] if abs(r) == 1.0 else [math.nan, math.nan], "n": n}
    z, se = math.atanh(r), 1.0 / math.sqrt(n - 3)
    return {"r": r, "ci95": [math.tanh(z - Z95 * se), math.tanh(z + Z95 * se)], "n": n}


def elo_bin(elo: np.ndarray | Sequence[float], width: int = 100) -> np.ndarray:
    """Lower edge of the ``width``-Elo bin of each rating (1537 -> 1500)."""
    return (np.floor(np.asarray(elo, dtype=np.float64) / width) * width).astype(np.int64)


def rate_by_bin(
    flags: np.ndarray | Sequence[bool], bins: np.ndarray | Sequence[int], *, min_count: int = 1
) -> dict[str, dict]:
    """One ``rate`` per bin label (keys are the labels as strings, sorted numerically)."""
    flags = np.asarray(flags, dtype=bool)
    bins = np.asarray(bins)
    if flags.shape != bins.shape:
        raise ValueError(f"rate_by_bin needs equal shapes, got {flags.shape} and {bins.shape}")
    out = {}
    for b in np.unique(bins):
        sel = bins == b
        if sel.sum() >= min_count:
            out[str(int(b))] = rate(flags[sel])
    return out


def quantiles_by_bin(
    predicted: np.ndarray | Sequence[float],
    reference: np.ndarray | Sequence[float],
    edges: Sequence[float],
) -> list[dict]:
    """Median and IQR of ``predicted`` within each [lo, hi) bin of ``reference`` (last bin closed)."""
    predicted = np.asarray(predicted, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    rows = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        last = i == len(edges) - 2
        sel = (reference >= lo) & ((reference <= hi) if last else (reference < hi))
        vals = predicted[sel]
        if vals.size:
            q25, med, q75 = (float(v) for v in np.quantile(vals, [0.25, 0.5, 0.75]))
        else:
            q25 = med = q75 = math.nan
        rows.append(
            {
                "bin": [float(lo), float(hi)],
                "n": int(vals.size),
                "median": med,
                "q25": q25,
                "q75": q75,
            }
        )
    return rows


def progress_decile(
    index: np.ndarray | Sequence[int], length: np.ndarray | Sequence[int]
) -> np.ndarray:
    """Decile 0..9 of a position at ply ``index`` of a game of ``length`` plies (final -> 9)."""
    index = np.asarray(index, dtype=np.float64)
    length = np.maximum(np.asarray(length, dtype=np.float64), 1.0)
    return np.minimum(np.floor(10.0 * index / length), 9).astype(np.int64)


def pearson_by_group(
    x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float], groups: np.ndarray, labels
) -> list[dict]:
    """``pearson`` within each group label (in the order given), with the label under "group"."""
    x, y, groups = np.asarray(x), np.asarray(y), np.asarray(groups)
    return [{"group": int(g), **pearson(x[groups == g], y[groups == g])} for g in labels]


def resign_decisions(
    termination_logit: np.ndarray,
    max_legal_logit: np.ndarray,
    value_to_move: np.ndarray,
    *,
    value_threshold: float = -0.9,
) -> np.ndarray:
    """The resign rule (SPEC §4): termination beats every legal move and the mover's value < −0.9."""
    return (np.asarray(termination_logit) > np.asarray(max_legal_logit)) & (
        np.asarray(value_to_move) < value_threshold
    )


def legal_move_stats(
    log_probs: np.ndarray, legal_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per position: is the top *move* token legal, and the probability mass on illegal moves.

    ``log_probs`` [P, V>=1968] are log-softmax over the full vocabulary (the model's real
    distribution); only the 1,968 move tokens compete for "top move", and the invalid mass is the
    probability on move tokens that are illegal (non-move tokens such as the termination are not
    moves, so they are neither legal nor invalid).
    """
    moves = np.asarray(log_probs)[:, : legal_mask.shape[1]]
    top = moves.argmax(axis=1)
    top_legal = legal_mask[np.arange(len(top)), top]
    probs = np.exp(moves.astype(np.float64))
    invalid = np.where(legal_mask, 0.0, probs).sum(axis=1)
    return top_legal, invalid


def masked_argmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Argmax over the columns where ``mask`` is true (the policy restricted to legal moves)."""
    logits = np.asarray(logits)[:, : mask.shape[1]]
    return np.where(mask, logits, -np.inf).argmax(axis=1)
