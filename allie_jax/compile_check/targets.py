"""Accelerators by name (``v5e-16``, ``2xv5e-256``, ``h100-8``) and their compile-only devices.

TPU targets come from ``jax.experimental.topologies.get_topology_desc`` with the ``tpu`` extra's
libtpu, the way MaxText's ``train_compile.py`` does it: libtpu describes a slice of chips it does
not have (coordinates, hosts, interconnect), and XLA:TPU compiles for it on this CPU host. The
table below is MaxText's ``accelerator_to_spec_map`` for the names it lists (``v5e-4`` and
``v6e-8``, single hosts, follow the same pattern). ``Nx<name>`` asks for N slices joined by the
data-centre network (DCN): the devices then carry a ``slice_index`` and a config's
``mesh.dcn_*`` axes span the slices.

GPU targets (``h100-8``, ``h200-8``: one host of eight; ``h100-1``, ``h200-1``: one GPU) go through the same call with
``platform="cuda"`` and an XLA GPU target description; see ``gpu_devices`` for where that stops.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from typing import Any

from allie_jax.compile_check.chips import CHIPS, Chip


class CompileCheckError(ValueError):
    """A target, config or environment that cannot compile as asked (one line for the user)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One named slice (or ``num_slices`` of them) of a chip."""

    name: str
    platform: str  # "tpu" or "cuda"
    chip: Chip
    topology: str  # get_topology_desc's topology name ("v5e:4x4"; GPU: "slices x hosts x gpus")
    chips_per_host_bounds: tuple[int, int, int] = (2, 2, 1)
    chip_config_name: str = "default"  # "megacore" for v4 / v5p (two TensorCores, one device)
    wrap: tuple[bool, bool, bool] = (False, False, False)  # torus links
    num_slices: int = 1
    accelerator_type: str = ""  # the Cloud TPU name libtpu would read from the host


def _tpu(name, chip, topology, config="default", bounds=(2, 2, 1), wrap=(False,) * 3, acc=""):
    return Target(name, "tpu", CHIPS[chip], topology, bounds, config, wrap, 1, acc or name)


_TORUS_2D = (True, True, False)
_TORUS_3D = (True, True, True)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _tpu("v4-8", "v4", "v4:2x2x1", "megacore"),
        _tpu("v4-16", "v4", "v4:2x2x2", "megacore"),
        _tpu("v4-32", "v4", "v4:2x2x4", "megacore"),
        _tpu("v4-128", "v4", "v4:4x4x4", "megacore", wrap=_TORUS_3D),
        _tpu("v5e-4", "v5e", "v5e:2x2", acc="v5litepod-4"),
        _tpu("v5e-16", "v5e", "v5e:4x4", acc="v5litepod-16"),
        _tpu("v5e-32", "v5e", "v5e:4x8", acc="v5litepod-32"),
        _tpu("v5e-64", "v5e", "v5e:8x8", acc="v5litepod-64"),
        _tpu("v5e-128", "v5e", "v5e:8x16", wrap=(False, True, False), acc="v5litepod-128"),
        _tpu("v5e-256", "v5e", "v5e:16x16", wrap=_TORUS_2D, acc="v5litepod-256"),
        _tpu("v5p-8", "v5p", "v5:2x2x1", "megacore"),
        _tpu("v5p-16", "v5p", "v5:2x2x2", "megacore"),
        _tpu("v5p-32", "v5p", "v5:2x2x4", "megacore"),
        _tpu("v5p-128", "v5p", "v5:4x4x4", "megacore", wrap=_TORUS_3D),
        _tpu("v6e-8", "v6e", "v6e:2x4", bounds=(2, 4, 1)),
        _tpu("v6e-256", "v6e", "v6e:16x16", wrap=_TORUS_2D),
        Target("h100-1", "cuda", CHIPS["h100"], "1x1x1"),
        Target("h100-8", "cuda", CHIPS["h100"], "1x1x8"),
        Target("h200-1", "cuda", CHIPS["h200"], "1x1x1"),  # bench/gpu_check.sh's machine
        Target("h200-8", "cuda", CHIPS["h200"], "1x1x8"),
    )
}

_SLICES = re.compile(r"^(\d+)x(.+)$")


def parse_target(name: str) -> Target:
    """``v5e-16``, or ``2xv5e-16`` for two slices; ValueError naming the choices otherwise."""
    slices, base = 1, name
    match = _SLICES.match(name)
    if match and match.group(2) in TARGETS:
        slices, base = int(match.group(1)), match.group(2)
    target = TARGETS.get(base)
    if target is None or slices < 1:
        raise CompileCheckError(
            f"--topology {name!r}: expected one of {', '.join(TARGETS)}, or Nx<name> for N "
            "slices over DCN (e.g. 2xv5e-16)"
        )
    if slices == 1:
        return target
    if target.platform == "cuda":
        hosts = int(target.topology.split("x")[1]) * slices
        return dataclasses.replace(
            target, name=name, topology=f"1x{hosts}x{target.topology.split('x')[2]}"
        )
    return dataclasses.replace(target, name=name, num_slices=slices)


def libtpu_available() -> bool:
    return (
        bool(os.environ.get("TPU_LIBRARY_PATH")) or importlib.util.find_spec("libtpu") is not None
    )


def quiet_libtpu_environment(target: Target) -> None:
    """Environment libtpu reads when it loads, set (unless the caller set it) before it does.

    On a host with no TPU, libtpu asks the GCE metadata server for the slice it is on and logs
    warnings when it cannot tell. A compile-only topology takes its shape from
    ``get_topology_desc``'s arguments, so the metadata query is skipped and the host names and
    accelerator type are given (they only silence the warnings); the host-wide libtpu lock is
    waived (compile-only processes own no chips).
    """
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # libtpu takes a host-wide lock (/tmp/libtpu_lockfile) meant for processes that own the
    # chips; a compile-only process owns none, so two checks (or a check beside a test) may run.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    if target.accelerator_type:
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", target.accelerator_type)


def tpu_devices(target: Target) -> list[Any]:
    """The slice's compile-only devices (``num_slices`` slices joined over DCN)."""
    if not libtpu_available():
        raise CompileCheckError(
            "libtpu is not installed in this Python: the tpu extra (make .venv-tpu/installed) "
            "provides it; run .venv-tpu/bin/python -m launch.compile_check"
        )
    quiet_libtpu_environment(target)
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="tpu",
        topology_name=target.topology,
        chip_config_name=target.chip_config_name,
        chips_per_host_bounds=target.chips_per_host_bounds,
        num_slices=target.num_slices,
        wrap=target.wrap,
    ).devices


def target_devices(target: Target, gpu_target_config: str | None = None) -> list[Any]:
    """Compile-only devices of ``target`` (``gpu_target_config``: an XLA GPU spec file)."""
    if target.platform == "tpu":
        return tpu_devices(target)
    from allie_jax.compile_check.gpu import gpu_devices

    return gpu_devices(target, gpu_target_config)
