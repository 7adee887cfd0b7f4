"""A checkpoint's first load in a fresh process, from two trees of this repository, interleaved.

What every user path pays before its first move or batch (the UCI engine, ``launch.evaluate``,
the notebooks): ``allie_jax.model.checkpoint.load_model`` once, in a process that has imported
the package but loaded no model yet (so one-time costs such as building the abstract parameter
tree count, as they do for a user). Each revision is checked out as a git worktree; each round
starts one process per tree, alternating, and each process prints the seconds of the load alone
(wall and CPU). Prints the medians with min-max, the per-round ratio before/after and the load::

    flock /work/bench.lock .venv/bin/python bench/checkpoint_load.py --before d236fb4 \\
        --after HEAD --size allie_124m --rounds 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import worktrees  # noqa: E402  (bench/worktrees.py)

_CHILD = """
import sys, time
from allie_jax.model.checkpoint import load_model
wall, cpu = time.perf_counter(), time.process_time()
load_model(sys.argv[1])
print("LOAD", time.perf_counter() - wall, time.process_time() - cpu)
"""


def load_once(tree: Path, checkpoint: str) -> tuple[float, float]:
    """(wall s, CPU s) of ``load_model`` in a new process running ``tree``'s package."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, checkpoint],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("LOAD"))
    wall, cpu = (float(x) for x in line.split()[1:])
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    worktrees.add_arguments(p)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with worktrees.benchmark_setup(args, "checkpoint_load_") as (root, trees, checkpoint):
        walls: dict[str, list[float]] = {name: [] for name in trees}
        loads = []
        for r in range(args.rounds):
            for name, tree in trees.items():
                wall, cpu = load_once(tree, checkpoint)
                walls[name].append(wall)
                loads.append(os.getloadavg()[0])
                print(f"round {r} {name}: load_model {wall:.2f} s (CPU {cpu:.2f} s)", flush=True)
        worktrees.report("first load", walls, worktrees.revisions(args))
        print(f"load average {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
