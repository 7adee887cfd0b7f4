"""The two layouts of the decoder's layers, and the pure functions that turn one into the other.

``ModelConfig.scan_layers`` picks how ``AllieModel`` keeps its blocks:

    unrolled (False)   blocks.{i}.attn.query      [embed, heads, head_dim]     one Block per layer
    scanned  (True)    layers.attn.query[i]       [layers, embed, heads, head_dim]

Every other parameter (``wte``, ``wpe``, ``elo_embed``, ``ln_f``, the heads) is the same in both.
The scanned layout exists for compile time (one traced layer instead of 24 or 36); the unrolled
one for per-layer code (KV cache, search) and the released checkpoints, which the converters
write unrolled. Checkpoints of either layout load into the other through these functions, which
only move arrays: the numbers never change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

UNROLLED_KEY = "blocks"  # params["blocks"][i] -> one layer's tree
SCANNED_KEY = "layers"  # params["layers"] -> every layer's tree, leading axis = layer


class LayerLayoutError(ValueError):
    """A parameter tree that is in neither layout, or whose layers do not match the config."""


def is_scanned(params: Mapping) -> bool:
    """Whether a pure parameter dict holds the scanned layout (``layers``) or the unrolled one."""
    if SCANNED_KEY in params and UNROLLED_KEY not in params:
        return True
    if UNROLLED_KEY in params and SCANNED_KEY not in params:
        return False
    raise LayerLayoutError(
        f"parameters hold neither {UNROLLED_KEY!r} nor {SCANNED_KEY!r} (or both): "
        f"top-level keys {sorted(map(str, params))}"
    )


def _stack(leaves: list[Any]) -> Any:
    """numpy stays numpy (converters, checkpoints on the host); anything else goes through jnp."""
    if all(isinstance(x, np.ndarray) for x in leaves):
        return np.stack(leaves)
    return jnp.stack(leaves)


def stack_layers(params: Mapping, num_layers: int) -> dict:
    """Unrolled → scanned: ``blocks.{i}.X`` becomes row ``i`` of ``layers.X``.

    Layer keys may be ints or digit strings (Orbax restores ``nnx.List`` indices as strings).
    """
    if is_scanned(params):
        raise LayerLayoutError("stack_layers: the parameters are already in the scanned layout")
    blocks = {int(k): v for k, v in params[UNROLLED_KEY].items()}
    if sorted(blocks) != list(range(num_layers)):
        raise LayerLayoutError(
            f"stack_layers: the checkpoint has layers {sorted(blocks)}, the config {num_layers}"
        )
    per_layer = [blocks[i] for i in range(num_layers)]
    layers = jax.tree.map(lambda *xs: _stack(list(xs)), *per_layer)
    out = {k: v for k, v in params.items() if k != UNROLLED_KEY}
    out[SCANNED_KEY] = layers
    return out


def unstack_layers(params: Mapping) -> dict:
    """Scanned → unrolled: row ``i`` of ``layers.X`` becomes ``blocks.{i}.X`` (int keys)."""
    if not is_scanned(params):
        raise LayerLayoutError("unstack_layers: the parameters are already in the unrolled layout")
    layers = params[SCANNED_KEY]
    sizes = {x.shape[0] for x in jax.tree.leaves(layers)}
    if len(sizes) != 1:
        raise LayerLayoutError(f"unstack_layers: leading axes disagree: {sorted(sizes)}")
    (num_layers,) = sizes
    blocks = {i: jax.tree.map(lambda x, i=i: x[i], layers) for i in range(num_layers)}
    out = {k: v for k, v in params.items() if k != SCANNED_KEY}
    out[UNROLLED_KEY] = blocks
    return out


def to_layout(params: Mapping, *, scan_layers: bool, num_layers: int) -> dict:
    """``params`` in the layout ``scan_layers`` names, converting only when it differs."""
    if is_scanned(params) == scan_layers:
        return dict(params)
    if scan_layers:
        return stack_layers(params, num_layers)
    return unstack_layers(params)
