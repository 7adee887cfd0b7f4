"""Compile a training config's programs for an accelerator this host does not have.

``compile_check(config, "v5e-16")`` builds the mesh ``launch.train`` would build over the
target's compile-only devices (``mesh_from_config``, so ``dcn_*`` configs get hybrid meshes),
lowers the real train step and eval step with abstract, sharded state and batches
(``train.programs``) and the search of a batch of roots (``search.programs``), compiles each with
the target's compiler, and reports per device what ``analysis`` reads from each executable.

Choices, and why:
- ``attention_impl=auto`` is resolved for the *target* (splash on TPU, cuDNN on GPU in 16-bit):
  the model reads ``jax.default_backend()``, which on this host is ``cpu``.
- A multi-slice target with a single-slice config puts the slices on ``dcn_data`` (data
  parallelism is the axis to cross the slow network; ``train.sharding.mesh_from_config``).
- The search runs on one chip (the engine and matches run one search per device), batch
  ``search_batch`` roots, with the engine's shapes (``search.programs``).
- The JSON's top level describes the train step (the program the job repeats), except ``fits``
  (every program fits) and ``compile_seconds`` (every compile together); ``programs`` holds the
  three programs' full reports.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import pathlib
import time
from typing import Any

import jax
from jax.sharding import SingleDeviceSharding

from allie_jax import compat
from allie_jax.compile_check import analysis
from allie_jax.compile_check.targets import (
    CompileCheckError,
    Target,
    parse_target,
    target_devices,
)
from allie_jax.model import family as family_lib
from allie_jax.search.config import SearchConfig
from allie_jax.search.programs import search_program
from allie_jax.train import sharding as shd
from allie_jax.train.loop import model_config_from
from allie_jax.train.metrics import training_flops_per_token
from allie_jax.train.programs import build_abstract_programs, check_batch

TOP_LEVEL_BYTES = ("argument", "output", "temp", "total")
PROGRAMS = ("train", "eval", "search")


def _backend_name(platform: str) -> str:
    return "gpu" if platform == "cuda" else platform


def _slices_config(config, target: Target):
    """The config with its DCN axes matched to the target's slices (see the module doc)."""
    config = copy.deepcopy(config)
    dcn = shd.dcn_shape(config.mesh)
    asked = math.prod(dcn)
    if asked == target.num_slices:
        return config
    if asked == 1:
        config.mesh.dcn_data = target.num_slices
        return config
    raise CompileCheckError(
        f"config.mesh.dcn_* = {dcn} asks for {asked} slices; --topology {target.name} has "
        f"{target.num_slices} (ask for {asked}x{target.name.split('x')[-1]})"
    )


def _tracing_for(devices) -> contextlib.AbstractContextManager:
    """GPU targets: JAX's cuDNN attention checks the target's compute capability, not this
    host's (``compat.cudnn_compute_capability``)."""
    capability = getattr(devices[0], "compute_capability", None)
    if devices[0].platform != "gpu" or not capability:
        return contextlib.nullcontext()
    return compat.cudnn_compute_capability(str(capability))


def _compile(
    name, jitted, args, kwargs, chip, model_flops, devices, hlo_dir
) -> analysis.ProgramReport:
    start = time.perf_counter()
    with _tracing_for(devices):
        lowered = jitted.lower(*args, **kwargs)
    try:
        compiled, _ = analysis.compile_timed(lowered)
    except Exception as err:  # XLA's errors are runtime errors of one type for every cause
        report = analysis.refused(name, chip, str(err), time.perf_counter() - start)
        if report is None:
            raise
        return report
    seconds = time.perf_counter() - start
    if hlo_dir:  # the optimised program, for reading collectives and layouts by eye
        pathlib.Path(hlo_dir).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(hlo_dir) / f"{name}.hlo").write_text(compiled.as_text())
    return analysis.analyse(name, compiled, chip, seconds, model_flops)


def compile_check(
    config,
    topology: str,
    *,
    search_batch: int = 32,
    programs: tuple[str, ...] = PROGRAMS,
    gpu_target_config: str | None = None,
    hlo_dir: str | None = None,
) -> dict[str, Any]:
    """The report (``launch.compile_check``'s JSON) for ``config`` on ``topology``.

    ``programs``: which of train, eval, search to compile (the train step always: the report's
    top level is its numbers). ``hlo_dir``: also write each compiled program's HLO text there.
    """
    unknown = set(programs) - set(PROGRAMS)
    if unknown:
        raise CompileCheckError(
            f"--programs {','.join(programs)}: expected some of {','.join(PROGRAMS)}"
        )
    target = parse_target(topology)
    config = _slices_config(config, target)
    devices = target_devices(target, gpu_target_config)
    hosts = len({d.process_index for d in devices})
    try:
        check_batch(config, len(devices), hosts)
        mesh = shd.mesh_from_config(config.mesh, devices)
        model_config = model_config_from(config)
    except ValueError as err:
        raise CompileCheckError(str(err)) from None
    backend = _backend_name(target.platform)
    model_config = dataclasses.replace(
        model_config, attention_impl=model_config.resolved_attention_impl(backend)
    )
    try:  # what the family refuses before a run (e.g. attention dropout without XLA's kernel)
        family_lib.of_config(config).preflight(config, backend)
    except (ValueError, FileNotFoundError) as err:
        raise CompileCheckError(str(err)) from None
    chip = target.chip
    start = time.perf_counter()
    built = build_abstract_programs(config, model_config, mesh)
    setup_seconds = time.perf_counter() - start

    seq_len = int(config.data.seq_len)
    tokens = int(config.train.batch_size) * seq_len
    per_token = training_flops_per_token(
        built.num_params, model_config.num_layers, model_config.embed_dim, seq_len
    )
    train_flops = per_token * tokens / len(devices)
    state_batch = (built.state, built.batch)
    train_step, eval_step = built.train_step, built.eval_step
    reports = [_compile("train", train_step, state_batch, {}, chip, train_flops, devices, hlo_dir)]
    if "eval" in programs:  # the forward pass: a third of training's 6N + 12 L d T per token
        eval_flops = train_flops / 3
        reports.append(
            _compile("eval", eval_step, state_batch, {}, chip, eval_flops, devices, hlo_dir)
        )
    search = None
    if "search" in programs:
        search = search_program(
            model_config, SearchConfig(), search_batch, SingleDeviceSharding(devices[0])
        )
        reports.append(
            _compile(
                "search",
                search.jitted,
                search.args,
                search.static,
                chip,
                None,
                devices[:1],
                hlo_dir,
            )
        )

    train = reports[0]
    return {
        "topology": target.name,
        "devices": len(devices),
        "fits": all(r.fits for r in reports),
        "hbm_bytes": chip.hbm_bytes,
        "bytes_per_device": {k: train.bytes_per_device.get(k) for k in TOP_LEVEL_BYTES},
        "flops_per_step": train.flops_per_step,
        "predicted_step_seconds": train.predicted_step_seconds,
        "predicted_mfu": train.predicted_mfu,
        "collectives": dict(train.collectives),
        "compile_seconds": setup_seconds + sum(r.compile_seconds for r in reports),
        "platform": target.platform,
        "chip": chip.to_dict(),
        "hosts": hosts,
        "slices": target.num_slices,
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "mesh_dcn": dict(zip(shd.MESH_AXES, shd.dcn_shape(config.mesh), strict=True)),
        "model": {
            "name": str(config.model.name),
            "params": built.num_params,
            "dtype": model_config.dtype,
            "attention": model_config.attention_impl,
            "remat": model_config.remat,
            "batch_size": int(config.train.batch_size),
            "grad_accum": int(config.train.grad_accum),
            "seq_len": seq_len,
            "search_batch": search.batch if search else None,
            "search_cache_width": search.width if search else None,
        },
        "jax": jax.__version__,
        "programs": {r.name: r.to_dict() for r in reports},
    }
