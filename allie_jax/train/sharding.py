"""Logical-axis rules: how the model's named axes map onto the (data, fsdp, tensor) mesh.

The model annotates parameters and activations with logical names (`embed`, `mlp`, `heads`,
`vocab`, `batch`, `length`); this table is the only place that decides which mesh axis shards
which of them, so changing a parallelism strategy is a one-line edit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from flax.core import spmd as core_spmd
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    # 1,997 rows divide by nothing useful; the embedding is sharded over `embed` instead.
    ("vocab", None),
    ("control", None),
)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh over (data, fsdp, tensor); one -1 entry takes the remaining devices."""
    devices = list(devices) if devices is not None else jax.devices()
    shape = list(shape)
    if len(shape) != 3:
        raise ValueError(f"mesh shape must have 3 entries (data, fsdp, tensor), got {shape}")
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not divide into mesh {shape}")
        shape[shape.index(-1)] = len(devices) // known
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh {shape} needs {math.prod(shape)} devices, have {len(devices)}")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_mesh_spec(logical: Sequence[str | None] | None) -> PartitionSpec:
    if not logical:
        return PartitionSpec()
    return PartitionSpec(*core_spmd.from_sharding_rules(tuple(logical), LOGICAL_AXIS_RULES))


def state_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """NamedSharding for every variable, from its logical ``out_sharding`` metadata."""
    with nnx.logical_axis_rules(LOGICAL_AXIS_RULES):
        specs = nnx.get_partition_spec(state)
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches are split over the data-parallel axes, the sequence stays whole."""
    return NamedSharding(mesh, logical_to_mesh_spec(("batch", "length")))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
