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
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from allie_jax import vocab  # noqa: E402
from allie_jax.game import encode_game  # noqa: E402
from allie_jax.model import AllieModel, ModelConfig  # noqa: E402
from allie_jax.pgn import read_games  # noqa: E402
from allie_jax.search import SearchConfig, Searcher  # noqa: E402
from allie_jax.search.reference import FullSequenceEvaluator, ReferenceMCTS  # noqa: E402

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
    graphdef, params = nnx.split(model)

    @functools.partial(jax.jit, static_argnames=("graphdef",))
    def fwd(graphdef, params, tokens, last):
        out = nnx.merge(graphdef, params)(tokens)
        return out.policy_logits[0, last], out.value[0, last]

    def forward(tokens):
        n = len(tokens)
        width = -(-n // 16) * 16
        padded = np.full((1, width), vocab.PAD, np.int32)
        padded[0, :n] = tokens
        logits, value = fwd(graphdef, params, jnp.asarray(padded), n - 1)
        return np.asarray(logits), float(value)

    return forward


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
    args = p.parse_args()
    sizes = args.sizes.split(",")
    batches = _batches(args.batches, sizes)
    if args.plies:
        plies = {s: tuple(args.plies) for s in sizes}
    else:
        plies = {s: ALL_PLIES if args.full else DEFAULT_PLIES.get(s, ALL_PLIES) for s in sizes}

    print(
        f"{jax.devices()[0].device_kind}, {platform.machine()}, {jax.device_count()} device(s), "
        f"{os.cpu_count()} cpus, float32, {args.mean_sims} sims (search, gumbel) / mean "
        f"{args.mean_sims} (adaptive), {args.rounds} interleaved rounds, load {load1():.1f}, "
        f"host malloc {'kept (allie_jax.host_memory)' if HOST_MALLOC else 'glibc default'}"
    )
    header = (
        f"{'size':>10} {'preset':>15} {'ply':>4} {'B':>4} {'sims/s':>8} {'moves/s':>8} "
        f"{'sims/mv':>7} {'base s/s':>8} {'ratio':>6} {'(min-max)':>12} {'tok/sim':>7} "
        f"{'base tok':>8} {'load':>9}"
    )
    for size in sizes:
        model = AllieModel(model_config(size), rngs=nnx.Rngs(0))
        print(f"\nmodel {size} (random init)\n{header}", flush=True)
        for ply in plies[size]:
            load_start = load1()
            base_games, _ = positions(ply, args.baseline_games)
            baseline = Baseline(model, base_games, args.mean_sims)
            runs = {}
            for preset in args.presets:
                cfg = SearchConfig(mode=preset, mean_sims=args.mean_sims)
                for b in batches[size]:
                    games, distinct = positions(ply, b)
                    runs[preset, b] = (Ours(model, cfg, games), distinct)
            for r in range(args.rounds):
                baseline.round(r)
                for ours, _ in runs.values():
                    ours.round(r)
            load_end = load1()
            base = np.array(baseline.rates)
            base_tok = baseline.tokens / max(baseline.evals, 1)
            print(
                f"{size:>10} {'baseline':>15} {ply:>4} {1:>4} {np.median(base):>8.1f} "
                f"{np.median(base) / args.mean_sims:>8.3f} {args.mean_sims:>7} {'':>8} {'':>6} "
                f"{f'{base.min():.0f}-{base.max():.0f}':>12} {'':>7} {base_tok:>8.1f} "
                f"{load_start:>4.1f}-{load_end:<4.1f}",
                flush=True,
            )
            for (preset, b), (ours, distinct) in runs.items():
                rates = np.array(ours.rates)
                ratios = rates / base
                note = "" if distinct == b else f"  ({distinct} distinct positions)"
                print(
                    f"{size:>10} {preset:>15} {ply:>4} {b:>4} {np.median(rates):>8.1f} "
                    f"{np.median(rates) * len(ours.games) / max(ours.sims, 1):>8.2f} "
                    f"{ours.sims / len(ours.games):>7.1f} {np.median(base):>8.1f} "
                    f"{np.median(ratios):>5.1f}x {f'{ratios.min():.1f}-{ratios.max():.1f}':>12} "
                    f"{ours.tok_sim():>7.2f} {base_tok:>8.1f} "
                    f"{load_start:>4.1f}-{load_end:<4.1f}{note}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
