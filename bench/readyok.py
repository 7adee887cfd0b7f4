"""Time to ``readyok`` of ``launch.uci``, cold (empty cache dir) and warm (second launch onwards).

A GUI or a tournament manager starts the engine, sends ``uci`` / ``isready`` and waits; a game on
a clock cannot afford a compile at the first ``go``, so ``isready`` compiles every shape the engine
will meet and the cache dir (JAX's persistent cache plus ``allie_jax.aot``'s executable store)
makes every later launch start from disk. Each launch is timed from process start to
``readyok``, then one ``go`` on a clock is timed. Cold and warm launches are interleaved
(cold, warm, cold, warm, ...: each cold launch gets its own empty dir, each warm launch reuses
the first cold launch's dir) and the medians are printed with the load average. Usage::

    python bench/readyok.py --checkpoint demo_out/workdir [--mode adaptive] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def launch(checkpoint: str, mode: str, cache: Path) -> tuple[float, float]:
    """(seconds to readyok from process start, seconds of one go at 10+0.1)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launch.uci",
            "--checkpoint",
            checkpoint,
            "--compile-cache",
            str(cache),
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    proc.stdin.write(f"uci\nsetoption name Mode value {mode}\nisready\n")
    proc.stdin.flush()
    ready = first_go = float("nan")
    for line in proc.stdout:
        if line.strip() == "readyok":
            ready = time.monotonic() - start
            break
    proc.stdin.write("position startpos moves e2e4\ngo wtime 10000 btime 10000 winc 100 binc 100\n")
    proc.stdin.flush()
    start = time.monotonic()
    for line in proc.stdout:
        if line.startswith("bestmove"):
            first_go = time.monotonic() - start
            break
    proc.stdin.write("quit\n")
    proc.stdin.flush()
    proc.wait(60)
    return ready, first_go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a workdir or exported model dir")
    parser.add_argument("--mode", default="adaptive", help="the UCI Mode option")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = lambda: open("/proc/loadavg").read().split()[0]  # noqa: E731
    load_before = load()
    cold, warm, go_cold, go_warm = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="allie_readyok_") as tmp:
        kept = Path(tmp) / "cold-0"
        for r in range(args.rounds):
            ready, go = launch(args.checkpoint, args.mode, Path(tmp) / f"cold-{r}")
            cold.append(ready)
            go_cold.append(go)
            ready, go = launch(args.checkpoint, args.mode, kept)
            warm.append(ready)
            go_warm.append(go)
            print(f"round {r}: cold readyok {cold[-1]:.2f} s, warm readyok {warm[-1]:.2f} s")
    print(
        f"mode {args.mode}: cold readyok median {statistics.median(cold):.2f} s "
        f"({min(cold):.2f}-{max(cold):.2f}), first go {statistics.median(go_cold):.3f} s; "
        f"warm readyok median {statistics.median(warm):.2f} s ({min(warm):.2f}-{max(warm):.2f}), "
        f"first go {statistics.median(go_warm):.3f} s; load {load_before} -> {load()}"
    )


if __name__ == "__main__":
    main()
