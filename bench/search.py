"""Search throughput against the released design, interleaved so the ratio survives a busy machine.

Ours: ``Searcher.run`` on B real positions at once (one new token per simulation, root prefix
from the cache, prefill of the whole prefix included: the cache is cleared before every run).
Baseline (the released code's design): a Python MCTS, one game at a time, whose every leaf
evaluation runs the model on the whole sequence root prefix + path, no cache
(``reference.ReferenceMCTS`` + ``FullSequenceEvaluator``, jitted forward on lengths rounded up
to a multiple of 16). It does not batch, so it is measured at batch 1 per ply.

Interleaving: for each (size, ply) every shape is compiled first (not timed); then ``--rounds``
rounds, each timing the baseline on one game (``mean_sims`` simulations; a different position per
round) and then every (preset, batch) of ours: A B1 B2 ... A B1 B2 ... Each round gives a ratio
(ours sims/s over that round's baseline sims/s); a row reports the median ratio with its min-max
over the rounds, and the load average (``/proc/loadavg``, 1 min) at the row's start and end.

    .venv/bin/python bench/search.py                 # small model, ply 30, search/adaptive/gumbel
    .venv/bin/python bench/search.py --full          # every size at plies 30/80/150
    .venv/bin/python bench/search.py --sizes allie_124m --batches allie_124m=1,32 --rounds 5

Sizes: ``small`` is the 4-layer width-256 (8 heads) shape the issue quotes for the released code;
any ``ModelConfig.named`` name works too (random init: speed does not depend on the weights,
but the adaptive budgets come from the random time head). Gumbel presets are compared with the
same pUCT baseline (both count simulations; a Gumbel simulation costs the same model work).

Agreement (``--agreement``): does a search with K leaves per step (``leaf_batch``) choose the
moves a one-leaf search of the same budget chooses? On ``--positions`` real positions (sample
games cut at plies 10..60), preset ``search`` with ``--mean-sims`` simulations: the move drawn
by a K = 1 search with seed 1 against one drawn by a K = 1 search with seed 2 (the same tree,
two draws from its final policy: the agreement a seed alone allows), and against one drawn by
the K search with seed 3; also the exact expectations sum(pi_1 * pi_1) and sum(pi_1 * pi_K) and
how often the most probable moves agree, with the K search's speed-up at that batch::

    .venv/bin/python bench/search.py --agreement demo_out/workdir --leaf-batches 4 8 16

(``--virtual-loss loss|visit``: the K searches' pending-leaf rule, default SearchConfig's.)

Positions: the sample games (``data/sample``) cut at the given ply; only 33 sample games reach
ply 151, so a batch larger than the number of distinct positions repeats them (as different
games: nothing is shared between rows). sims/s counts real simulations (the sum of budgets).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pathlib
import platform
import time

from allie_jax.host_memory import keep_freed_host_memory

# before JAX starts, as launch.uci / match / evaluate do (both sides of every ratio share it);
# ALLIE_JAX_HOST_MALLOC=system measures with glibc's defaults
HOST_MALLOC = keep_freed_host_memory()

import chess  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from allie_jax.game import encode_game  # noqa: E402
from allie_jax.model import AllieModel, ModelConfig  # noqa: E402
from allie_jax.pgn import read_games  # noqa: E402
from allie_jax.search import SearchConfig, Searcher  # noqa: E402
from allie_jax.search.reference import (  # noqa: E402
    FullSequenceEvaluator,
    ReferenceMCTS,
    whole_sequence_forward,
)

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = [
    REPO / "data" / "sample" / "lichess_sample.pgn.zst",
    REPO / "data" / "sample" / "lichess_arenas_sample_noclk.pgn.zst",
]
SIZES = {"small": dict(num_layers=4, embed_dim=256, num_heads=8, max_len=1024)}
DEFAULT_BATCHES = {"small": (1, 32, 256), "allie_124m": (1, 32)}
ALL_PLIES = (30, 80, 150)
# the default run: the small model at ply 30 only; --full: every ply
DEFAULT_PLIES = {"small": (30,), "allie_124m": ALL_PLIES}


@functools.cache
def _games_reaching(ply: int) -> tuple:
    out = []
    for path in SAMPLES:
        for game in read_games(str(path)):
            if len(game.moves) > ply + 1:
                out.append(dataclasses.replace(game, moves=game.moves[:ply]))
    if not out:
        raise SystemExit(f"no sample game reaches ply {ply + 1}")
    return tuple(out)


def positions(ply: int, count: int) -> tuple[list, int]:
    """``count`` real positions after ``ply`` plies, and how many of them are distinct."""
    games = _games_reaching(ply)
    picked = [
        dataclasses.replace(games[i % len(games)], game_id=f"bench-{ply}-{i}") for i in range(count)
    ]
    return picked, min(count, len(games))


def model_config(size: str) -> ModelConfig:
    if size in SIZES:
        return ModelConfig(**SIZES[size], dropout=0.0)
    return ModelConfig.named(size, dropout=0.0)


def make_forward(model):
    """The baseline's model call: the whole sequence, last position's policy and value."""
    return whole_sequence_forward(model)


class Ours:
    """One (preset, batch) of ours: compiled at construction, then timed per round."""

    def __init__(self, model, config: SearchConfig, games: list):
        self.searcher = Searcher(model, config)
        self.games = games
        self.searcher.run(games, 0)  # compile (not timed)
        self.rates: list[float] = []
        self.sims = 0

    def round(self, r: int) -> float:
        self.searcher.forget()  # a cold root each time: the prefill is part of the cost
        t = time.perf_counter()
        out = self.searcher.run(self.games, r + 1)
        elapsed = time.perf_counter() - t
        self.sims = int(out.num_sims.sum())
        self.max_sims = int(out.num_sims.max())
        self.rates.append(self.sims / elapsed)
        return self.rates[-1]

    def tok_sim(self) -> float:
        prefix = sum(len(encode_game(g, partial=True).tokens) for g in self.games)
        return (self.sims + prefix) / max(self.sims, 1)


class Baseline:
    """The released design on one game per round (compiled for the likely widths first)."""

    def __init__(self, model, games: list, sims: int):
        self.forward = make_forward(model)
        self.games, self.sims = games, sims
        self.rates: list[float] = []
        self.tokens = self.evals = 0
        for game in games:
            root = len(encode_game(game, partial=True).tokens)
            for n in sorted({-(-(root + d) // 16) * 16 for d in range(0, 12)}):
                self.forward(list(range(n)))  # compile the likely widths (not timed)

    def round(self, r: int) -> float:
        game = self.games[r % len(self.games)]
        board = chess.Board()
        for m in game.moves:
            board.push_uci(m)
        root = encode_game(game, partial=True).tokens.tolist()
        ev = FullSequenceEvaluator(self.forward, root, board.turn == chess.WHITE)
        mcts = ReferenceMCTS(ev)
        t = time.perf_counter()
        mcts.run(board, self.sims)
        self.rates.append(self.sims / (time.perf_counter() - t))
        self.tokens += ev.tokens_computed
        self.evals += mcts.evaluations
        return self.rates[-1]


def load1() -> float:
    try:
        return float(pathlib.Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def _batches(spec: list[str], sizes: list[str]) -> dict[str, tuple[int, ...]]:
    out = {s: DEFAULT_BATCHES.get(s, (1, 32)) for s in sizes}
    for item in spec:
        name, _, values = item.rpartition("=")
        targets = [name] if name else sizes
        for s in targets:
            out[s] = tuple(int(v) for v in values.split(","))
    return out


def agreement_positions(count: int) -> list:
    """``count`` real positions: sample games cut at plies 10, 12, ..., 60 in turn."""
    games = []
    plies = range(10, 61, 2)
    for path in SAMPLES:
        for game in read_games(str(path)):
            ply = plies[len(games) % len(plies)]
            if len(game.moves) > ply + 1:
                cut = dataclasses.replace(
                    game, moves=game.moves[:ply], game_id=f"agree-{len(games)}"
                )
                games.append(cut)
            if len(games) == count:
                return games
    return games


def agreement(
    model,
    games: list,
    leaf_batches: list[int],
    sims: int,
    draws: int = 64,
    virtual_loss: str | None = None,
) -> None:
    """Print the agreement of K-leaf searches with one-leaf searches (module docstring).

    The engine draws its move from the final policy (``SearchOutput.policy``); ``draws`` moves
    per search are drawn from it here with the search's seed, so the rates are smooth.
    ``virtual_loss``: the K-leaf searches' pending-leaf rule (None: SearchConfig's default;
    bench/leaf_rule_agreement.py compares the rules with per-position standard errors).
    """
    rule = {} if virtual_loss is None else {"virtual_loss": virtual_loss}

    def run(k: int, seed: int):
        config = SearchConfig(mode="search", mean_sims=sims, leaf_batch=k, **rule)
        searcher = Searcher(model, config)
        searcher.run(games, 0)  # compile (not timed)
        searcher.forget()
        t = time.perf_counter()
        out = searcher.run(games, seed)
        rate = int(out.num_sims.sum()) / (time.perf_counter() - t)
        rng = np.random.default_rng(seed)
        policy = out.policy.astype(np.float64)
        policy /= policy.sum(-1, keepdims=True)
        moves = np.stack([rng.choice(len(p), size=draws, p=p) for p in policy])
        return out.policy, moves, rate

    base_policy, base_moves, base_rate = run(1, 1)
    _, other_moves, _ = run(1, 2)
    same = float((base_moves == other_moves).mean())
    expected = float((base_policy * base_policy).sum(-1).mean())
    top = base_policy.argmax(-1)
    print(
        f"{len(games)} positions, {sims} sims, {draws} draws per search; load {load1():.1f}\n"
        f"{'K':>3} {'drawn=K1':>9} {'E[agree]':>9} {'top=K1':>7} {'sims/s':>8} {'speed-up':>8}\n"
        f"{1:>3} {same:>9.3f} {expected:>9.3f} {1.0:>7.3f} {base_rate:>8.1f} {1.0:>7.2f}x",
        flush=True,
    )
    for k in leaf_batches:
        policy, moves, rate = run(k, 3)
        print(
            f"{k:>3} {float((moves == base_moves).mean()):>9.3f} "
            f"{float((policy * base_policy).sum(-1).mean()):>9.3f} "
            f"{float((policy.argmax(-1) == top).mean()):>7.3f} {rate:>8.1f} "
            f"{rate / base_rate:>7.2f}x",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="small", help="comma-separated model sizes")
    p.add_argument(
        "--batches",
        nargs="*",
        default=[],
        help="SIZE=1,32,256 (or 1,32 for every size); default small=1,32,256 allie_124m=1,32",
    )
    p.add_argument(
        "--plies",
        type=int,
        nargs="+",
        default=None,
        help="plies for every size; default small=30, allie_124m=30 80 150 (--full: 30 80 150)",
    )
    p.add_argument("--full", action="store_true", help="every size at plies 30, 80 and 150")
    p.add_argument("--presets", nargs="+", default=["search", "adaptive", "gumbel"])
    p.add_argument("--mean-sims", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5, help="ABAB rounds (at least 5 for a figure)")
    p.add_argument("--baseline-games", type=int, default=5, help="positions the baseline cycles")
    p.add_argument(
        "--agreement",
        metavar="MODEL",
        help="a checkpoint (workdir or model dir) or a size: print the leaf_batch agreement only",
    )
    p.add_argument(
        "--leaf-batches",
        type=int,
        nargs="+",
        default=None,
        help="leaf_batch values K of ours (each a row; default 1), or those compared with K = 1 "
        "by --agreement (default 8)",
    )
    p.add_argument("--dtype", default="float32", help="compute dtype of ours and the baseline")
    p.add_argument("--positions", type=int, default=64, help="positions for --agreement")
    p.add_argument(
        "--virtual-loss",
        default=None,
        help="--agreement: the K-leaf searches' SearchConfig.virtual_loss (default: its default)",
    )
    args = p.parse_args()
    if args.agreement:
        if pathlib.Path(args.agreement).exists():
            from allie_jax.model.checkpoint import load_model

            model = load_model(args.agreement, dropout=0.0)
        else:
            model = AllieModel(model_config(args.agreement), rngs=nnx.Rngs(0))
        games = agreement_positions(args.positions)
        agreement(
            model,
            games,
            args.leaf_batches or [8],
            args.mean_sims,
            virtual_loss=args.virtual_loss,
        )
        return
    leaf_batches = args.leaf_batches or [1]
    sizes = args.sizes.split(",")
    batches = _batches(args.batches, sizes)
    if args.plies:
        plies = {s: tuple(args.plies) for s in sizes}
    else:
        plies = {s: ALL_PLIES if args.full else DEFAULT_PLIES.get(s, ALL_PLIES) for s in sizes}

    print(
        f"{jax.devices()[0].device_kind}, {platform.machine()}, {jax.device_count()} device(s), "
        f"{os.cpu_count()} cpus, {args.dtype}, {args.mean_sims} sims (search, gumbel) / mean "
        f"{args.mean_sims} (adaptive), {args.rounds} interleaved rounds, load {load1():.1f}, "
        f"host malloc {'kept (allie_jax.host_memory)' if HOST_MALLOC else 'glibc default'}"
    )
    header = (
        f"{'size':>10} {'preset':>15} {'ply':>4} {'B':>4} {'K':>3} {'sims/s':>8} {'moves/s':>8} "
        f"{'sims/mv':>7} {'base s/s':>8} {'ratio':>6} {'(min-max)':>12} {'tok/sim':>7} "
        f"{'base tok':>8} {'load':>9}"
    )
    for size in sizes:
        config = dataclasses.replace(model_config(size), dtype=args.dtype)
        model = AllieModel(config, rngs=nnx.Rngs(0))
        print(f"\nmodel {size} (random init)\n{header}", flush=True)
        for ply in plies[size]:
            load_start = load1()
            base_games, _ = positions(ply, args.baseline_games)
            baseline = Baseline(model, base_games, args.mean_sims)
            runs = {}
            for preset in args.presets:
                for b in batches[size]:
                    for k in leaf_batches:
                        cfg = SearchConfig(mode=preset, mean_sims=args.mean_sims, leaf_batch=k)
                        games, distinct = positions(ply, b)
                        runs[preset, b, k] = (Ours(model, cfg, games), distinct)
            for r in range(args.rounds):
                baseline.round(r)
                for ours, _ in runs.values():
                    ours.round(r)
            load_end = load1()
            base = np.array(baseline.rates)
            base_tok = baseline.tokens / max(baseline.evals, 1)
            print(
                f"{size:>10} {'baseline':>15} {ply:>4} {1:>4} {1:>3} {np.median(base):>8.1f} "
                f"{np.median(base) / args.mean_sims:>8.3f} {args.mean_sims:>7} {'':>8} {'':>6} "
                f"{f'{base.min():.0f}-{base.max():.0f}':>12} {'':>7} {base_tok:>8.1f} "
                f"{load_start:>4.1f}-{load_end:<4.1f}",
                flush=True,
            )
            for (preset, b, k), (ours, distinct) in runs.items():
                rates = np.array(ours.rates)
                ratios = rates / base
                note = "" if distinct == b else f"  ({distinct} distinct positions)"
                print(
                    f"{size:>10} {preset:>15} {ply:>4} {b:>4} {k:>3} {np.median(rates):>8.1f} "
                    f"{np.median(rates) * len(ours.games) / max(ours.sims, 1):>8.2f} "
                    f"{ours.sims / len(ours.games):>7.1f} {np.median(base):>8.1f} "
                    f"{np.median(ratios):>5.1f}x {f'{ratios.min():.1f}-{ratios.max():.1f}':>12} "
                    f"{ours.tok_sim():>7.2f} {base_tok:>8.1f} "
                    f"{load_start:>4.1f}-{load_end:<4.1f}{note}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
