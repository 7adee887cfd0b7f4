"""Throughput of allie_jax.chess_jax on this machine: replay, and one search-style step.

    python bench/chess_jax.py [--batch 256] [--plies 100]

A "step" is what one search simulation needs per game: apply a move, then the legal mask and the
game end of the new position (outcome reuses the mask).
"""

from __future__ import annotations

import argparse
import random
import time

import chess
import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import chess_jax


def random_games(n: int, plies: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = random.Random(seed)
    games = []
    for _ in range(n):
        board = chess.Board()
        while len(board.move_stack) < plies and not board.is_game_over():
            board.push(rng.choice(list(board.legal_moves)))
        games.append(chess_jax.board_to_move_ids(board))
    return chess_jax.pad_move_ids(games, plies)


def timed(fn, *args, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))  # compile
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--plies", type=int, default=100)
    args = parser.parse_args()
    ids, lengths = random_games(args.batch, args.plies)
    ids, lengths = jnp.asarray(ids), jnp.asarray(lengths)
    print(f"backend={jax.default_backend()} batch={args.batch} plies={args.plies}")

    t = timed(lambda: chess_jax.replay(ids, lengths), repeats=3)
    print(f"replay {args.batch} games x {args.plies} plies: {t * 1e3:.1f} ms")

    state = chess_jax.replay(ids, jnp.maximum(lengths - 1, 0))
    last = ids[jnp.arange(args.batch), jnp.maximum(lengths - 1, 0)]

    @jax.jit
    def step(s, m):
        s = chess_jax.apply(s, m)
        mask = chess_jax.legal_mask(s)
        done, result = chess_jax.outcome(s, mask)
        return s, mask, done, result

    t = timed(step, state, last)
    print(
        f"apply+legal_mask+outcome at batch {args.batch}: {t * 1e3:.2f} ms/step, "
        f"{args.batch / t:.0f} positions/s"
    )
    t = timed(chess_jax.legal_mask, state)
    print(f"legal_mask alone: {t * 1e3:.2f} ms/step")
    t = timed(chess_jax.apply, state, last)
    print(f"apply alone: {t * 1e3:.2f} ms/step")


if __name__ == "__main__":
    main()
