"""Every offline result of the paper from one command (SPEC §5).

    python -m launch.evaluate --checkpoint DIR --games FILE.pgn[.zst] --output OUTDIR \\
        [--systems policy,greedy,search,adaptive] [--max_games N] [--stockfish PATH]

writes OUTDIR/report.json, OUTDIR/report.md and PNG plots. ``--checkpoint`` is a checkpoint
directory or a training workdir (its best checkpoint, else the latest).
"""

from __future__ import annotations

import sys

from absl import app, flags

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Checkpoint dir or training workdir.")
_GAMES = flags.DEFINE_string("games", None, "PGN of human games (.pgn, .pgn.zst, .pgn.bz2).")
_OUTPUT = flags.DEFINE_string("output", None, "Directory for report.json, report.md, plots.")
_SYSTEMS = flags.DEFINE_list(
    "systems", ["policy", "greedy", "search", "adaptive"], "Systems to score for move matching."
)
_MAX_GAMES = flags.DEFINE_integer("max_games", 1000, "Read at most this many games.")
_STOCKFISH = flags.DEFINE_string(
    "stockfish", None, "UCI Stockfish binary (e.g. /usr/games/stockfish) for the value oracle."
)
_SEARCH_POSITIONS = flags.DEFINE_integer(
    "search_positions", 200, "Subsample of accuracy positions scored by search / adaptive."
)
_RANDOM_GAMES = flags.DEFINE_integer(
    "random_games", 100, "Random legal games for the out-of-distribution legality check."
)
_STOCKFISH_POSITIONS = flags.DEFINE_integer(
    "stockfish_positions", 200, "Positions analysed by Stockfish."
)
_STOCKFISH_NODES = flags.DEFINE_integer("stockfish_nodes", 20_000, "Stockfish nodes per position.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 16, "Games per causal pass.")
_SEARCH_BATCH_SIZE = flags.DEFINE_integer("search_batch_size", 64, "Positions per search batch.")
_CALIBRATION_PGN = flags.DEFINE_string(
    "calibration_pgn", None, "PGN of games played by systems (launch.match) for skill calibration."
)
_CALIBRATION_SYSTEMS = flags.DEFINE_list(
    "calibration_systems", [], "System names (PGN White/Black) to calibrate."
)
_SYSTEM_OPTIONS = flags.DEFINE_list(
    "system_options",
    [],
    "key=value options for system factories (see allie_jax/eval/systems.py), e.g. maia_dir=PATH.",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the subsamples and random games.")
_PLOTS = flags.DEFINE_boolean("plots", True, "Write PNG plots.")


def _parse_options(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise app.UsageError(f"--system_options entry {item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return out


def main(argv):
    del argv
    from allie_jax.pgn import PGNError

    # Missing or unreadable checkpoint (CheckpointError is a ValueError), missing / junk / empty
    # PGN (PGNError, OSError, the evaluator's "no usable game" ValueError), bad flag values.
    user_errors = (ValueError, PGNError, OSError)
    try:
        report = _run()
    except user_errors as err:  # a bad path or input: one line, not a traceback
        print(f"launch.evaluate: error: {err}", file=sys.stderr)
        sys.exit(1)
    acc = report["move_accuracy"]
    summary = ", ".join(f"{k} {100 * v['overall']['value']:.1f}%" for k, v in acc.items())
    print(f"move matching: {summary}")
    print(f"wrote {_OUTPUT.value}/report.json and report.md in {report['meta']['elapsed_s']:.0f} s")


def _run() -> dict:
    """The evaluation itself, from the flags."""
    from allie_jax.eval.evaluate import EvalConfig, evaluate

    config = EvalConfig(
        systems=tuple(_SYSTEMS.value),
        max_games=_MAX_GAMES.value,
        search_positions=_SEARCH_POSITIONS.value,
        search_batch_size=_SEARCH_BATCH_SIZE.value,
        random_games=_RANDOM_GAMES.value,
        batch_size=_BATCH_SIZE.value,
        stockfish=_STOCKFISH.value,
        stockfish_positions=_STOCKFISH_POSITIONS.value,
        stockfish_nodes=_STOCKFISH_NODES.value,
        calibration_pgn=_CALIBRATION_PGN.value,
        calibration_systems=tuple(_CALIBRATION_SYSTEMS.value),
        system_options=tuple(_parse_options(_SYSTEM_OPTIONS.value)),
        seed=_SEED.value,
        plots=_PLOTS.value,
    )
    return evaluate(_CHECKPOINT.value, _GAMES.value, _OUTPUT.value, config)


if __name__ == "__main__":
    flags.mark_flags_as_required(["checkpoint", "games", "output"])
    app.run(main)
