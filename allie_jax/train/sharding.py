"""Logical-axis rules: how the model's named axes map onto the (data, fsdp, tensor) mesh.

The model annotates parameters and activations with logical names (`embed`, `mlp`, `heads`,
`vocab`, `batch`, `length`, `activation_embed`); this table is the only place that decides which
mesh axis shards which of them, so changing a parallelism strategy is a one-line edit.

Parameters shard `embed` over `fsdp` (ZeRO-3 style); activations shard `batch` over data × fsdp.
An activation ``[batch, length, embed]`` would then name `fsdp` twice, so activations carry
`activation_embed` (replicated) instead: one table, no spec that uses a mesh axis twice.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
from flax import nnx
from flax.core import spmd as core_spmd
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from allie_jax.model import sharding as model_sharding

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
    ("activation_embed", None),
)


def resolve_shape(shape: Sequence[int], num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with a -1 entry filled in from ``num_devices``."""
    shape = [int(s) for s in shape]
    if len(shape) != 3:
        raise ValueError(f"mesh shape must have 3 entries (data, fsdp, tensor), got {shape}")
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if num_devices % known:
            raise ValueError(f"{num_devices} devices do not divide into mesh {shape}")
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise ValueError(f"mesh {shape} needs {math.prod(shape)} devices, have {num_devices}")
    return tuple(shape)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh over (data, fsdp, tensor) within one slice; one -1 entry takes the remaining devices.

    ``jax.make_mesh`` orders the devices for the physical topology (rings on TPU ICI); the axes
    are Auto (the compiler propagates shardings from the constraints we give it).
    """
    devices = list(devices) if devices is not None else jax.devices()
    shape = resolve_shape(shape, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def mesh_shape_from_config(mesh_config, num_devices: int) -> tuple[int, int, int]:
    """The full (data, fsdp, tensor) shape: ICI shape × DCN shape when ``dcn_*`` is set."""
    dcn = dcn_shape(mesh_config)
    per_slice = num_devices // math.prod(dcn)
    ici = resolve_shape((mesh_config.data, mesh_config.fsdp, mesh_config.tensor), per_slice)
    return tuple(a * b for a, b in zip(ici, dcn, strict=True))


def dcn_shape(mesh_config) -> tuple[int, int, int]:
    """Slices along (data, fsdp, tensor); all 1 on a single slice."""
    return tuple(int(mesh_config.get(f"dcn_{axis}", 1)) for axis in MESH_AXES)


def mesh_from_config(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The training mesh: one slice → ``jax.make_mesh``; several (``--config.mesh.dcn_*``) →
    ``mesh_utils.create_hybrid_device_mesh`` (ICI axes inside a slice, DCN axes across slices).

    Data parallelism is the axis to put across slices (``dcn_data``): it only all-reduces
    gradients once per step over the slow network.
    """
    devices = list(devices) if devices is not None else jax.devices()
    dcn = dcn_shape(mesh_config)
    if math.prod(dcn) == 1:
        return make_mesh((mesh_config.data, mesh_config.fsdp, mesh_config.tensor), devices)
    if len(devices) % math.prod(dcn):
        raise ValueError(f"{len(devices)} devices do not split into {dcn} slices")
    ici = resolve_shape(
        (mesh_config.data, mesh_config.fsdp, mesh_config.tensor), len(devices) // math.prod(dcn)
    )
    # Granules of the slow network: TPU slices (device.slice_index) where there are as many as
    # asked for; otherwise processes (GPU hosts, CPU tests), whose devices share a fast network.
    slices = {getattr(d, "slice_index", None) for d in devices}
    process_is_granule = len(slices) != math.prod(dcn) or None in slices
    grid = mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=process_is_granule
    )
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


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
    """Batches are split over the data-parallel axes, the sequence stays whole.

    Only the leading axis is named, so the same sharding fits every batch field whatever its
    rank (the board family's batches hold per-position scalars as well as ``[B, T]`` arrays).
    """
    return NamedSharding(mesh, logical_to_mesh_spec(("batch",)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def with_activation_sharding(fn: Callable, mesh: Mesh) -> Callable:
    """``fn`` traced with the activation constraints on (``model.sharding.constrain``).

    Tracing happens inside jit at the first call, so the rules must be active inside the traced
    function, not around the ``jax.jit`` call.
    """

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with model_sharding.activation_sharding(mesh, LOGICAL_AXIS_RULES):
            return fn(*args, **kwargs)

    return traced
