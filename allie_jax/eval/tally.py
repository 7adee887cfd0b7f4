"""Per-cluster sums that the report is built from, chunk by chunk, and their bootstrap.

The report never holds positions: each chunk of records is reduced to, per *cluster* (a game, or a
player with ``cluster="player"``) and per named statistic, a numerator and a denominator (hits and
positions of a system, a paired difference and its positions, a summed cross-entropy, ...). Every
interval is then a cluster-level Poisson bootstrap of the ratio Σ num / Σ den: each replicate
weighs every cluster by an independent Poisson(1) count, so positions of one game (or one player)
move together, and the interval reflects that they are not independent. Memory is bounded by the
number of (cluster, statistic) pairs, which grows with games, not positions; time is linear.

A correlation is bootstrapped the same way, from per-cluster sums of x, y, x², y², xy and n
(``add_moments``): each replicate's r comes from its weighted cluster sums. Its point estimate
comes from exact global sums.

The result does not depend on how the records were sharded or chunked: clusters are ordered by
their key before the bootstrap, a game's sums are formed over its rows in ply order, and sums
that span chunks (correlation moments) are exact (``ExactSum``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable

import numpy as np

NUM_RESAMPLES = 1000
BLOCK = 4096  # clusters per bootstrap block (weights: NUM_RESAMPLES × BLOCK float32)
MOMENTS = ("moments_x_y", "moments_xx_yy", "moments_xy_n")  # add_moments' three stat suffixes


class ExactSum:
    """An order-independent sum of float64 values: each value is split into an integer mantissa
    and an exponent, mantissas are summed exactly per exponent (Python integers), and the total is
    rounded once. Any chunking or ordering of the same values gives the same float."""

    def __init__(self) -> None:
        self.by_exponent: dict[int, int] = {}
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.float64).reshape(-1)
        if not values.size:
            return
        if not np.isfinite(values).all():
            raise ValueError("ExactSum: values must be finite")
        self.count += int(values.size)
        m, e = np.frexp(values)
        mant = (m * 2.0**53).astype(np.int64)  # exact: |m| < 1 has 53 significant bits
        hi, lo = mant >> 27, mant & ((1 << 27) - 1)
        exps, inverse = np.unique(e, return_inverse=True)
        # at most 2^26 values per call keep these float64 sums of 27-bit integers exact
        for start in range(0, values.size, 1 << 26):
            sl = slice(start, start + (1 << 26))
            s_hi = np.bincount(inverse[sl], weights=hi[sl], minlength=exps.size)
            s_lo = np.bincount(inverse[sl], weights=lo[sl], minlength=exps.size)
            for k, exp in enumerate(exps.tolist()):
                total = int(s_hi[k]) * (1 << 27) + int(s_lo[k])
                if total:
                    self.by_exponent[exp] = self.by_exponent.get(exp, 0) + total

    def merge(self, other: ExactSum) -> None:
        for exp, total in other.by_exponent.items():
            self.by_exponent[exp] = self.by_exponent.get(exp, 0) + total
        self.count += other.count

    @property
    def value(self) -> float:
        if not self.by_exponent:
            return 0.0
        low = min(self.by_exponent)
        total = sum(t << (e - low) for e, t in self.by_exponent.items())
        return math.ldexp(float(total), low - 53) if abs(total) < 2**1000 else math.inf


@dataclasses.dataclass
class Interval:
    """A ratio statistic's point estimate and cluster-bootstrap interval."""

    value: float
    lo: float
    hi: float
    num: float  # Σ numerators (e.g. hits)
    den: float  # Σ denominators (e.g. positions)
    clusters: int  # clusters with a non-zero denominator


class Tally:
    """Named ratio statistics summed per cluster, plus exact global sums (for correlations)."""

    def __init__(self) -> None:
        self.cluster_ids: dict[str, int] = {}
        self.stat_ids: dict[Hashable, int] = {}
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.sums: dict[Hashable, ExactSum] = {}
        self.hists: dict[Hashable, np.ndarray] = {}
        self.counts: dict[Hashable, int] = {}
        self._final: tuple | None = None

    # -- accumulating ------------------------------------------------------------------------
    def clusters(self, keys: np.ndarray | list[str]) -> np.ndarray:
        """int64 codes of these cluster keys (new keys get new codes)."""
        keys = np.asarray(keys, dtype=object)
        uniq, inverse = np.unique(keys, return_inverse=True)
        ids = self.cluster_ids
        codes = np.array([ids.setdefault(k, len(ids)) for k in uniq.tolist()], np.int64)
        return codes[inverse.reshape(-1)] if keys.size else np.zeros(0, np.int64)

    def add(
        self,
        stat: Hashable,
        clusters: np.ndarray,
        num: np.ndarray,
        den: np.ndarray | None = None,
    ) -> None:
        """Add per-row numerators (and denominators, default 1) of ``stat``, summed per cluster
        in row order (a game's rows always come in the same order, so its sums are the same
        floats whatever chunk it sits in)."""
        clusters = np.asarray(clusters, np.int64)
        num = np.asarray(num, np.float64)
        den = np.ones(num.shape) if den is None else np.asarray(den, np.float64)
        if not clusters.size:
            return
        self._final = None
        sid = self.stat_ids.setdefault(stat, len(self.stat_ids))
        uniq, inverse = np.unique(clusters, return_inverse=True)
        n = np.bincount(inverse, weights=num, minlength=uniq.size)
        d = np.bincount(inverse, weights=den, minlength=uniq.size)
        self._parts.append(
            (
                uniq.astype(np.int32),
                np.full(uniq.size, sid, np.int32),
                n.astype(np.float32),
                d.astype(np.float32),
            )
        )

    def add_moments(
        self, name: Hashable, clusters: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> None:
        """Per-cluster sums of x, y, x², y², xy and n for a correlation's cluster bootstrap
        (``correlation``), kept as three (num, den) pairs: (Σx, Σy), (Σx², Σy²), (Σxy, n)."""
        x = np.asarray(x, np.float64)
        y = np.asarray(y, np.float64)
        self.add((name, MOMENTS[0]), clusters, x, y)
        self.add((name, MOMENTS[1]), clusters, x * x, y * y)
        self.add((name, MOMENTS[2]), clusters, x * y, np.ones(x.shape))

    def add_sum(self, name: Hashable, values: np.ndarray) -> None:
        self.sums.setdefault(name, ExactSum()).add(values)

    def add_hist(self, name: Hashable, index: np.ndarray, size: int) -> None:
        h = self.hists.setdefault(name, np.zeros(size, np.int64))
        h += np.bincount(np.asarray(index, np.int64), minlength=size)

    def add_count(self, name: Hashable, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(n)

    def merge(self, other: Tally) -> None:
        """Add another tally's sums (e.g. one built by another process)."""
        keys = np.array(list(other.cluster_ids), dtype=object)
        codes = self.clusters(keys) if keys.size else np.zeros(0, np.int64)
        remap_stat = {
            other_sid: self.stat_ids.setdefault(stat, len(self.stat_ids))
            for stat, other_sid in other.stat_ids.items()
        }
        smap = np.zeros(max(len(remap_stat), 1), np.int32)
        for a, b in remap_stat.items():
            smap[a] = b
        for cl, st, n, d in other._parts:
            self._parts.append((codes[cl].astype(np.int32), smap[st], n, d))
        for k, s in other.sums.items():
            self.sums.setdefault(k, ExactSum()).merge(s)
        for k, h in other.hists.items():
            self.hists[k] = self.hists.get(k, 0) + h
        for k, c in other.counts.items():
            self.add_count(k, c)
        self._final = None

    # -- reading ---------------------------------------------------------------------------
    @property
    def num_clusters(self) -> int:
        return len(self.cluster_ids)

    def _finalize(self, num_resamples: int, seed: int) -> tuple:
        """Entries merged per (cluster, stat), clusters ranked by key, and the bootstrap."""
        if self._final is not None and self._final[0] == (num_resamples, seed):
            return self._final
        m = len(self.stat_ids)
        if self._parts:
            cl = np.concatenate([p[0] for p in self._parts])
            st = np.concatenate([p[1] for p in self._parts])
            nu = np.concatenate([p[2] for p in self._parts]).astype(np.float64)
            de = np.concatenate([p[3] for p in self._parts]).astype(np.float64)
        else:
            cl = st = np.zeros(0, np.int32)
            nu = de = np.zeros(0)
        keys = np.array(list(self.cluster_ids), dtype=object)
        rank = np.empty(len(keys), np.int64)
        rank[np.argsort(keys, kind="stable")] = np.arange(len(keys))
        r = rank[cl] if cl.size else np.zeros(0, np.int64)
        # one entry per (cluster, stat), in (rank, stat) order: sums that do not depend on the
        # order chunks arrived in (a player's rows may come from several chunks)
        order = np.lexsort((st, r))
        r, st, nu, de = r[order], st[order], nu[order], de[order]
        if r.size:
            start = np.flatnonzero(np.r_[True, (np.diff(r) != 0) | (np.diff(st) != 0)])
            nu, de = np.add.reduceat(nu, start), np.add.reduceat(de, start)
            r, st = r[start], st[start]
        total_num = np.bincount(st, weights=nu, minlength=m)
        total_den = np.bincount(st, weights=de, minlength=m)
        clusters = np.bincount(st[de != 0], minlength=m)
        boot_num = np.zeros((num_resamples, m))
        boot_den = np.zeros((num_resamples, m))
        c = len(keys)
        for b, lo in enumerate(range(0, c, BLOCK)):
            hi = min(lo + BLOCK, c)
            a, z = np.searchsorted(r, [lo, hi])
            dense = np.zeros((hi - lo, 2 * m), np.float32)
            dense[r[a:z] - lo, st[a:z]] = nu[a:z]
            dense[r[a:z] - lo, m + st[a:z]] = de[a:z]
            rng = np.random.default_rng([seed, b])
            w = rng.poisson(1.0, size=(num_resamples, hi - lo)).astype(np.float32)
            prod = (w @ dense).astype(np.float64)
            boot_num += prod[:, :m]
            boot_den += prod[:, m:]
        self._final = ((num_resamples, seed), total_num, total_den, clusters, boot_num, boot_den)
        return self._final

    def interval(
        self, stat: Hashable, *, num_resamples: int = NUM_RESAMPLES, seed: int = 0
    ) -> Interval:
        """Σ num / Σ den of ``stat`` with its 95 % percentile cluster-bootstrap interval (NaN
        when nothing was counted; the interval is NaN with a single cluster)."""
        if stat not in self.stat_ids:
            return Interval(math.nan, math.nan, math.nan, 0.0, 0.0, 0)
        _, tn, td, cl, bn, bd = self._finalize(num_resamples, seed)
        s = self.stat_ids[stat]
        if td[s] == 0:
            return Interval(math.nan, math.nan, math.nan, float(tn[s]), 0.0, 0)
        value = float(tn[s] / td[s])
        ok = bd[:, s] > 0
        lo = hi = math.nan
        if cl[s] > 1 and ok.any():
            ratios = bn[ok, s] / bd[ok, s]
            lo, hi = (float(v) for v in np.quantile(ratios, [0.025, 0.975]))
        return Interval(value, lo, hi, float(tn[s]), float(td[s]), int(cl[s]))

    def correlation(
        self, name: Hashable, *, num_resamples: int = NUM_RESAMPLES, seed: int = 0
    ) -> tuple[float, float, int]:
        """The 95 % percentile cluster-bootstrap interval of Pearson's r from ``add_moments``
        sums, and the clusters that have a pair: whole clusters are resampled, so positions of one
        game (strongly correlated with each other) count as one draw, not as many. NaN when
        fewer than two clusters or no spread."""
        keys = [(name, k) for k in MOMENTS]
        if any(k not in self.stat_ids for k in keys):
            return math.nan, math.nan, 0
        _, _, _, cl, bn, bd = self._finalize(num_resamples, seed)
        a, b, c = (self.stat_ids[k] for k in keys)
        clusters = int(cl[c])
        if clusters < 2:
            return math.nan, math.nan, clusters
        sx, sy, sxx, syy, sxy, n = bn[:, a], bd[:, a], bn[:, b], bd[:, b], bn[:, c], bd[:, c]
        with np.errstate(divide="ignore", invalid="ignore"):
            vx = sxx - sx * sx / n
            vy = syy - sy * sy / n
            r = (sxy - sx * sy / n) / np.sqrt(vx * vy)
        ok = (n > 1) & (vx > 1e-9 * np.abs(sxx)) & (vy > 1e-9 * np.abs(syy)) & np.isfinite(r)
        if not ok.any():
            return math.nan, math.nan, clusters
        lo, hi = np.quantile(np.clip(r[ok], -1.0, 1.0), [0.025, 0.975])
        return float(lo), float(hi), clusters

    def total(self, name: Hashable) -> float:
        s = self.sums.get(name)
        return s.value if s is not None else 0.0
