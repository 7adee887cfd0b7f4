"""Turn PGN files (or released flat uint32 files) into train/val/test ArrayRecord shards plus
stats.json. Paths may be local or remote (etils.epath, e.g. gs://bucket/dir).

    python -m launch.prepare_data --input '/data/lichess_*.pgn.zst' --output /data/allie \
        --workers 8 --elo_balance
    python -m launch.prepare_data --input data/sample/lichess_sample.pgn.zst --output /tmp/d \
        --events all --val_frac 0.05 --test_frac 0.05

A user error (missing or unreadable input, an input without one readable game, a bad setting)
ends in one line on stderr and exit status 1; the output folder is then left as it was.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from allie_jax import cli, pgn
from allie_jax.data import flat_uint32
from allie_jax.data import prepare as prepare_lib

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "input",
    None,
    "PGN file(s) or glob(s), local or gs:// (.pgn/.pgn.zst/.pgn.bz2, - = stdin); with "
    "--input_format released_bin: flat uint32 .bin files",
)
flags.DEFINE_string("output", None, "output directory (local or gs://...)")
flags.DEFINE_enum(
    "input_format",
    "pgn",
    list(prepare_lib.INPUT_FORMATS),
    "pgn, or released_bin: the released Allie flat uint32 training files",
)
flags.DEFINE_integer("workers", 1, "processes that parse, encode and write (the main one reads)")
flags.DEFINE_integer("min_plies", 9, "drop games with fewer plies (the released filter: > 8)")
flags.DEFINE_enum("events", "blitz", list(prepare_lib.EVENTS), "blitz (by time control) or all")
flags.DEFINE_bool("require_clocks", False, "drop games without a [%clk] on every move")
flags.DEFINE_bool("drop_bots", True, "drop games with a BOT player")
flags.DEFINE_bool("elo_balance", False, "downsample by mean-Elo bin (SPEC §3)")
flags.DEFINE_string("elo_balance_file", None, "JSON keep_prob / counts / a stats.json")
flags.DEFINE_float("val_frac", 1e-4, "fraction of games in val (hash of the game id)")
flags.DEFINE_float("test_frac", 2e-4, "fraction of games in test (hash of the game id)")
flags.DEFINE_integer(
    "min_split_games",
    100,
    "small inputs: val and test (when their fraction is > 0) each get at least "
    "min(this, 5% of the games written), topped up with the lowest-hash train games; 0 = off",
)
flags.DEFINE_integer("seed", 0, "seed of the split and balancing hashes")
flags.DEFINE_integer("records_per_shard", 100_000, "games per ArrayRecord file")
flags.mark_flags_as_required(["input", "output"])

USER_ERRORS = (
    prepare_lib.PrepareError,
    pgn.PGNError,
    flat_uint32.FlatFormatError,
    FileNotFoundError,
    ValueError,
    OSError,
)


def main(argv: list[str]) -> None:
    del argv
    cli.setup("launch.prepare_data")
    try:
        config = prepare_lib.PrepareConfig(
            min_plies=FLAGS.min_plies,
            events=FLAGS.events,
            require_clocks=FLAGS.require_clocks,
            drop_bots=FLAGS.drop_bots,
            elo_balance=FLAGS.elo_balance,
            elo_balance_file=FLAGS.elo_balance_file,
            val_frac=FLAGS.val_frac,
            test_frac=FLAGS.test_frac,
            seed=FLAGS.seed,
            records_per_shard=FLAGS.records_per_shard,
            min_split_games=FLAGS.min_split_games,
            input_format=FLAGS.input_format,
        )
        stats = prepare_lib.prepare(FLAGS.input, FLAGS.output, config, workers=FLAGS.workers)
    except USER_ERRORS as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        sys.exit(1)
    moved = stats.get("split_minimums_moved") or {}
    if moved:
        # the fractions alone would leave val/test too small to measure: say what was changed
        told = ", ".join(f"{n} to {split}" for split, n in sorted(moved.items()))
        print(
            f"prepare_data: moved games from train to reach the split minimums ({told}; "
            f"--min_split_games={FLAGS.min_split_games}, 0 turns this off)",
            file=sys.stderr,
        )
    keys = ("games_read", "games_written", "dropped", "tokens", "per_split", "inputs_truncated")
    print(json.dumps({k: stats[k] for k in keys}, indent=2))


if __name__ == "__main__":
    app.run(main)
