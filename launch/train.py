"""Train Allie: ``python -m launch.train --config configs/tiny.py --workdir DIR [--data_dir D]``.

Exit status: 0 when the run reached ``train.steps``; 75 (EX_TEMPFAIL, ``EXIT_PREEMPTED``) when it
was preempted (SIGTERM) and saved a checkpoint to resume from: relaunch the same command; 1 on
an error, which is one line on stderr naming the input (a missing config, a data directory that
is missing or holds raw PGN rather than ``launch.prepare_data``'s shards, a corrupt checkpoint).
``--workdir`` and ``--data_dir`` may be ``gs://`` paths (etils.epath).
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from allie_jax import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and metrics go.", required=True)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Output of launch.prepare_data (overrides config)."
)

COMMAND = "launch.train"
PGN_SUFFIXES = (".pgn", ".pgn.zst", ".pgn.bz2", ".pgn.gz")


def check_data_dir(data_dir: str) -> None:
    """A missing folder, or one of raw PGN files, is the common first mistake: say what to run."""
    from allie_jax.data import paths

    root = paths.as_path(data_dir)
    hint = f"python -m launch.prepare_data --input '{data_dir}/*.pgn.zst' --output DATA"
    if not root.exists():
        raise FileNotFoundError(f"--data_dir {data_dir}: no such directory (make one with {hint})")
    if not root.is_dir():
        raise NotADirectoryError(
            f"--data_dir {data_dir}: is a file, not launch.prepare_data's output"
        )
    names = [p.name for p in root.iterdir()]
    pgns = [n for n in names if n.endswith(PGN_SUFFIXES)]
    if pgns and not any(n in names for n in ("train", "stats.json")):
        raise ValueError(
            f"--data_dir {data_dir} holds PGN files ({pgns[0]}{', ...' if len(pgns) > 1 else ''}), "
            f"not prepared shards: run {hint}, then --data_dir DATA"
        )


def main(argv):
    del argv
    cli.setup(COMMAND)
    try:
        config = _CONFIG.value
        _ = config.data  # a config file that failed to load raises on first use: here
    except (OSError, AttributeError, KeyError, ValueError, SyntaxError) as err:
        flag = next((a for a in sys.argv if a.startswith("--config")), "--config")
        cli.fail(COMMAND, f"cannot load the config ({flag}): {_config_error(err)}")
    if config is None:
        cli.fail(COMMAND, "--config is required (e.g. --config configs/tiny.py)")
    from allie_jax.model.checkpoint import CheckpointError
    from allie_jax.train import train_and_evaluate, write_summary
    from allie_jax.train.preemption import EXIT_PREEMPTED

    try:
        if _DATA_DIR.value:
            config.data.data_dir = _DATA_DIR.value
        if config.data.data_dir:
            check_data_dir(config.data.data_dir)
        result = train_and_evaluate(config, _WORKDIR.value)
    except (CheckpointError, FileNotFoundError, NotADirectoryError, ValueError, KeyError) as err:
        cli.fail(COMMAND, _checkpoint_words(err, _WORKDIR.value), exit_now=True)
    except Exception as err:  # noqa: BLE001 - Orbax/TensorStore on a damaged checkpoint
        if _is_checkpoint_error(err):
            cli.fail(COMMAND, _checkpoint_words(err, _WORKDIR.value), exit_now=True)
        raise
    print(write_summary(result), flush=True)
    if result.preempted:
        sys.exit(EXIT_PREEMPTED)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().strip('"')
    return text.splitlines()[0] if text else type(err).__name__


def _config_error(err: BaseException) -> str:
    """The useful line of ml_collections' config-file error (the file and the OS's reason)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reasons = [line for line in lines if line.startswith("[Errno")]
    return reasons[-1] if reasons else (lines[0] if lines else type(err).__name__)


def _is_checkpoint_error(err: BaseException) -> bool:
    """Errors raised while reading a damaged Orbax checkpoint (TensorStore, msgpack, json)."""
    text = f"{type(err).__module__}.{type(err).__name__} {err}".lower()
    return any(w in text for w in ("tensorstore", "orbax", "checkpoint", "ocdbt", "msgpack"))


def _checkpoint_words(err: BaseException, workdir: str) -> str:
    """One line; a failure to read a checkpoint is called corrupt and names the folder."""
    line = _first_line(err)
    if _is_checkpoint_error(err) and "corrupt" not in line.lower():
        return (
            f"the checkpoint in {workdir}/checkpoints is corrupt or truncated ({line[:300]}); "
            "remove that step folder to resume from the one before, or start a new --workdir"
        )
    return line


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a config override naming no setting (a misspelt
    ``--config.model.mlp_ratio=4``) as one line instead of ml_collections' traceback."""
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as err:
        key = _first_line(err).strip("'\"")
        overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
        override = next(
            (o for o in overrides if o.split(".")[-1] == key), overrides[0] if overrides else key
        )
        cli.fail(
            COMMAND,
            f"{override}: not a setting of this config ({_first_line(err)}); "
            "the config file lists every setting",
        )


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    app.run(main, flags_parser=parse_flags)
