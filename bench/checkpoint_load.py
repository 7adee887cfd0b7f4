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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from readyok import save_random  # noqa: E402  (bench/readyok.py)

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
    p.add_argument("--before", required=True, help="git revision of the 'before' tree")
    p.add_argument("--after", default="HEAD", help="git revision of the 'after' tree")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a model dir or training workdir")
    source.add_argument("--size", help="a ModelConfig.named size, saved with random weights")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="checkpoint_load_") as tmp:
        root = Path(tmp)
        trees = {}
        for name, rev in (("before", args.before), ("after", args.after)):
            trees[name] = root / name
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(REPO),
                    "worktree",
                    "add",
                    "-f",
                    "--detach",
                    str(trees[name]),
                    rev,
                ],
                check=True,
                capture_output=True,
            )
        try:
            checkpoint = args.checkpoint or str(save_random(args.size, root / "model"))
            walls: dict[str, list[float]] = {name: [] for name in trees}
            loads = []
            for r in range(args.rounds):
                for name, tree in trees.items():
                    wall, cpu = load_once(tree, checkpoint)
                    walls[name].append(wall)
                    loads.append(os.getloadavg()[0])
                    print(
                        f"round {r} {name}: load_model {wall:.2f} s (CPU {cpu:.2f} s)", flush=True
                    )
            for name, rev in (("before", args.before), ("after", args.after)):
                w = walls[name]
                print(
                    f"{name} ({rev}): first load median {statistics.median(w):.2f} s "
                    f"({min(w):.2f}-{max(w):.2f})"
                )
            ratios = [b / a for b, a in zip(walls["before"], walls["after"], strict=True)]
            print("before/after per round: " + " ".join(f"{x:.2f}" for x in ratios))
            print(f"load average {min(loads):.2f}-{max(loads):.2f}")
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )


if __name__ == "__main__":
    main()
