"""Validation that every process runs the same way: fixed-shape padded batches, one compilation.

The val split rarely divides into whole batches, and on several hosts each host's share differs.
A partial final batch would not divide over the mesh (and would compile a second program); a host
that stopped early would leave the others waiting in a collective forever. So every batch is padded
to the full shape with all-zero rows (zero masks: they count for nothing), and all processes run
the same number of batches, the largest count any of them has (capped at ``eval_batches``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from allie_jax.data.synthetic import synthetic_batch
from allie_jax.model.losses import combine
from allie_jax.train.feed import global_batch

TERMS = ("policy_loss", "policy_accuracy", "time_loss", "value_loss")


def pad_rows(local: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``local`` with all-zero rows appended up to ``rows`` (segment 0, every mask 0)."""
    have = len(local["inputs"])
    if have > rows:
        raise ValueError(f"a validation batch has {have} rows, more than the {rows} expected")
    return {
        k: np.concatenate([v, np.zeros((rows - have,) + v.shape[1:], v.dtype)])
        if have < rows
        else v
        for k, v in local.items()
    }


def empty_batch(rows: int, seq_len: int) -> dict[str, np.ndarray]:
    """An all-padding batch with the pipeline's keys and dtypes (for a host out of val data)."""
    return {k: np.zeros_like(v) for k, v in synthetic_batch(rows, seq_len).items()}


def agreed_count(local_count: int) -> int:
    """The largest ``local_count`` over all processes (every host then runs that many batches)."""
    if jax.process_count() == 1:
        return int(local_count)
    counts = multihost_utils.process_allgather(np.asarray(local_count, np.int32))
    return int(np.max(counts))


def means_from_sums(sums: Mapping[str, float], weights: Sequence[float]) -> dict[str, float]:
    """Per-label means of every term and the weighted loss, from ``losses.loss_sums`` totals."""
    means = {t: float(sums[f"{t}_sum"]) / max(float(sums[f"{t}_count"]), 1.0) for t in TERMS}
    means["loss"] = float(combine(means, weights))
    means["policy_tokens"] = float(sums["policy_loss_count"])
    return means


class Validator:
    """``validator(state) -> metrics``: the mean of every loss term over the first batches of val.

    ``open_iterator()`` returns a fresh one-epoch iterator over this process's val shard of
    ``rows``-row batches, or raises FileNotFoundError / ValueError when there is none.
    """

    def __init__(
        self,
        open_iterator: Callable[[], Iterator[dict[str, np.ndarray]]],
        eval_step,
        sharding,
        *,
        rows: int,
        seq_len: int,
        max_batches: int,
        weights: Sequence[float],
    ):
        self._open = open_iterator
        self._eval_step = eval_step
        self._sharding = sharding
        self.rows, self.seq_len, self.max_batches = int(rows), int(seq_len), int(max_batches)
        self.weights = tuple(weights)
        self.num_batches: int | None = None

    def _local_batches(self) -> Iterator[dict[str, np.ndarray]]:
        try:
            iterator = self._open()
        except (FileNotFoundError, ValueError):
            return iter(())
        return (b for _, b in zip(range(self.max_batches), iterator, strict=False))

    def _count(self) -> int:
        """Counted once: the val split does not change during a run."""
        if self.num_batches is None:
            self.num_batches = agreed_count(sum(1 for _ in self._local_batches()))
        return self.num_batches

    def __call__(self, state) -> dict[str, float]:
        count = self._count()
        if count == 0:
            return {}
        local = self._local_batches()
        totals = None
        for _ in range(count):
            rows = next(local, None)
            rows = empty_batch(self.rows, self.seq_len) if rows is None else rows
            sums = self._eval_step(state, global_batch(pad_rows(rows, self.rows), self._sharding))
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        return means_from_sums(jax.device_get(totals), self.weights)
