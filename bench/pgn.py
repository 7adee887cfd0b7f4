"""Games/s per process: our PGN reader vs the released code's approach (python-chess).

Baseline: ``chess.pgn.read_game`` then walking the mainline reading ``node.clock()`` (what the
released Allie did). Both read the same decompressed text from memory, so decompression is
not part of either number. With ``--workers N`` the games are split into N contiguous parts
parsed by N processes at once; we report games/s per process and in total.

    python bench/pgn.py [--input FILE.pgn.zst] [--workers 1 2] [--repeat 1]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import pathlib
import re
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import chess.pgn  # noqa: E402
import zstandard  # noqa: E402

from allie_jax import pgn  # noqa: E402

DEFAULT_INPUT = REPO / "data" / "sample" / "lichess_sample.pgn.zst"


def _ours(text: str) -> int:
    return sum(1 for _ in pgn.read_games(io.StringIO(text)))


def _baseline(text: str) -> int:
    stream = io.StringIO(text)
    n = 0
    while (game := chess.pgn.read_game(stream)) is not None:
        moves, clocks = [], []
        for node in game.mainline():
            moves.append(node.move.uci())
            clocks.append(node.clock())
        n += bool(moves)
    return n


def _timed(args):
    fn, text = args
    start = time.perf_counter()
    n = fn(text)
    return n, time.perf_counter() - start


def _split(text: str, parts: int) -> list[str]:
    games = re.split(r"\n\n(?=\[Event )", text.strip())
    size = -(-len(games) // parts)
    return ["\n\n".join(games[i * size : (i + 1) * size]) + "\n" for i in range(parts)]


def run(text: str, fn, workers: int) -> tuple[int, float, float]:
    """(games, per-process games/s, total games/s)."""
    chunks = _split(text, workers) if workers > 1 else [text]
    start = time.perf_counter()
    if workers == 1:
        results = [_timed((fn, text))]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_timed, [(fn, c) for c in chunks])
    wall = time.perf_counter() - start
    games = sum(n for n, _ in results)
    per_process = sum(n / t for n, t in results) / len(results)
    return games, per_process, games / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(DEFAULT_INPUT))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs")
    args = parser.parse_args()
    with open(args.input, "rb") as f:
        data = f.read()
    text = (
        zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read().decode()
        if args.input.endswith(".zst")
        else data.decode()
    )
    print(f"input: {args.input}")
    print(f"{'workers':>7} {'reader':>9} {'games':>6} {'games/s/proc':>13} {'games/s total':>14}")
    for workers in args.workers:
        rates = {}
        for name, fn in (("ours", _ours), ("baseline", _baseline)):
            best = max((run(text, fn, workers) for _ in range(args.repeat)), key=lambda r: r[1])
            rates[name] = best
            print(f"{workers:>7} {name:>9} {best[0]:>6} {best[1]:>13.0f} {best[2]:>14.0f}")
        ratio = rates["ours"][1] / rates["baseline"][1]
        print(f"{workers:>7} {'ratio':>9} {'':>6} {ratio:>12.2f}x")


if __name__ == "__main__":
    main()
