"""Logical axis names carried by parameters and activations.

The model only *names* axes; the training code owns the mesh and the rules mapping these names to
mesh axes (``flax.core.spmd.logical_axis_rules``). Without a mesh and rules every constraint here
is a no-op, so CPU tests and single-device inference never see sharding at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax.core import spmd
from jax.sharding import PartitionSpec

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"  # model width
MLP = "mlp"  # feed-forward hidden width
HEADS = "heads"  # attention heads
HEAD_DIM = "kv"  # per-head feature width
VOCAB = "vocab"  # embedding-table rows
LAYERS = "layers"  # the leading axis of the KV cache

LOGICAL_AXES = (BATCH, LENGTH, EMBED, MLP, HEADS, HEAD_DIM, VOCAB, LAYERS)

AxisNames = Sequence[str | None]


def logical_to_spec(names: AxisNames, rules=None) -> PartitionSpec:
    """Map logical names to a PartitionSpec; names without a rule are replicated."""
    rules = dict(rules if rules is not None else spmd.get_logical_axis_rules())
    return PartitionSpec(*(rules.get(n) if n is not None else None for n in names))


def constrain(x: jax.Array, names: AxisNames) -> jax.Array:
    """Constrain ``x`` by logical names (reshard on Explicit meshes); no-op without mesh + rules."""
    rules = spmd.get_logical_axis_rules()
    if not rules:
        return x
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    spec = logical_to_spec(names, rules)
    if mesh.are_all_axes_explicit:
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)
