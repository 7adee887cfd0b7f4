"""Search throughput: the batched KV-cached search against the released design.

Ours: ``Searcher.run`` on B real positions at once (one new token per simulation, root prefix
from the cache). Baseline (the released code's design): a Python MCTS, one game at a time, whose
every leaf evaluation runs the model on the whole sequence root prefix + path, no cache
(``reference.ReferenceMCTS`` + ``FullSequenceEvaluator``, jitted forward on bucketed lengths).

    .venv/bin/python bench/search.py                       # small default set (a few minutes, CPU)
    .venv/bin/python bench/search.py --model allie_124m --batches 1 32 256 --plies 30 80 150

Prints simulations/s and moves/s for each (preset, ply, batch), the baseline's, their ratio,
and the tokens computed per simulation by each design.
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
SAMPLE = REPO / "data" / "sample" / "lichess_sample.pgn.zst"


def positions(ply: int, count: int):
    """``count`` real games cut after ``ply`` plies (only games that go on past that ply)."""
    out = []
    for game in read_games(str(SAMPLE)):
        if len(game.moves) > ply + 1:
            out.append(dataclasses.replace(game, moves=game.moves[:ply]))
            if len(out) == count:
                return out
    raise SystemExit(f"only {len(out)} sample games reach ply {ply + 1}; asked for {count}")


def make_forward(model):
    graphdef, params = nnx.split(model)

    @functools.partial(jax.jit, static_argnames=("graphdef",))
    def fwd(graphdef, params, tokens, last):
        out = nnx.merge(graphdef, params)(tokens)
        return out.policy_logits[0, last], out.value[0, last]

    def forward(tokens):
        n = len(tokens)
        width = max(16, 1 << (n - 1).bit_length())
        padded = np.full((1, width), vocab.PAD, np.int32)
        padded[0, :n] = tokens
        logits, value = fwd(graphdef, params, jnp.asarray(padded), n - 1)
        return np.asarray(logits), float(value)

    return forward


def bench_ours(model, config, games, repeat):
    searcher = Searcher(model, config)
    searcher.run(games, 0)  # compile
    times, sims = [], 0
    for r in range(repeat):
        searcher.forget()  # a cold root each time: the prefill is part of the cost
        t = time.perf_counter()
        out = searcher.run(games, r + 1)
        times.append(time.perf_counter() - t)
        sims = int(out.num_sims.sum())
    best = min(times)
    prefix = sum(len(encode_game(g, partial=True).tokens) for g in games)
    return sims / best, len(games) / best, (sims + prefix) / max(sims, 1)


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
        for n in sorted({len(root) + d for d in range(0, 12)}):  # compile the likely buckets
            forward(list(range(n)))
        t = time.perf_counter()
        mcts.run(board, sims)
        total_t += time.perf_counter() - t
        total_sims += sims
        tokens += ev.tokens_computed
        evals += mcts.evaluations
        if total_t > budget_s:
            break
    return total_sims / total_t, tokens / max(evals, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="allie_124m")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--plies", type=int, nargs="+", default=[30, 80])
    p.add_argument("--presets", nargs="+", default=["search", "adaptive"])
    p.add_argument("--mean-sims", type=int, default=50)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--baseline-seconds", type=float, default=20.0)
    args = p.parse_args()

    model = AllieModel(ModelConfig.named(args.model, dropout=0.0), rngs=nnx.Rngs(0))
    print(
        f"model {args.model} (random init), {jax.devices()[0].device_kind}, {platform.processor() or platform.machine()}"
    )
    header = f"{'preset':>9} {'ply':>4} {'B':>4} {'sims/s':>9} {'moves/s':>8} {'base sims/s':>11} {'ratio':>7} {'tok/sim ours':>12} {'tok/sim base':>12}"
    print(header)
    for ply in args.plies:
        base_games = positions(ply, 4)
        base_rate, base_tok = bench_baseline(
            model, base_games, args.mean_sims, args.baseline_seconds
        )
        for preset in args.presets:
            cfg = SearchConfig(mode=preset, mean_sims=args.mean_sims)
            for b in args.batches:
                games = positions(ply, b)
                rate, mps, tok = bench_ours(model, cfg, games, args.repeat)
                print(
                    f"{preset:>9} {ply:>4} {b:>4} {rate:>9.1f} {mps:>8.2f} {base_rate:>11.1f} "
                    f"{rate / base_rate:>6.1f}x {tok:>12.2f} {base_tok:>12.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
