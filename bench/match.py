"""Moves per second of a batched self-play match (default: 64 games of a random-init `tiny`).

    .venv/bin/python bench/match.py [--checkpoint DIR] [--games 64] [--preset policy] [--max-plies 200]

All 64 games run concurrently, so each step is one batched Allie call over every live game.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    import jax
    from flax import nnx

    from allie_jax.engine import Allie
    from allie_jax.engine.match import MatchConfig, parse_spec, run_match
    from allie_jax.model import AllieModel, ModelConfig

    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default=None, help="default: random-init tiny")
    p.add_argument("--games", type=int, default=64)
    p.add_argument("--preset", default="policy")
    p.add_argument("--max-plies", type=int, default=200)
    p.add_argument("--tc", default="180+2")
    args = p.parse_args()
    allie = (
        Allie.load(args.checkpoint)
        if args.checkpoint
        else Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    )
    spec = parse_spec(f"allie:{args.checkpoint or 'tiny'}:{args.preset}:1500")
    cfg = MatchConfig(
        spec,
        spec,
        games=args.games,
        concurrency=args.games,
        max_plies=args.max_plies,
        time_control=args.tc,
    )
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        r = run_match(cfg, output=os.path.join(tmp, "bench.pgn"), allie_loader=lambda _: allie)
        wall = time.perf_counter() - t
    print(f"device: {jax.devices()[0].platform}; games: {args.games}; preset: {args.preset}")
    print(
        f"plies: {r.plies}; wall: {wall:.1f} s (includes compilation); "
        f"moves/s: {r.plies / wall:.1f}; batched Allie calls: {r.allie_calls}"
    )
    print(f"terminations: {dict(r.terminations)}")


if __name__ == "__main__":
    main()
