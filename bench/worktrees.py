"""Revisions of this repository checked out side by side, for benchmarks that interleave them."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def checked_out(revisions: dict[str, str], root: Path) -> Iterator[dict[str, Path]]:
    """``{name: rev}`` as detached git worktrees ``root/name``; yields ``{name: path}`` and
    removes the worktrees afterwards (whatever the benchmark did)."""
    trees: dict[str, Path] = {}
    try:
        for name, rev in revisions.items():
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
        yield trees
    finally:
        for tree in trees.values():
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--before``/``--after`` (revisions) and the model: ``--checkpoint`` or ``--size``."""
    parser.add_argument("--before", required=True, help="git revision of the 'before' tree")
    parser.add_argument("--after", default="HEAD", help="git revision of the 'after' tree")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a model dir or training workdir")
    source.add_argument("--size", help="a ModelConfig.named size, saved with random weights")


def revisions(args: argparse.Namespace) -> dict[str, str]:
    """``{"before": rev, "after": rev}`` from ``add_arguments``' flags."""
    return {"before": args.before, "after": args.after}


@contextlib.contextmanager
def benchmark_setup(
    args: argparse.Namespace, prefix: str
) -> Iterator[tuple[Path, dict[str, Path], str]]:
    """What every A/B benchmark here starts from: a temporary directory, the ``--before`` and
    ``--after`` trees checked out in it, and the model (``--checkpoint``, or a ``--size``-shaped
    one saved there with random weights). Yields ``(root, {name: tree}, checkpoint)``."""
    from readyok import save_random  # bench/readyok.py (on the path of every bench script)

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        with checked_out(revisions(args), root) as trees:
            yield root, trees, args.checkpoint or str(save_random(args.size, root / "model"))


def report(what: str, seconds: dict[str, list[float]], revisions: dict[str, str]) -> None:
    """Each tree's median (min-max) of ``what`` and the per-round ratio before/after."""
    for name, values in seconds.items():
        print(
            f"{name} ({revisions[name]}): {what} median {statistics.median(values):.2f} s "
            f"({min(values):.2f}-{max(values):.2f})"
        )
    ratios = [b / a for b, a in zip(seconds["before"], seconds["after"], strict=True)]
    print("before/after per round:", " ".join(f"{x:.2f}" for x in ratios))
