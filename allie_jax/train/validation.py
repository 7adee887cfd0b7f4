"""Validation that every process runs the same way: fixed-shape padded batches, one compilation.

The val split rarely divides into whole batches, and on several hosts each host's share differs.
A partial final batch would not divide over the mesh (and would compile a second program); a host
that stopped early would leave the others waiting in a collective forever. So every batch is padded
to the full shape with all-zero rows (zero masks: they count for nothing), and all processes run
the same number of batches, the largest count any of them has (capped at ``eval_batches``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from allie_jax.train.feed import global_batch


def agreed_count(local_count: int) -> int:
    """The largest ``local_count`` over all processes (every host then runs that many batches)."""
    if jax.process_count() == 1:
        return int(local_count)
    counts = multihost_utils.process_allgather(np.asarray(local_count, np.int32))
    return int(np.max(counts))


class Validator:
    """``validator(state) -> metrics``: the mean of every loss term over the first batches of val.

    ``open_iterator()`` returns a fresh one-epoch iterator over this process's val shard of
    batches of at most ``len(empty)`` rows, or raises FileNotFoundError / ValueError when there
    is none. ``empty`` is a whole all-padding batch (``family.example_batch``); the family pads
    short batches (``pad_batch``) and turns the summed ``eval_sums`` into means.
    """

    def __init__(
        self,
        open_iterator: Callable[[], Iterator[dict[str, np.ndarray]]],
        eval_step,
        sharding,
        *,
        family: Any,
        empty: Mapping[str, np.ndarray],
        max_batches: int,
        weights: Sequence[float],
    ):
        self._open = open_iterator
        self._eval_step = eval_step
        self._sharding = sharding
        self._family = family
        self._empty = dict(empty)
        self.rows = len(next(iter(self._empty.values())))
        self.max_batches = int(max_batches)
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
            rows = self._empty if rows is None else self._family.pad_batch(rows, self.rows)
            sums = self._eval_step(state, global_batch(rows, self._sharding))
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        return self._family.validation_means(jax.device_get(totals), self.weights)
