"""The key/value cache that lets search evaluate a few new tokens instead of a whole game.

Rows may hold prefixes of different lengths (``length[b]``); entries at or past a row's length are
never attended to, so their contents do not matter.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
    k: jax.Array  # [num_layers, B, max_len, num_heads, head_dim]
    v: jax.Array  # [num_layers, B, max_len, num_heads, head_dim]
    length: jax.Array  # int32 [B]: entries filled per row

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @classmethod
    def zeros(
        cls,
        *,
        num_layers: int,
        batch_size: int,
        max_len: int,
        num_heads: int,
        head_dim: int,
        dtype=jnp.float32,
    ) -> KVCache:
        shape = (num_layers, batch_size, max_len, num_heads, head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            length=jnp.zeros((batch_size,), jnp.int32),
        )

    def take(self, rows: jax.Array) -> KVCache:
        """The cache of the selected rows (e.g. to fan one root out to several searches)."""
        return KVCache(self.k[:, rows], self.v[:, rows], self.length[rows])
