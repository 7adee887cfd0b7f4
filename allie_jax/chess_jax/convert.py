"""Bridges to python-chess: move lists in, readable positions out (for tests and debugging)."""

from __future__ import annotations

from collections.abc import Sequence

import chess
import numpy as np

from allie_jax import vocab
from allie_jax.chess_jax.rules import ChessState

_PIECE_SYMBOLS = " pnbrqk"


def uci_to_move_ids(moves: Sequence[str]) -> np.ndarray:
    """int32 [N]; castling must be written as the king's two-square move (e1g1)."""
    return np.asarray([vocab.encode_move(m) for m in moves], dtype=np.int32)


def board_to_move_ids(board: chess.Board) -> np.ndarray:
    """The move ids of ``board.move_stack``; the game must start from the standard position."""
    root = board.root()
    if root.fen() != chess.STARTING_FEN:
        raise ValueError(f"board must start from the standard position, starts from {root.fen()}")
    if board.chess960:
        raise ValueError("board is a Chess960 board; only standard castling (e1g1) is supported")
    return uci_to_move_ids([m.uci() for m in board.move_stack])


def pad_move_ids(
    games: Sequence[Sequence[int]], length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Stack variable-length move-id lists into (move_ids int32 [B, T], lengths int32 [B])."""
    lengths = np.asarray([len(g) for g in games], dtype=np.int32)
    width = int(lengths.max(initial=0)) if length is None else length
    if width < lengths.max(initial=0):
        raise ValueError(
            f"length={length} is shorter than the longest game ({lengths.max()} moves)"
        )
    out = np.zeros((len(games), max(width, 1)), dtype=np.int32)
    for i, g in enumerate(games):
        out[i, : len(g)] = g
    return out, lengths


def board_fen(state: ChessState, index: int = 0) -> str:
    """Piece placement and side to move of one position, as in a FEN's first two fields."""
    board = np.asarray(state.board[index]).astype(np.int32)
    black = int(state.color[index]) == 1
    rows = []
    for rank in range(7, -1, -1):
        row, empty = "", 0
        for file in range(8):
            rel_rank = 7 - rank if black else rank
            p = board[file * 8 + rel_rank]
            if black:
                p = -p
            if p == 0:
                empty += 1
                continue
            if empty:
                row, empty = row + str(empty), 0
            symbol = _PIECE_SYMBOLS[abs(p)]
            row += symbol.upper() if p > 0 else symbol
        rows.append(row + (str(empty) if empty else ""))
    return "/".join(rows) + (" b" if black else " w")
