"""Search throughput per model family, this tree against an earlier revision, interleaved.

For each family (``allie``: the decoder's ``Searcher``; ``board``: ``engine.board.BoardSearcher``;
``maia``: ``baselines.maia_search.MaiaSearcher`` in ``pibar`` mode) and each batch size, B real
positions (sample games cut at ``--ply``) are searched with ``--sims`` simulations each, by the
package as it is now ("after") and by the package at ``--before`` ("before", extracted with
``git archive`` and imported as ``allie_jax_old``, so both run in one process on the same load).
Every shape is compiled first (not timed); then ``--rounds`` rounds, each timing before and after
at every batch one after the other. sims/s counts real simulations (the sum of ``num_sims``);
a row gives the median over the rounds with the min-max, the median of the per-round ratios
after/before, and the 1-minute load average over the row's rounds.

    flock /work/bench.lock .venv/bin/python bench/family_search.py --families board maia \\
        --batches 1 8 32 --rounds 5

``--leaf_batch K`` runs the "after" side with K leaves per game per step (every family takes
it; the "before" side always runs one leaf, as older revisions only could).

Models are random-initialised (speed does not depend on the weights): the `tiny` decoder (or
``--allie_size small``, ``bench/search.py``'s size; ``--preset`` picks its search preset),
`board_tiny`; Maia is read from ``--maia_dir`` (maia-1500). Run under
``flock /work/bench.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def old_package(rev: str) -> str:
    """``allie_jax`` at ``rev`` as an importable ``allie_jax_old`` package; returns its root."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="family_search_"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "allie_jax"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    (root / "allie_jax").rename(root / "allie_jax_old")
    for path in (root / "allie_jax_old").rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\ballie_jax\b", "allie_jax_old", text))
    sys.path.insert(0, str(root))
    return str(root)


def positions(ply: int, count: int):
    from allie_jax.game import Game
    from allie_jax.pgn import read_games

    games = [
        g for g in read_games(REPO / "data/sample/lichess_sample.pgn.zst") if len(g.moves) > ply
    ]
    out = []
    for g in itertools.islice(itertools.cycle(games), count):
        out.append(Game(moves=list(g.moves[:ply]), white_elo=g.white_elo, black_elo=g.black_elo))
    return out


# The decoder's sizes here: the ``tiny`` preset, or ``bench/search.py``'s ``small`` (written out,
# so revisions that predate it build the same model).
ALLIE_SIZES = {"tiny": None, "small": dict(num_layers=4, embed_dim=256, num_heads=8, max_len=1024)}


def runner(
    pkg: str,
    family: str,
    batch: int,
    sims: int,
    maia_dir: str,
    leaf_batch: int = 1,
    *,
    allie_size: str = "tiny",
    preset: str = "search",
):
    """A function ``rng -> simulations run`` searching ``batch`` positions with package ``pkg``
    (``leaf_batch`` K: leaves per game per step; 1 passes nothing, for older revisions;
    ``allie_size`` and ``preset``: the decoder's model and search preset)."""
    k = {} if leaf_batch == 1 else {"leaf_batch": leaf_batch}
    from flax import nnx

    games = positions(30, batch)
    search_config = importlib.import_module(f"{pkg}.search.config").SearchConfig
    if family == "board":
        bt = importlib.import_module(f"{pkg}.model.board_transformer")
        model = bt.BoardTransformer(bt.BoardConfig.named("board_tiny"), rngs=nnx.Rngs(0))
        searcher = importlib.import_module(f"{pkg}.engine.board").BoardSearcher(
            model, search_config.preset("search", mean_sims=sims, **k)
        )
        return lambda r: int(searcher.run(games, r).num_sims.sum())
    if family == "maia":
        import jax

        ms = importlib.import_module(f"{pkg}.baselines.maia_search")
        net = importlib.import_module(f"{pkg}.baselines.maia").load_maia(
            pathlib.Path(maia_dir) / "maia-1500.pb.gz"
        )
        searcher = ms.MaiaSearcher(
            net, ms.MaiaSearchConfig(mode="pibar", num_simulations=sims, **k), batch_size=batch
        )
        moves = [g.moves for g in games]
        return lambda r: int(searcher.run(moves, jax.random.key(r)).num_sims.sum())
    if family == "allie":
        tr = importlib.import_module(f"{pkg}.model.transformer")
        cfg = importlib.import_module(f"{pkg}.model.config").ModelConfig
        fields = ALLIE_SIZES[allie_size]
        model_config = cfg.named("tiny") if fields is None else cfg(**fields)
        model = tr.AllieModel(model_config, rngs=nnx.Rngs(0))
        searcher = importlib.import_module(f"{pkg}.search.searcher").Searcher(
            model, search_config.preset(preset, mean_sims=sims, **k)
        )

        def run(r):
            searcher.forget()
            return int(searcher.run(games, r).num_sims.sum())

        return run
    raise ValueError(f"--families: unknown family {family!r} (allie, board, maia)")


@dataclasses.dataclass
class Row:
    family: str
    batch: int
    before: list[float] = dataclasses.field(default_factory=list)
    after: list[float] = dataclasses.field(default_factory=list)
    load: list[float] = dataclasses.field(default_factory=list)


def timed(fn, r: int) -> float:
    t0 = time.perf_counter()
    n = fn(r)
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--families", nargs="+", default=["board", "maia"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--sims", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", default="5e52ade", help="git revision of the 'before' package")
    p.add_argument(
        "--leaf_batch", type=int, default=1, help="K leaves per game per step ('after' only)"
    )
    p.add_argument("--maia_dir", default=os.environ.get("MAIA_DIR", "/work/shared/models/maia1"))
    p.add_argument("--allie_size", choices=sorted(ALLIE_SIZES), default="tiny")
    p.add_argument("--preset", default="search", help="the decoder's search preset (allie only)")
    args = p.parse_args()
    if args.rounds < 1 or args.sims < 1 or min(args.batches) < 1 or args.leaf_batch < 1:
        sys.exit("--rounds, --sims, --leaf_batch and every --batches must be at least 1")
    old_package(args.before)
    rows = []
    decoder = dict(allie_size=args.allie_size, preset=args.preset)
    for family in args.families:
        for batch in args.batches:
            fns = {
                "before": runner(
                    "allie_jax_old", family, batch, args.sims, args.maia_dir, **decoder
                ),
                "after": runner(
                    "allie_jax", family, batch, args.sims, args.maia_dir, args.leaf_batch, **decoder
                ),
            }
            for fn in fns.values():
                fn(0)  # compile (not timed)
            row = Row(family, batch)
            for r in range(args.rounds):
                row.load.append(os.getloadavg()[0])
                row.before.append(timed(fns["before"], r + 1))
                row.after.append(timed(fns["after"], r + 1))
            rows.append(row)
            print(_line(row), flush=True)
    print(
        f"\nsims {args.sims}, ply 30, rounds {args.rounds}, before = {args.before}, "
        f"after leaf_batch {args.leaf_batch}"
    )
    print(HEADER)
    for row in rows:
        print(_line(row))


HEADER = (
    f"{'family':>7} {'B':>3} {'before sims/s':>22} {'after sims/s':>24} {'ratio':>18} {'load':>11}"
)


def _line(row: Row) -> str:
    def med(x):
        return f"{np.median(x):8.1f} ({min(x):.1f}-{max(x):.1f})"

    ratios = np.asarray(row.after) / np.asarray(row.before)
    return (
        f"{row.family:>7} {row.batch:>3} {med(row.before):>22} {med(row.after):>24} "
        f"{np.median(ratios):6.1f}x ({ratios.min():.1f}-{ratios.max():.1f}) "
        f"{min(row.load):4.1f}-{max(row.load):4.1f}"
    )


if __name__ == "__main__":
    main()
