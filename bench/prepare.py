"""prepare_data throughput by worker count, and the memory of the released flat-file reader.

    python bench/prepare.py workers [--workers 1 2] [--rounds 5] [--copies 3]
    python bench/prepare.py flat_rss [--mb 200]

``workers``: ``prepare.prepare`` on real games (the bundled shared samples, concatenated
``--copies`` times into one .pgn.zst, events=all so every game is parsed), worker counts
interleaved round by round (ABAB...), median games/s per count and the median ratio to the first
count with its min–max; ``/proc/loadavg`` before and after.

``flat_rss``: a released-layout flat file of about ``--mb`` MB (real games repeated), read in a
fresh process by ``flat_uint32.read_flat`` (windowed memory map) and, for reference, by the
whole-file approach this replaced (memory map, then ``(words & mask).astype(int64)``); reports
the growth of peak RSS (ru_maxrss) over the process after imports.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allie_jax import pgn  # noqa: E402
from allie_jax.data import flat_uint32, prepare  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
INPUTS = [
    SHARED / "lichess" / "lichess_arenas_2025-03-25to28_noclk.pgn.zst",
    SHARED / "lichess" / "lichess_db_2021-10-01_first999_clk.pgn.zst",
    SHARED / "chesscom" / "chesscom_gm_streamers_2024-07_2025-11_clk.pgn.zst",
]


def _loadavg() -> str:
    return pathlib.Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def _build_input(folder: pathlib.Path, copies: int) -> pathlib.Path:
    import zstandard

    sources = [p for p in INPUTS if p.exists()] or [REPO / "data/sample/lichess_sample.pgn.zst"]
    text = b"".join(b"".join(pgn.iter_bytes(str(p))).strip() + b"\n\n" for p in sources)
    path = folder / "bench.pgn.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(text * copies))
    return path


def bench_workers(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        path = _build_input(folder, args.copies)
        config = prepare.PrepareConfig(events="all", min_split_games=0)
        rates: dict[int, list[float]] = {w: [] for w in args.workers}
        print(f"input: {path.stat().st_size / 1e6:.1f} MB zst; load before {_loadavg()}")
        for r in range(args.rounds):
            for w in args.workers:
                start = time.perf_counter()
                stats = prepare.prepare([str(path)], folder / f"out{w}", config, workers=w)
                seconds = time.perf_counter() - start
                rates[w].append(stats["games_read"] / seconds)
                print(
                    f"round {r} workers {w}: {stats['games_read']} games {seconds:.1f} s "
                    f"{rates[w][-1]:.0f} games/s"
                )
        base = args.workers[0]
        print(f"load after {_loadavg()}")
        # What caps the run with free cores: the main process's CPU per game. Ours: decompress
        # and cut blocks (measured inside a 2-worker run); the former design's main process
        # also split the stream into games line by line (measured alone, without its writing).
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = time.process_time()
        stats = prepare.prepare([str(path)], folder / "cpu", config, workers=2)
        ours = time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        worker_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        cpu = time.process_time()
        n = sum(1 for _ in pgn.split_games(pgn.lines(str(path))))
        former = time.process_time() - cpu
        g = stats["games_read"]
        print(
            f"worker CPU (2 workers, incl. start-up): {1e6 * worker_cpu / g:.0f} us/game; "
            f"with N free cores: about N x {g / worker_cpu:.0f} games/s up to the main cap"
        )
        print(
            f"main-process CPU: ours {1e6 * ours / stats['games_read']:.0f} us/game "
            f"(cap {stats['games_read'] / ours:.0f} games/s); former line splitting alone "
            f"{1e6 * former / n:.0f} us/game (cap {n / former:.0f} games/s)"
        )
        for w in args.workers:
            ratios = [a / b for a, b in zip(rates[w], rates[base], strict=True)]
            print(
                f"workers {w}: median {statistics.median(rates[w]):.0f} games/s; ratio to "
                f"{base}: median {statistics.median(ratios):.2f} "
                f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
            )


_RSS_CHILD = """
import json, resource, sys, numpy as np
sys.path.insert(0, {repo!r})
from allie_jax.data import flat_uint32
from allie_jax import vocab
path, how = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if how == "windowed":
    n = sum(1 for _ in flat_uint32.read_flat(path))
else:  # the replaced reader: the whole file at once, widened to int64
    words = np.memmap(path, dtype="<u4", mode="r")
    tokens = (words & flat_uint32.TOKEN_MASK).astype(np.int64)
    n = int((tokens == vocab.EOS).sum())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"games": n, "base_mb": base / 1024, "peak_mb": peak / 1024}}))
"""


def bench_flat_rss(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "released.bin"
        sample = REPO / "data" / "sample" / "lichess_sample.pgn.zst"
        words = flat_uint32.games_to_words(pgn.read_games(sample))
        copies = max(1, int(args.mb * 1e6 / (4 * len(words))))
        with open(path, "wb") as f:
            for _ in range(copies):
                f.write(words.astype("<u4").tobytes())
        size = path.stat().st_size / 1e6
        print(f"file: {size:.0f} MB ({copies} copies of the sample); load {_loadavg()}")
        for how in ("windowed", "whole_file_int64"):
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", _RSS_CHILD.format(repo=str(REPO)), str(path), how],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout)
            print(
                f"{how}: {r['games']} games, peak RSS {r['peak_mb']:.0f} MB, "
                f"+{r['peak_mb'] - r['base_mb']:.0f} MB over imports "
                f"({time.perf_counter() - start:.1f} s)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("workers")
    w.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    w.add_argument("--rounds", type=int, default=5)
    w.add_argument("--copies", type=int, default=3)
    f = sub.add_parser("flat_rss")
    f.add_argument("--mb", type=float, default=200)
    args = parser.parse_args()
    (bench_workers if args.mode == "workers" else bench_flat_rss)(args)


if __name__ == "__main__":
    main()
