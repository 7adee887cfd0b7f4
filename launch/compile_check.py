"""Compile a training config for an accelerator you do not have, and see whether it fits.

    .venv-tpu/bin/python -m launch.compile_check --config configs/allie_medium.py \
        --topology v5e-16 [--config.train.grad_accum=4 ...] [--json OUT.json]

Runs on a CPU host (the TPU compiler comes with the ``tpu`` extra's libtpu, which
``make .venv-tpu/installed`` puts in its own environment). Prints, per device and for the train
step, the eval step and the search: argument, output, temporary and total bytes against the
chip's HBM, whether that fits, FLOPs per step, a roofline step time and the MFU it implies, the
collectives, and compile seconds (``allie_jax.compile_check``).

Exit status: 0 when every program fits; 1 when one does not (the numbers are printed and
written); 2 on a bad flag or config (one line on stderr).
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).")
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "Target: v4-8, v5e-16, v5e-256, v5p-8, v5p-128, ..., 2xv5e-16 (2 slices)."
)
_JSON = flags.DEFINE_string("json", None, "Also write the report as JSON here.")
_SEARCH_BATCH = flags.DEFINE_integer("search_batch", 32, "Roots in the compiled search batch.")
_HLO_DIR = flags.DEFINE_string(
    "hlo_dir", None, "Also write each compiled program's optimised HLO text here (NAME.hlo)."
)
_PROGRAMS = flags.DEFINE_list(
    "programs", "train,eval,search", "Which programs to compile (the train step always)."
)
_GPU_TARGET_CONFIG = flags.DEFINE_string(
    "gpu_target_config",
    None,
    "GPU targets: an XLA GpuTargetConfigProto text file (xla/backends/gpu/target_config/specs/) "
    "instead of the one written from the chip table.",
)


def main(argv):
    del argv
    from allie_jax import cli

    cli.setup("launch.compile_check")  # library INFO logs to a file, not the console
    import jax

    jax.config.update("jax_platforms", "cpu")  # compile for the target; never claim a local chip
    from allie_jax.compile_check import CompileCheckError, compile_check, format_report

    try:
        report = compile_check(
            _CONFIG.value,
            _TOPOLOGY.value,
            search_batch=_SEARCH_BATCH.value,
            programs=tuple(["train", *_PROGRAMS.value]),
            gpu_target_config=_GPU_TARGET_CONFIG.value,
            hlo_dir=_HLO_DIR.value,
        )
    except (CompileCheckError, ValueError) as err:  # bad flags or config, not compiler faults
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"launch.compile_check: error: {first}", file=sys.stderr)
        sys.exit(2)
    print(format_report(report), flush=True)
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump(report, f, indent=2)
    sys.exit(0 if report["fits"] else 1)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "topology"])
    app.run(main)
