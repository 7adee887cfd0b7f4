"""Random-token batches with the pipeline's exact keys: for throughput benchmarks and shape tests.

Never for training: real batches come from ``allie_jax.data.pipeline``. Kept in the library so
benchmarks and tests share one definition of the batch layout.
"""

from __future__ import annotations

import numpy as np

from allie_jax import vocab


def synthetic_batch(batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab.NUM_MOVES, size=(batch, seq_len + 1), dtype=np.int32)
    ones = np.ones((batch, seq_len), np.float32)
    return {
        "inputs": tokens[:, :-1],
        "segment_ids": np.ones((batch, seq_len), np.int32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch, seq_len)).copy(),
        "policy_targets": tokens[:, 1:],
        "time_targets": rng.uniform(0, 20, (batch, seq_len)).astype(np.float32),
        "value_targets": rng.choice([-1.0, 0.0, 1.0], (batch, seq_len)).astype(np.float32),
        "policy_mask": ones,
        "time_mask": ones,
        "value_mask": ones,
    }
