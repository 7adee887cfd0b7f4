"""Model figures: parameter counts, forward tokens/s, and what the KV cache saves for search.

    .venv/bin/python bench/model.py [--sizes tiny,allie_124m] [--batch 8] [--seq 512] [--reps 3]

Forward speed is one causal pass over ``batch × seq`` tokens. The cache figure is the cost of
adding 8 tokens after a 400-token prefix: extending the KV cache versus recomputing the whole
408-token pass (what a search simulation would cost without the cache); the ratio is measured in
the same run on the same machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax.model import NAMED_SIZES, AllieModel, ModelConfig, count_params


def _time(fn, reps: int) -> float:
    jax.block_until_ready(fn())  # compile + warm up
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return best


def _tokens(rng: np.random.Generator, batch: int, length: int) -> jnp.ndarray:
    toks = rng.integers(0, 1968, size=(batch, length)).astype(np.int32)
    toks[:, 0], toks[:, 1], toks[:, 2] = 1997 + 1500, 1997 + 1600, 1968
    return jnp.asarray(toks)


def bench_size(name: str, batch: int, seq: int, prefix: int, new: int, reps: int) -> dict:
    model = AllieModel(ModelConfig.named(name, max_len=max(seq, 512)), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    forward = nnx.jit(lambda m, t: m(t).policy_logits)

    full = _tokens(rng, batch, seq)
    t_forward = _time(lambda: forward(model, full), reps)

    game = _tokens(rng, batch, prefix + new)
    extend = nnx.jit(lambda m, t, c: m.extend(t, c)[0].policy_logits)
    cache = model.init_cache(batch, max_len=512)
    _, cache = nnx.jit(lambda m, t, c: m.extend(t, c))(model, game[:, :prefix], cache)
    t_cached = _time(lambda: extend(model, game[:, prefix:], cache), reps)
    t_recompute = _time(lambda: forward(model, game), reps)
    return {
        "name": name,
        "forward_tok_s": batch * seq / t_forward,
        "cached_tok_s": batch * new / t_cached,
        "recompute_tok_s": batch * new / t_recompute,
        "speedup": t_recompute / t_cached,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,allie_124m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--prefix", type=int, default=400)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, backend {jax.default_backend()}, "
        f"devices {jax.devices()}"
    )
    print("\nparameters (1,997-token vocabulary):")
    for name in NAMED_SIZES:
        print(f"  {name:13s} {count_params(ModelConfig.named(name)) / 1e6:9.2f}M")

    print(
        f"\nforward: batch {args.batch} × {args.seq}; "
        f"cache: extend a {args.prefix}-token prefix by {args.new} tokens (batch {args.batch})"
    )
    header = f"  {'size':13s} {'forward tok/s':>14s} {'cached tok/s':>13s} {'recompute tok/s':>16s} {'speed-up':>9s}"
    print(header)
    for name in args.sizes.split(","):
        r = bench_size(name, args.batch, args.seq, args.prefix, args.new, args.reps)
        print(
            f"  {r['name']:13s} {r['forward_tok_s']:14,.0f} {r['cached_tok_s']:13,.0f} "
            f"{r['recompute_tok_s']:16,.0f} {r['speedup']:8.1f}x"
        )


if __name__ == "__main__":
    main()
