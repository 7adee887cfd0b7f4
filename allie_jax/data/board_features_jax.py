"""The board model's input features inside ``jax.jit``, from a batch of ``chess_jax`` states.

``data/board_features.py`` builds the same fields with python-chess for the data pipeline; a
search cannot leave jit for every leaf, so this module reads them off the in-jit chess state:
pieces from pgx's side-relative board, castling rights, the legal en passant file, the
repetition counts (of the position and of the position each legal move leads to, from the
state's ring of position keys), the clocks, and the game's Elos. Positions are those reached
from the standard start (``fullmoves`` counts from ply 0). The tests hold every field to the
python-chess builder on real games.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from allie_jax import chess_jax
from allie_jax.chess_jax import rules
from allie_jax.data.board_features import MAX_REPETITION


def absolute_board(state: chess_jax.ChessState) -> jax.Array:
    """int32 ``[B, 64]``: +piece for White, −piece for Black, python-chess squares (a1 = 0)."""
    b = state.board.reshape(-1, 8, 8).transpose(0, 2, 1)  # [B, rank from the mover's side, file]
    black = (state.color == 1)[:, None, None]
    b = jnp.where(black, -jnp.flip(b, axis=1), b)
    return b.reshape(-1, 64).astype(jnp.int32)


def features(
    state: chess_jax.ChessState,
    white_elo: jax.Array,
    black_elo: jax.Array,
    legal: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """``board_features.INPUT_FIELDS`` for every position of ``state`` (batched, same dtypes)."""
    if legal is None:
        legal = chess_jax.legal_mask(state)
    board = absolute_board(state)
    squares = jnp.where(board > 0, board, jnp.where(board < 0, 6 - board, 0))
    white = state.color == 0
    mover, other = state.castling[:, 0], state.castling[:, 1]  # [queen side, king side] each
    w = jnp.where(white[:, None], mover, other)
    b = jnp.where(white[:, None], other, mover)
    castling = jnp.stack([w[:, 1], w[:, 0], b[:, 1], b[:, 0]], axis=1)
    ep_file = jnp.where(rules.legal_en_passant(state), state.en_passant // 8, -1)
    repetition = jnp.minimum(rules.repetitions(state) - 1, MAX_REPETITION)
    b_size = state.color.shape[0]
    return {
        "squares": squares.astype(jnp.int8),
        "side": white.astype(jnp.int8),
        "castling": castling.astype(jnp.int8),
        "ep_file": ep_file.astype(jnp.int8),
        "repetition": repetition.astype(jnp.int8),
        "halfmoves": jnp.minimum(state.halfmove, 32_767).astype(jnp.int16),
        "fullmoves": jnp.minimum(state.ply // 2 + 1, 32_767).astype(jnp.int16),
        "white_elo": jnp.broadcast_to(jnp.asarray(white_elo), (b_size,)).astype(jnp.int16),
        "black_elo": jnp.broadcast_to(jnp.asarray(black_elo), (b_size,)).astype(jnp.int16),
        "move_info": rules.child_repetitions(state, legal).astype(jnp.int8),
    }
