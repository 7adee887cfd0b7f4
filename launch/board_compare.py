"""Compare board-state and move-history models on the same held-out games.

    python -m launch.board_compare --checkpoints allie_tiny=RUN_A,board=RUN_B,board_flip=RUN_C \\
        --data_dir DATA --split test --max_games 200 --baseline allie_tiny --output OUT

``--data_dir`` is the output of launch.prepare_data (its ``test`` split is held out from
training); ``--games FILE.pgn.zst`` reads a PGN instead. Writes OUT/board_compare.json and .md.
"""

from __future__ import annotations

import json

from absl import app, flags

_CHECKPOINTS = flags.DEFINE_list("checkpoints", None, "name=checkpoint pairs.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (launch.prepare_data).")
_SPLIT = flags.DEFINE_string("split", "test", "Split of --data_dir to score.")
_GAMES = flags.DEFINE_string("games", None, "A PGN file instead of --data_dir.")
_MAX_GAMES = flags.DEFINE_integer("max_games", 200, "Score at most this many games.")
_BASELINE = flags.DEFINE_string("baseline", None, "Name the paired differences are taken to.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved throughput rounds.")
_OUTPUT = flags.DEFINE_string("output", None, "Output directory.")


def main(argv):
    del argv
    from allie_jax import cli

    cli.setup("launch.board_compare", "output")  # library INFO logs to a file, not the console
    import itertools

    from etils import epath

    from allie_jax.eval.board_compare import compare, markdown

    pairs = dict(item.split("=", 1) for item in _CHECKPOINTS.value)
    baseline = _BASELINE.value or next(iter(pairs))
    if _GAMES.value:
        from allie_jax.pgn import read_games

        games = list(itertools.islice(read_games(_GAMES.value), _MAX_GAMES.value))
    elif _DATA_DIR.value:
        from allie_jax.data.records import deserialize_game
        from allie_jax.data.shards import read_records, shard_paths

        games = [
            deserialize_game(r)
            for p in shard_paths(_DATA_DIR.value, _SPLIT.value)
            for r in read_records(p)
        ][: _MAX_GAMES.value]
    else:
        raise app.UsageError("pass --data_dir or --games")
    out = epath.Path(_OUTPUT.value)
    out.mkdir(parents=True, exist_ok=True)
    report = compare(pairs, games, baseline=baseline, rounds=_ROUNDS.value, cache_dir=out / "cache")
    (out / "board_compare.json").write_text(json.dumps(report, indent=2))
    text = markdown(report, baseline)
    (out / "board_compare.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    flags.mark_flags_as_required(["checkpoints", "output"])
    app.run(main)
