"""Compile-only NVIDIA devices: the ``gpu`` extra's CUDA plugin plus an XLA GPU target description.

``jax.experimental.topologies.get_topology_desc(platform="cuda", topology="1x1x8",
target_config=TEXT)`` makes eight H100s (or H200s) for the compiler without a GPU or a driver;
``TEXT`` is a ``GpuTargetConfigProto`` in text form, the format of the files under XLA's
``xla/backends/gpu/target_config/specs/`` (pass one of those with ``gpu_target_config=PATH``).
Without one, ``target_config_text`` writes the fields XLA's GPU compiler reads from the chip's
public figures (Hopper: compute capability 9.0, 132 SMs at 1.98 GHz, 50 MiB of L2, 228 KiB of
shared memory per SM) and the HBM size and bandwidth of ``chips.CHIPS``.

With jax 0.10.2 this compiles and ``memory_analysis()`` answers, but ``cost_analysis()``
returns None for CUDA executables, so FLOPs and bytes come from the HLO text alone
(``hlo.summarize``'s absolute counts): matmul FLOPs from shapes (``dot`` inside Triton
fusions, cuBLAS custom calls), cuDNN attention calls opaque.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

from allie_jax.compile_check.targets import CompileCheckError, Target


def _dnn_version() -> tuple[int, int]:
    """cuDNN's (major, minor) from the installed wheel (the compiler checks fused attention
    against it); 9.8 when it cannot be read."""
    try:
        parts = importlib.metadata.version("nvidia-cudnn-cu12").split(".")
        return int(parts[0]), int(parts[1])
    except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
        return 9, 8


def target_config_text(target: Target) -> str:
    """A ``GpuTargetConfigProto`` (text format) for a Hopper chip of ``target``."""
    chip = target.chip
    major, minor = _dnn_version()
    fields = {
        "threads_per_block_limit": 1024,
        "threads_per_warp": 32,
        "shared_memory_per_block": 48 * 1024,
        "shared_memory_per_core": 228 * 1024,
        "threads_per_core_limit": 2048,
        "core_count": 132,
        "fpus_per_core": 128,
        "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": int(chip.hbm_bandwidth),
        "l2_cache_size": 50 * 1024 * 1024,
        "clock_rate_ghz": 1.98,
        "device_memory_size": chip.hbm_bytes,
        "shared_memory_per_block_optin": 227 * 1024,
        "registers_per_core_limit": 65536,
        "registers_per_block_limit": 65536,
    }
    body = "\n".join(f"  {k}: {v}" for k, v in fields.items())
    return (
        f"gpu_device_info {{\n{body}\n  cuda_compute_capability {{\n    major: 9\n  }}\n}}\n"
        f'platform_name: "CUDA"\n'
        f"dnn_version_info {{\n  major: {major}\n  minor: {minor}\n}}\n"
        f'device_description_str: "{chip.device_kind}"\n'
    )


def gpu_devices(target: Target, target_config: str | None = None) -> list[Any]:
    """Compile-only devices of ``target`` (``target_config``: a spec file's path, optional)."""
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        raise CompileCheckError(
            "the CUDA plugin is not installed in this Python: the gpu extra provides it "
            "(make .venv-gpu/installed; run .venv-gpu/bin/python -m launch.compile_check)"
        )
    text = target_config_text(target)
    if target_config:
        try:
            with open(target_config) as f:
                text = f.read()
        except OSError as err:
            raise CompileCheckError(f"--gpu_target_config {target_config}: {err}") from None
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="cuda", topology=target.topology, target_config=text
    ).devices
