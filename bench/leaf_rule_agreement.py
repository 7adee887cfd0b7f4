"""K leaves per step under each pending-leaf rule (``SearchConfig.virtual_loss``) against the
one-leaf search: how often the moves agree on real positions, and sims/s at batch 1.

Agreement (default): ``--positions`` real positions (the sample games cut at plies 10, 12, ..,
60 in turn), preset ``search`` with ``--sims`` simulations and π̄, on Maia-1500 (real weights,
``--maia_dir``) and, with ``--decoder``, a decoder checkpoint. Two one-leaf searches with seeds 0
and 1 give, per position, the exact probability that moves drawn from their final policies agree,
sum(π₁ · π₁'); each K-leaf search with seed 2 gives sum(π_K · π₁). A row reports both means, the
mean of the per-position difference with its standard error (the positions are the pairing),
and how often the most visited move, and π̄'s most probable move, equal the one-leaf search's::

    flock /work/bench.lock .venv/bin/python bench/leaf_rule_agreement.py --positions 96

Speed (``--speed``): batch 1, one position at a time (plies 30 of the sample games in turn),
``--sims`` simulations, every (K, rule) timed once per round, interleaved over ``--rounds``
rounds, after one untimed run each (compile); the median sims/s with its min-max and the
1-minute load average::

    flock /work/bench.lock .venv/bin/python bench/leaf_rule_agreement.py --speed --rounds 5

Speed families: Maia-1500 and a random-weight decoder of ``--decoder_size`` (speed does not
depend on the weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allie_jax.game import Game  # noqa: E402
from allie_jax.pgn import read_games  # noqa: E402
from allie_jax.search.config import VIRTUAL_LOSSES, SearchConfig  # noqa: E402
from allie_jax.search.searcher import Searcher  # noqa: E402

SAMPLES = [
    REPO / "data" / "sample" / "lichess_sample.pgn.zst",
    REPO / "data" / "sample" / "lichess_arenas_sample_noclk.pgn.zst",
]


def load1() -> float:
    try:
        return float(pathlib.Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def positions(count: int, plies: range) -> list[Game]:
    """``count`` real positions: sample games cut at ``plies`` in turn (the cut leaves a move)."""
    games: list[Game] = []
    for path in SAMPLES:
        for game in read_games(str(path)):
            ply = plies[len(games) % len(plies)]
            if len(game.moves) > ply + 1:
                games.append(dataclasses.replace(game, moves=game.moves[:ply]))
            if len(games) == count:
                return games
    raise SystemExit(f"only {len(games)} sample games reach the plies asked for")


def searchers(family: str, args) -> object:
    """A function (K, rule) -> Searcher for ``family``."""
    if family == "maia":
        from allie_jax.baselines.maia import load_maia
        from allie_jax.baselines.maia_search import maia_searcher

        net = load_maia(pathlib.Path(args.maia_dir) / "maia-1500.pb.gz")
        return lambda k, rule: maia_searcher(net, _config(args.sims, k, rule))
    if family == "decoder":
        from allie_jax.model.checkpoint import load_model

        model = load_model(args.decoder, dropout=0.0)
    else:  # a random decoder of a named size
        from flax import nnx

        from allie_jax.model import AllieModel, ModelConfig

        model = AllieModel(ModelConfig.named(args.decoder_size, dropout=0.0), rngs=nnx.Rngs(0))
    return lambda k, rule: Searcher(model, _config(args.sims, k, rule))


def _config(sims: int, k: int, rule: str) -> SearchConfig:
    return SearchConfig.preset("search", mean_sims=sims, leaf_batch=k, virtual_loss=rule)


def agreement(family: str, args) -> None:
    make = searchers(family, args)
    games = positions(args.positions, range(10, 61, 2))
    t0, load0 = time.time(), load1()
    one = make(1, "loss").run(games, 0)
    again = make(1, "loss").run(games, 1)
    base = (one.policy * again.policy).sum(-1)  # per position: two one-leaf draws agree
    print(
        f"{family}: {len(games)} positions (plies 10..60), {args.sims} sims, pi-bar; "
        f"two K=1 seeds {base.mean():.4f} (policies equal: "
        f"{bool(np.array_equal(one.policy, again.policy))})",
        flush=True,
    )
    print(
        f"{'rule':>6} {'K':>3} {'two K=1':>8} {'K vs K=1':>9} {'diff':>8} {'se':>7} "
        f"{'top visits':>10} {'top pi':>7}",
        flush=True,
    )
    for rule in args.rules:
        for k in args.leaf_batches:
            out = make(k, rule).run(games, 2)
            assert (out.visit_counts.sum(-1) == out.num_sims).all()
            across = (out.policy * one.policy).sum(-1)
            d = across - base
            se = d.std(ddof=1) / np.sqrt(len(d))
            top_v = (out.visit_counts.argmax(-1) == one.visit_counts.argmax(-1)).mean()
            top_p = (out.policy.argmax(-1) == one.policy.argmax(-1)).mean()
            print(
                f"{rule:>6} {k:>3} {base.mean():>8.4f} {across.mean():>9.4f} {d.mean():>+8.4f} "
                f"{se:>7.4f} {top_v:>10.3f} {top_p:>7.3f}",
                flush=True,
            )
    print(f"{family}: {time.time() - t0:.0f} s, load {load0:.1f} -> {load1():.1f}", flush=True)


def speed(family: str, args) -> None:
    make = searchers(family, args)
    games = positions(args.rounds, range(30, 31))
    cases = [(1, "loss")] + [(k, r) for k in args.leaf_batches for r in args.rules]
    runs = {case: make(*case) for case in cases}
    for s in runs.values():
        s.run(games[:1], 0)  # compile (not timed)
    rates: dict = {case: [] for case in cases}
    load0 = load1()
    for r, game in enumerate(games):
        for case, s in runs.items():
            s.forget()
            t = time.perf_counter()
            out = s.run([game], r)
            rates[case].append(int(out.num_sims.sum()) / (time.perf_counter() - t))
    load = f"{load0:.1f}-{load1():.1f}"
    print(f"{family}, batch 1, {args.sims} sims, ply 30, {args.rounds} rounds", flush=True)
    print(f"{'K':>3} {'rule':>6} {'sims/s':>8} {'(min-max)':>15} {'load':>9}", flush=True)
    for (k, rule), v in rates.items():
        print(
            f"{k:>3} {rule if k > 1 else '-':>6} {np.median(v):>8.1f} {min(v):>7.1f}-{max(v):<7.1f} {load:>9}",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--families", nargs="+", default=None, help="maia, decoder, random")
    p.add_argument("--maia_dir", default=os.environ.get("MAIA_DIR", "/work/shared/models/maia1"))
    p.add_argument("--decoder", default=None, help="a decoder checkpoint (workdir or model dir)")
    p.add_argument(
        "--decoder_size", default="allie_124m", help="--speed: the random decoder's size"
    )
    p.add_argument("--positions", type=int, default=96)
    p.add_argument("--sims", type=int, default=64)
    p.add_argument("--leaf-batches", type=int, nargs="+", default=None)
    p.add_argument("--rules", nargs="+", default=list(VIRTUAL_LOSSES), choices=VIRTUAL_LOSSES)
    p.add_argument("--speed", action="store_true", help="sims/s at batch 1 instead")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.speed:
        args.leaf_batches = args.leaf_batches or [8, 16]
        for family in args.families or ["maia", "random"]:
            speed(family, args)
        return
    args.leaf_batches = args.leaf_batches or [2, 4, 8, 16]
    families = args.families or (["maia"] + (["decoder"] if args.decoder else []))
    for family in families:
        agreement(family, args)


if __name__ == "__main__":
    main()
