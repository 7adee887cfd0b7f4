"""One compiled program's numbers per device: memory against HBM, FLOPs, a roofline time, MFU.

- Memory (``Compiled.memory_analysis()``): arguments, outputs, temporaries, and the program's
  code; ``total = argument + output - alias + temp + code`` (a donated argument's buffer is the
  output's, so aliased bytes count once). ``fits`` is ``total <= chip HBM``.
- FLOPs and bytes accessed (``Compiled.cost_analysis()``), with ``while`` loops put back at their
  trip counts (``hlo.summarize``; XLA counts each loop body once). Pallas kernels (splash
  attention) report no cost, so their FLOPs are missing from both. Where XLA reports no cost
  (CUDA), the HLO text's matmul FLOPs and instruction bytes stand in.
- Roofline: ``predicted_step_seconds = max(FLOPs / peak, bytes accessed / HBM bandwidth)``;
  collectives are not timed (their bytes are listed). XLA's own ``optimal_seconds`` is shown
  beside it when it is positive (XLA:TPU fills it in, counting loop bodies once).
- ``predicted_mfu = model FLOPs / (predicted_step_seconds x peak)``, model FLOPs being what
  ``launch.train``'s MFU counts (``metrics.training_flops_per_token``): the compiler's FLOPs
  include recomputation (remat) and the optimiser, model FLOPs do not.

When XLA:TPU refuses a program for HBM (``RESOURCE_EXHAUSTED: ... the total memory required for
HLO temporaries (X) exceeds available HBM (Y)``) there is no executable to analyse: ``refused``
keeps the compiler's figures instead (``total`` is then at least X; Y is the compiler's limit).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from allie_jax.compile_check import hlo
from allie_jax.compile_check.chips import Chip

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = r"([\d.]+)\s*([KMGT]?)i?B?"
# XLA:TPU's wordings of "does not fit": (what, used, capacity) in this order.
_HBM_REFUSALS = (
    re.compile(
        rf"required for (HLO temporaries) \({_SIZE}\) exceeds available HBM \({_SIZE}\)",
        flags=re.IGNORECASE,
    ),
    re.compile(rf"()Used\s+{_SIZE}\s+of\s+{_SIZE}\s+hbm", flags=re.IGNORECASE),
)


@dataclasses.dataclass
class ProgramReport:
    """The numbers of one program (train step, eval step, search) on one device."""

    name: str
    fits: bool
    hbm_bytes: int
    bytes_per_device: dict[str, int | None]  # argument, output, alias, temp, code, total
    flops_per_step: float | None
    bytes_accessed: float | None
    model_flops_per_step: float | None
    predicted_step_seconds: float | None
    predicted_mfu: float | None
    collectives: dict[str, int]
    collective_bytes: dict[str, float]
    compile_seconds: float
    xla_optimal_seconds: float | None = None
    loops: dict[str, int] = dataclasses.field(default_factory=dict)
    error: str = ""  # the compiler's refusal, when it refused

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["xla_optimal_seconds"] is None:
            del out["xla_optimal_seconds"]
        if not out["error"]:
            del out["error"]
        return out


def compile_timed(lowered) -> tuple[Any, float]:
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - start


def hbm_refusal(message: str) -> tuple[int, int, bool] | None:
    """(bytes needed, bytes available, whether "needed" is temporaries alone) from XLA:TPU's
    out-of-HBM compile error, if the message is one."""
    for pattern in _HBM_REFUSALS:
        match = pattern.search(message)
        if match is not None:
            what, used, used_unit, capacity, capacity_unit = match.groups()
            return (
                int(float(used) * _UNITS[used_unit.upper()]),
                int(float(capacity) * _UNITS[capacity_unit.upper()]),
                bool(what),
            )
    return None


def refused(name: str, chip: Chip, message: str, seconds: float) -> ProgramReport | None:
    """The report of a program the compiler refused for HBM; None for any other failure."""
    numbers = hbm_refusal(message)
    if numbers is None:
        return None
    used, capacity, temporaries = numbers
    line = next((x.strip() for x in message.splitlines() if "hbm" in x.lower()), message)
    memory = {"argument": None, "output": None, "temp": used if temporaries else None}
    return ProgramReport(
        name=name,
        fits=False,
        hbm_bytes=chip.hbm_bytes,
        # at least what the compiler counted; the compiler's own HBM limit beside it
        bytes_per_device={**memory, "total": used, "compiler_hbm_limit": capacity},
        flops_per_step=None,
        bytes_accessed=None,
        model_flops_per_step=None,
        predicted_step_seconds=None,
        predicted_mfu=None,
        collectives={k: 0 for k in hlo.COLLECTIVES},
        collective_bytes={k: 0.0 for k in hlo.COLLECTIVES},
        compile_seconds=seconds,
        error=line[:400],
    )


def memory(compiled) -> dict[str, int]:
    stats = compiled.memory_analysis()
    out = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "code": int(stats.generated_code_size_in_bytes),
    }
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"] + out["code"]
    return out


def _cost(compiled) -> dict[str, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    return dict(cost or {})


def analyse(
    name: str,
    compiled,
    chip: Chip,
    compile_seconds: float,
    model_flops: float | None,
) -> ProgramReport:
    """``model_flops``: per device per step, as MFU counts them; None uses the compiler's."""
    summary = hlo.summarize(compiled.as_text())
    cost = _cost(compiled)
    if "flops" in cost:
        flops = float(cost["flops"]) * summary.flops_scale
        accessed = float(cost.get("bytes accessed", 0.0)) * summary.bytes_scale
    else:  # no cost analysis (CUDA in jax 0.10.2): the HLO text's own counts
        flops, accessed = summary.matmul_flops, summary.bytes_moved
    seconds = max(flops / chip.peak_flops, accessed / chip.hbm_bandwidth)
    useful = flops if model_flops is None else model_flops
    mem = memory(compiled)
    optimal = float(cost.get("optimal_seconds", 0.0) or 0.0)
    return ProgramReport(
        name=name,
        fits=mem["total"] <= chip.hbm_bytes,
        hbm_bytes=chip.hbm_bytes,
        bytes_per_device=mem,
        flops_per_step=flops,
        bytes_accessed=accessed,
        model_flops_per_step=model_flops,
        predicted_step_seconds=seconds,
        predicted_mfu=useful / (seconds * chip.peak_flops) if seconds > 0 else None,
        collectives=summary.collectives,
        collective_bytes=summary.collective_bytes,
        compile_seconds=compile_seconds,
        xla_optimal_seconds=optimal if optimal > 0 else None,
        loops={"known_trip_count": summary.loops_known, "run_time_bound": summary.loops_unknown},
    )
