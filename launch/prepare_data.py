"""Turn PGN files into train/val/test ArrayRecord shards plus stats.json.

    python -m launch.prepare_data --input '/data/lichess_*.pgn.zst' --output /data/allie \
        --workers 8 --elo_balance
"""

from __future__ import annotations

import json

from absl import app, flags

from allie_jax.data import prepare as prepare_lib

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "input", None, "PGN file(s) or glob(s) (.pgn/.pgn.zst/.pgn.bz2, - = stdin)"
)
flags.DEFINE_string("output", None, "output directory")
flags.DEFINE_integer("workers", 1, "parsing processes")
flags.DEFINE_integer("min_plies", 9, "drop games with fewer plies (the released filter: > 8)")
flags.DEFINE_enum("events", "blitz", list(prepare_lib.EVENTS), "blitz (by time control) or all")
flags.DEFINE_bool("require_clocks", False, "drop games without a [%clk] on every move")
flags.DEFINE_bool("drop_bots", True, "drop games with a BOT player")
flags.DEFINE_bool("elo_balance", False, "downsample by mean-Elo bin (SPEC §3)")
flags.DEFINE_string("elo_balance_file", None, "JSON keep_prob / counts / a stats.json")
flags.DEFINE_float("val_frac", 1e-4, "fraction of games in val (hash of the game id)")
flags.DEFINE_float("test_frac", 2e-4, "fraction of games in test (hash of the game id)")
flags.DEFINE_integer("seed", 0, "seed of the split and balancing hashes")
flags.DEFINE_integer("records_per_shard", 100_000, "games per ArrayRecord file")
flags.mark_flags_as_required(["input", "output"])


def main(argv: list[str]) -> None:
    del argv
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
    )
    stats = prepare_lib.prepare(FLAGS.input, FLAGS.output, config, workers=FLAGS.workers)
    summary = {
        k: stats[k] for k in ("games_read", "games_written", "dropped", "tokens", "per_split")
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
