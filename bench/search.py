"""Search throughput: the batched KV-cached search against the released design.

Ours: ``Searcher.run`` on B real positions at once (one new token per simulation, root prefix
from the cache, prefill of the whole prefix included: the cache is cleared before every run).
Baseline (the released code's design): a Python MCTS, one game at a time, whose every leaf
evaluation runs the model on the whole sequence root prefix + path, no cache
(``reference.ReferenceMCTS`` + ``FullSequenceEvaluator``, jitted forward on lengths rounded up
to a multiple of 16). It does not batch, so it is measured at batch 1 per ply.

    .venv/bin/python bench/search.py                 # the default grid (~10 min on 2 CPU cores)
    .venv/bin/python bench/search.py --full          # every size at plies 30/80/150 (~20 min)
    .venv/bin/python bench/search.py --sizes allie_124m --batches allie_124m=1,32,256

Sizes: ``small`` is the 4-layer width-256 (8 heads) shape the issue quotes for the released code;
any ``ModelConfig.named`` name works too (random init: speed does not depend on the weights,
but the adaptive budgets come from the random time head). Timings: the first run of each
(preset, batch, ply) compiles and is not timed; then the best of ``--repeat`` runs.

Positions: the sample games (``data/sample``) cut at the given ply; only 33 sample games reach
ply 151, so a batch larger than the number of distinct positions repeats them (as different
games: nothing is shared between rows). sims/s counts real simulations (the sum of budgets).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
import platform
import time

import chess
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import vocab
from allie_jax.game import encode_game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import read_games
from allie_jax.search import SearchConfig, Searcher
from allie_jax.search.reference import FullSequenceEvaluator, ReferenceMCTS

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = [
    REPO / "data" / "sample" / "lichess_sample.pgn.zst",
    REPO / "data" / "sample" / "lichess_arenas_sample_noclk.pgn.zst",
]
SIZES = {"small": dict(num_layers=4, embed_dim=256, num_heads=8, max_len=1024)}
DEFAULT_BATCHES = {"small": (1, 32, 256), "allie_124m": (1, 32)}
ALL_PLIES = (30, 80, 150)
# the default run (~10 min on 2 CPU cores): the small model at ply 30 only; --full: every ply
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


def bench_ours(model, config, games, repeat):
    searcher = Searcher(model, config)
    searcher.run(games, 0)  # compile (not timed)
    times, sims = [], 0
    for r in range(repeat):
        searcher.forget()  # a cold root each time: the prefill is part of the cost
        t = time.perf_counter()
        out = searcher.run(games, r + 1)
        times.append(time.perf_counter() - t)
        sims = int(out.num_sims.sum())
    best = min(times)
    prefix = sum(len(encode_game(g, partial=True).tokens) for g in games)
    return {
        "sims_s": sims / best,
        "moves_s": len(games) / best,
        "tok_sim": (sims + prefix) / max(sims, 1),
        "mean_sims": sims / len(games),
        "max_sims": int(out.num_sims.max()),
    }


def bench_baseline(model, games, sims, budget_s):
    forward = make_forward(model)
    total_sims, total_t, tokens, evals = 0, 0.0, 0, 0
    for game in games:
        board = chess.Board()
        for m in game.moves:
            board.push_uci(m)
        root = encode_game(game, partial=True).tokens.tolist()
        ev = FullSequenceEvaluator(forward, root, board.turn == chess.WHITE)
        mcts = ReferenceMCTS(ev)
        for n in sorted({-(-(len(root) + d) // 16) * 16 for d in range(0, 12)}):
            forward(list(range(n)))  # compile the likely widths (not timed)
        t = time.perf_counter()
        mcts.run(board, sims)
        total_t += time.perf_counter() - t
        total_sims += sims
        tokens += ev.tokens_computed
        evals += mcts.evaluations
        if total_t > budget_s:
            break
    return total_sims / total_t, tokens / max(evals, 1)


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
    p.add_argument("--sizes", default="small,allie_124m", help="comma-separated model sizes")
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
    p.add_argument("--presets", nargs="+", default=["search", "adaptive"])
    p.add_argument("--mean-sims", type=int, default=50)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--baseline-games", type=int, default=3)
    p.add_argument("--baseline-seconds", type=float, default=15.0)
    args = p.parse_args()
    sizes = args.sizes.split(",")
    batches = _batches(args.batches, sizes)
    if args.plies:
        plies = {s: tuple(args.plies) for s in sizes}
    else:
        plies = {s: ALL_PLIES if args.full else DEFAULT_PLIES.get(s, ALL_PLIES) for s in sizes}

    print(
        f"{jax.devices()[0].device_kind}, {platform.machine()}, {jax.device_count()} device(s), "
        f"float32, {args.mean_sims} sims (search) / mean {args.mean_sims} (adaptive)"
    )
    header = (
        f"{'size':>10} {'preset':>8} {'ply':>4} {'B':>4} {'sims/s':>8} {'moves/s':>8} "
        f"{'sims/mv':>7} {'base s/s':>8} {'ratio':>7} {'tok/sim':>7} {'base tok':>8} {'bound':>6}"
    )
    for size in sizes:
        model = AllieModel(model_config(size), rngs=nnx.Rngs(0))
        print(f"\nmodel {size} (random init)\n{header}", flush=True)
        for ply in plies[size]:
            base_games, _ = positions(ply, args.baseline_games)
            base_rate, base_tok = bench_baseline(
                model, base_games, args.mean_sims, args.baseline_seconds
            )
            print(
                f"{size:>10} {'baseline':>8} {ply:>4} {1:>4} {base_rate:>8.1f} "
                f"{base_rate / args.mean_sims:>8.3f} {args.mean_sims:>7} {'':>8} {'':>7} "
                f"{base_tok:>7.1f}",
                flush=True,
            )
            for preset in args.presets:
                cfg = SearchConfig(mode=preset, mean_sims=args.mean_sims)
                for b in batches[size]:
                    games, distinct = positions(ply, b)
                    r = bench_ours(model, cfg, games, args.repeat)
                    note = "" if distinct == b else f"  ({distinct} distinct positions)"
                    print(
                        f"{size:>10} {preset:>8} {ply:>4} {b:>4} {r['sims_s']:>8.1f} "
                        f"{r['moves_s']:>8.2f} {r['mean_sims']:>7.1f} {base_rate:>8.1f} "
                        f"{r['sims_s'] / base_rate:>6.1f}x {r['tok_sim']:>7.2f} {base_tok:>8.1f} "
                        f"{base_tok / r['tok_sim']:>5.0f}x{note}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
