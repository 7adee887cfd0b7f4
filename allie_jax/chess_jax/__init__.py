"""Chess rules inside ``jax.jit`` for batches of games, in Allie's 1,968-move vocabulary.

Built on pgx's move generator with our own vocabulary tables and game-end rule; see ``rules``.
"""

from allie_jax.chess_jax.convert import board_fen, board_to_move_ids, pad_move_ids, uci_to_move_ids
from allie_jax.chess_jax.rules import (
    HISTORY,
    RULES,
    ChessState,
    apply,
    initial_state,
    is_check,
    legal_mask,
    outcome,
    replay,
    white_to_move,
)

__all__ = [
    "HISTORY",
    "RULES",
    "ChessState",
    "apply",
    "board_fen",
    "board_to_move_ids",
    "initial_state",
    "is_check",
    "legal_mask",
    "outcome",
    "pad_move_ids",
    "replay",
    "uci_to_move_ids",
    "white_to_move",
]
