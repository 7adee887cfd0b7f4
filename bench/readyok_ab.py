"""``readyok`` of ``launch.uci`` from two trees of this repository, interleaved (before/after).

``bench/readyok.py`` times one tree; this times two revisions on the same load: each revision is
checked out as a git worktree, and launches alternate between them round by round. ``--kind
warm``: each tree first fills a cache dir of its own (one launch, not counted), then every round
launches each tree on its warmed dir; ``--kind cold``: every launch gets a fresh cache dir. A
launch is timed from process start to ``readyok`` (``uci``, ``Mode``, ``LeafBatch``, ``isready``,
as a GUI sends them), then one ``go`` at 10+0.1 is timed. Prints each launch with the load
average, the medians with min-max and the per-round ratio before/after::

    flock /work/bench.lock .venv/bin/python bench/readyok_ab.py --before ac1522d --after HEAD \\
        --size allie_124m --kind warm --rounds 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import worktrees  # noqa: E402  (bench/worktrees.py)
from readyok import launch  # noqa: E402  (bench/readyok.py)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    worktrees.add_arguments(p)
    p.add_argument("--kind", choices=("warm", "cold"), default="warm")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--mode", default="adaptive")
    p.add_argument("--leaf-batch", type=int, default=16)
    args = p.parse_args()
    with worktrees.benchmark_setup(args, "readyok_ab_") as (root, trees, checkpoint):
        times: dict[str, list[float]] = {name: [] for name in trees}
        if args.kind == "warm":
            for name, tree in trees.items():
                cache = root / f"cache-{name}"
                ready, go = launch(checkpoint, args.mode, cache, args.leaf_batch, tree)
                print(f"{name}: first launch {ready:.2f} s (fills its cache dir)", flush=True)
        for r in range(args.rounds):
            for name, tree in trees.items():
                cache = root / f"cache-{name}"
                if args.kind == "cold":
                    cache = root / f"cold-{name}-{r}"
                ready, go = launch(checkpoint, args.mode, cache, args.leaf_batch, tree)
                times[name].append(ready)
                print(
                    f"round {r} {name}: {args.kind} readyok {ready:.2f} s, go {go:.3f} s, "
                    f"load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                if args.kind == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
        worktrees.report(f"{args.kind} readyok", times, worktrees.revisions(args))


if __name__ == "__main__":
    main()
