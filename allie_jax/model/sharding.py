"""Logical axis names carried by parameters and activations.

The model only *names* axes; the training code owns the mesh and the rules mapping these names to
mesh axes. The trainer traces its step inside ``activation_sharding(mesh, rules)``, which turns
every ``constrain`` into a ``with_sharding_constraint``; without it (inference, CPU tests) they
are no-ops, unless an ambient abstract mesh and flax logical rules are set.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import jax
from flax.core import spmd
from jax.sharding import PartitionSpec

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"  # model width (parameters)
ACT_EMBED = "activation_embed"  # model width of activations (never the parameters' fsdp axis)
MLP = "mlp"  # feed-forward hidden width
HEADS = "heads"  # attention heads
HEAD_DIM = "kv"  # per-head feature width
VOCAB = "vocab"  # embedding-table rows
LAYERS = "layers"  # the leading axis of the KV cache

LOGICAL_AXES = (BATCH, LENGTH, EMBED, ACT_EMBED, MLP, HEADS, HEAD_DIM, VOCAB, LAYERS)

AxisNames = Sequence[str | None]


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("allie_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(mesh, rules) -> Iterator[None]:
    """Within this context (while tracing), ``constrain`` pins activations onto ``mesh``."""
    token = _ACTIVE.set((mesh, tuple(rules)))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_mesh_and_rules():
    """(mesh, rules) of the enclosing ``activation_sharding``, or (None, None)."""
    active = _ACTIVE.get()
    return active if active is not None else (None, None)


def logical_to_spec(names: AxisNames, rules=None) -> PartitionSpec:
    """Map logical names to a PartitionSpec; names without a rule are replicated.

    Raises ValueError when two names map to the same mesh axis (an inconsistent table).
    """
    rules = dict(rules if rules is not None else spmd.get_logical_axis_rules())
    spec = [rules.get(n) if n is not None else None for n in names]
    used = [a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)]
    if len(used) != len(set(used)):
        raise ValueError(f"logical axes {tuple(names)} map to {spec}: a mesh axis is used twice")
    return PartitionSpec(*spec)


def constrain(x: jax.Array, names: AxisNames) -> jax.Array:
    """Constrain ``x`` by logical names; no-op without an active mesh + rules."""
    active = _ACTIVE.get()
    if active is not None:
        mesh, rules = active
        return jax.lax.with_sharding_constraint(
            x, jax.sharding.NamedSharding(mesh, logical_to_spec(names, rules))
        )
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
