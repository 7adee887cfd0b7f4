"""The 112 lc0 input planes inside ``jax.jit``, for positions reached during a search.

A search node carries the 8 newest boards (absolute: +piece type for White, −piece for Black, lc0
square order rank·8 + file), their repetition flags and whether each is present; the side to move,
castling rights and the rule-50 count come from the node's ``ChessState``. The layout is that of
``allie_jax.baselines.lc0_planes`` (the host encoder, which the tests hold this one to).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from allie_jax.chess_jax import rules
from allie_jax.chess_jax.rules import ChessState

HISTORY = 8


def absolute_boards(state: ChessState) -> jax.Array:
    """int8 ``[B, 64]`` absolute boards (lc0 square order) from pgx's side-relative file-major ones."""
    b = state.board.reshape(-1, 8, 8).transpose(0, 2, 1)  # [B, rank from the mover's side, file]
    black = (state.color == 1)[:, None, None]
    b = jnp.where(black, -jnp.flip(b, axis=1), b)
    return b.reshape(-1, 64).astype(jnp.int8)


def push_history(boards, rep, valid, new_board, new_rep):
    """Prepend the newest position (boards ``[B, 8, 64]``, rep / valid ``[B, 8]``)."""
    boards = jnp.concatenate([new_board[:, None], boards[:, :-1]], axis=1)
    rep = jnp.concatenate([new_rep[:, None], rep[:, :-1]], axis=1)
    valid = jnp.concatenate([jnp.ones_like(valid[:, :1]), valid[:, :-1]], axis=1)
    return boards, rep, valid


def planes(boards: jax.Array, rep: jax.Array, valid: jax.Array, state: ChessState) -> jax.Array:
    """float32 ``[B, 112, 8, 8]`` from the history and the current ``state``."""
    batch = boards.shape[0]
    black = state.color == 1
    rel = boards.astype(jnp.int32) * jnp.where(black, -1, 1)[:, None, None]
    mirrored = jnp.flip(rel.reshape(batch, HISTORY, 8, 8), axis=2).reshape(batch, HISTORY, 64)
    rel = jnp.where(black[:, None, None], mirrored, rel)
    kinds = jnp.arange(1, 7)[None, None, :, None]
    ours = rel[:, :, None, :] == kinds
    theirs = rel[:, :, None, :] == -kinds
    reps = jnp.broadcast_to(rep[:, :, None, None], (batch, HISTORY, 1, 64))
    steps = jnp.concatenate([ours, theirs, reps], axis=2) & valid[:, :, None, None]
    steps = steps.reshape(batch, HISTORY * 13, 64).astype(jnp.float32)
    castling = state.castling.reshape(batch, 4).astype(jnp.float32)  # us Q, us K, them Q, them K
    aux = jnp.concatenate(
        [
            castling,
            black[:, None].astype(jnp.float32),
            state.halfmove[:, None].astype(jnp.float32),
            jnp.zeros((batch, 1)),
            jnp.ones((batch, 1)),
        ],
        axis=1,
    )
    aux = jnp.broadcast_to(aux[:, :, None], (batch, 8, 64))
    return jnp.concatenate([steps, aux], axis=1).reshape(batch, 112, 8, 8)


def king_home(state: ChessState) -> jax.Array:
    """bool ``[B]``: the mover's king stands on e1 / e8 (pgx's side-relative square e1 = 32)."""
    return state.board[:, 32] == 6


def repeated(state: ChessState) -> jax.Array:
    """bool ``[B]``: the current position occurred before (lc0's repetition plane)."""
    return rules.repetitions(state) >= 2
