"""Train Allie: ``python -m launch.train --config configs/tiny.py --workdir DIR [--data_dir D]``.

Exit status: 0 when the run reached ``train.steps``; 75 (EX_TEMPFAIL, ``EXIT_PREEMPTED``) when it
was preempted (SIGTERM) and saved a checkpoint to resume from: relaunch the same command; 1 on
an error. ``--workdir`` and ``--data_dir`` may be ``gs://`` paths (etils.epath).
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.", required=True)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Output of launch.prepare_data (overrides config)."
)


def main(argv):
    del argv
    from allie_jax.train import train_and_evaluate, write_summary
    from allie_jax.train.preemption import EXIT_PREEMPTED

    config = _CONFIG.value
    if _DATA_DIR.value:
        config.data.data_dir = _DATA_DIR.value
    result = train_and_evaluate(config, _WORKDIR.value)
    print(write_summary(result), flush=True)
    if result.preempted:
        sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
