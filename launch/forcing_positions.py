"""Forcing positions (seed 001): find forced mates in 2–4 with Stockfish, then score models.

    # find the set (not hand-picked: see allie_jax/eval/forcing.py)
    python -m launch.forcing_positions --pgn ../shared/data/lichess/GAMES.pgn.zst \\
        --output forcing.jsonl [--max_positions 60] [--nodes 400000] [--skip_games 2000]
    # share each model solves (Allie or board checkpoints, dirs or training workdirs)
    python -m launch.forcing_positions --positions forcing.jsonl \\
        --checkpoints allie_tiny=RUN_A,board=RUN_B --output solve.json
"""

from __future__ import annotations

import json

from absl import app, flags

_PGN = flags.DEFINE_string("pgn", None, "Games to search for forcing positions.")
_POSITIONS = flags.DEFINE_string("positions", None, "A forcing-position set (JSONL) to score.")
_CHECKPOINTS = flags.DEFINE_list("checkpoints", [], "name=checkpoint pairs to score.")
_OUTPUT = flags.DEFINE_string("output", None, "JSONL of positions (find) or JSON of solve rates.")
_MAX_POSITIONS = flags.DEFINE_integer("max_positions", 60, "Stop after this many positions.")
_MAX_CANDIDATES = flags.DEFINE_integer("max_candidates", 400, "Stockfish calls at most.")
_NODES = flags.DEFINE_integer("nodes", 400_000, "Stockfish nodes per position.")
_SKIP_GAMES = flags.DEFINE_integer("skip_games", 0, "Skip the first N games of --pgn.")
_STOCKFISH = flags.DEFINE_string("stockfish", "/usr/games/stockfish", "UCI Stockfish binary.")
_ELO = flags.DEFINE_integer("elo", 2500, "Both header Elos when scoring (0: the games' own).")


def main(argv):
    del argv
    from allie_jax import cli

    cli.setup("launch.forcing_positions")  # library INFO logs to a file, not the console
    from allie_jax.eval import forcing

    if _PGN.value:
        from allie_jax.pgn import read_games

        config = forcing.ForcingConfig(
            stockfish=_STOCKFISH.value,
            nodes=_NODES.value,
            max_positions=_MAX_POSITIONS.value,
            max_candidates=_MAX_CANDIDATES.value,
            skip_games=_SKIP_GAMES.value,
        )
        found, stats = forcing.find_forcing_positions(read_games(_PGN.value), config)
        forcing.write_positions(_OUTPUT.value, found)
        by = {}
        for p in found:
            by[p.mate_in] = by.get(p.mate_in, 0) + 1
        print(f"{stats['kept']} forcing positions from {stats['candidates']} candidates {by}")
        print(f"wrote {_OUTPUT.value}")
        return
    if not _POSITIONS.value or not _CHECKPOINTS.value:
        raise app.UsageError("pass --pgn (find) or --positions with --checkpoints (score)")
    from allie_jax.engine.api import Allie

    positions = forcing.read_positions(_POSITIONS.value)
    report = {"positions": _POSITIONS.value, "n": len(positions), "models": {}}
    for item in _CHECKPOINTS.value:
        name, _, path = item.partition("=")
        if not path:
            raise app.UsageError(f"--checkpoints entry {item!r} is not name=checkpoint")
        rate = forcing.solve_rate(Allie.load(path), positions, elo=_ELO.value or None)
        report["models"][name] = rate
        lo, hi = rate["ci95"]
        print(
            f"{name}: {rate['solved']}/{rate['n']} = {100 * rate['value']:.1f}% "
            f"[{100 * lo:.1f}, {100 * hi:.1f}]"
        )
    if _OUTPUT.value:
        from etils import epath

        epath.Path(_OUTPUT.value).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    flags.mark_flags_as_required(["output"])
    app.run(main)
