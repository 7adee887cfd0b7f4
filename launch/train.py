"""Train Allie: ``python -m launch.train --config configs/tiny.py --workdir DIR [--data_dir D]``."""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.", required=True)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Output of launch.prepare_data (overrides config)."
)


def main(argv):
    del argv
    from allie_jax.train import train_and_evaluate, write_summary

    config = _CONFIG.value
    if _DATA_DIR.value:
        config.data.data_dir = _DATA_DIR.value
    result = train_and_evaluate(config, _WORKDIR.value)
    logging.info("%s", write_summary(result))
    print(write_summary(result))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main)
