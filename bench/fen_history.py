"""FEN starts: how often ``engine.fen_history`` finds a history for real opening positions, and
whether a model reading the found history plays what it plays from the real one.

200 positions from real games (``data/sample``, plies 4-16, the test's sampler): the share for
which a history is found (each checked by python-chess to reach the position exactly), the
seconds per search, the reasons for the misses, and, for a model that reads history (Maia-1500:
its input is the last 8 positions; the Allie checkpoints here are random-weight, so their
agreement would mean nothing), how often its top move from the found history equals its top
move from the game's real history, against the same for the FEN alone (lc0's fill: the position
repeated).

    flock /work/bench.lock .venv/bin/python bench/fen_history.py [--n 200] [--maia DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import time

import chess
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--maia", default=str(REPO.parent / "shared" / "models" / "maia1"))
    parser.add_argument("--time_limit_s", type=float, default=5.0)
    args = parser.parse_args()

    from allie_jax.engine import fen_history
    from tests.test_fen_history import real_positions, same_position

    positions = real_positions(args.n, seed=args.seed)
    found, seconds, why = [], [], collections.Counter()
    for fen, real in positions:
        t = time.monotonic()
        h = fen_history.find_history(fen, time_limit_s=args.time_limit_s)
        seconds.append(time.monotonic() - t)
        if h.found:
            board = chess.Board()
            for m in h.moves:
                board.push_uci(m)
            assert same_position(board, chess.Board(fen)), fen
            found.append((fen, real, list(h.moves)))
        else:
            why[h.why.split(" in ")[0].split(" (")[0]] += 1
    s = np.asarray(seconds)
    print(f"positions {len(positions)}  found {len(found)} ({len(found) / len(positions):.0%})")
    print(
        f"seconds per search: median {np.median(s):.2f}  p90 {np.quantile(s, 0.9):.2f}  max {s.max():.2f}"
    )
    for reason, n in why.most_common():
        print(f"  not found ({n}): {reason}")
    same_plies = sum(len(h) == len(r) for _, r, h in found)
    print(f"found histories as long as the real one: {same_plies}/{len(found)}")
    if not os.path.isdir(args.maia):
        print(f"no Maia nets at {args.maia}: agreement not measured")
        return
    from allie_jax.baselines import lc0_moves
    from allie_jax.baselines.lc0_planes import GameEncoder
    from allie_jax.baselines.maia import MaiaSet

    predictor = MaiaSet(args.maia).predictor(1500)

    def top(moves: list[str], start: chess.Board | None = None) -> str:
        enc = GameEncoder(moves, start)
        pol, _ = predictor(enc.encode(len(moves))[None])
        board = start.copy() if start is not None else chess.Board()
        for m in moves:
            board.push_uci(m)
        legal = list(board.legal_moves)
        return legal[
            int(np.argmax([pol[0, lc0_moves.lc0_move_index(board, m)] for m in legal]))
        ].uci()

    agree = agree_fen = 0
    for fen, real, hist in found:
        t_real = top(real)
        agree += top(hist) == t_real
        agree_fen += top([], chess.Board(fen)) == t_real
    n = max(1, len(found))
    print(
        f"Maia-1500 top move from the found history = from the real history: {agree}/{len(found)} "
        f"({agree / n:.0%}); from the FEN alone (position repeated): {agree_fen}/{len(found)} "
        f"({agree_fen / n:.0%})"
    )


if __name__ == "__main__":
    main()
