"""Host batches onto the devices one step ahead, with a data state that matches the steps taken.

The step is dispatched asynchronously, so fetching batch i+1 from grain and starting its transfer
right after dispatching step i hides the host work behind the device's. The catch is
checkpointing: the grain iterator is then one batch ahead of the steps, so this feed remembers
the iterator state after each batch it hands out and saves *that* one.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import jax
import numpy as np


def global_batch(local: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
    """This process's rows → one global array per key, split as ``sharding`` says."""
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()
    }


class DeviceFeed:
    """``next(feed)``: the next global batch (already on device); ``prefetch()`` fetches ahead.

    ``get_state`` / ``set_state`` are those of the wrapped grain iterator *as of the batches
    handed out*, as JSON bytes: the form grain's Orbax handler stores for a non-grain iterator,
    so checkpoints stay ``process_<i>-of-<n>.json`` files readable by the plain iterator.
    """

    def __init__(self, iterator, sharding, *, depth: int = 1):
        self._iterator = iterator
        self._sharding = sharding
        self._depth = max(int(depth), 0)
        self._ahead: collections.deque[tuple[dict[str, jax.Array], Any]] = collections.deque()
        self._state = iterator.get_state()

    def prefetch(self) -> None:
        """Fill the look-ahead queue (call right after dispatching a step)."""
        while len(self._ahead) < self._depth:
            local = next(self._iterator)
            self._ahead.append((global_batch(local, self._sharding), self._iterator.get_state()))

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        if not self._ahead:
            local = next(self._iterator)
            self._state = self._iterator.get_state()
            return global_batch(local, self._sharding)
        batch, self._state = self._ahead.popleft()
        return batch

    # grain's CheckpointHandler protocol for iterators that are not grain DatasetIterators.
    def get_state(self) -> bytes:
        return json.dumps(self._state, indent=4).encode()

    def set_state(self, state: bytes) -> None:
        self._ahead.clear()
        self._state = json.loads(state)
        self._iterator.set_state(self._state)

    def start_prefetch(self) -> None:
        """Called by grain's handler after a restore; fetching ahead waits for ``prefetch``."""

    def close(self) -> None:
        self._ahead.clear()
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
