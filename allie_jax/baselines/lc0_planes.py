"""lc0's classical 112-plane network input, built from a game's move history with python-chess.

Planes (each 8×8, square = rank·8 + file, all from the side to move's view):

- 8 history steps × 13 planes, newest first: the mover's P N B R Q K, the opponent's P N B R Q K,
  and a plane of ones when that position had occurred before in the game (a repetition). Every
  step is drawn from the *current* mover's perspective, with ranks mirrored when Black is to move.
  Steps before the game's first position are zero when the game starts from the standard
  position; a game set up from another position (a FEN) has no history, and those steps repeat
  its first position as lc0 does (``FillEmptyHistory::FEN_ONLY``): with an en-passant square,
  the pawn that just moved two squares is put back for the repeated steps.
- 104..107: ones if the mover may castle queenside, kingside, the opponent queenside, kingside;
- 108: ones when Black is to move; 109: the rule-50 half-move count (raw, not scaled);
- 110: zeros; 111: ones.

A position repeats an earlier one when pieces, side to move, castling rights and the en-passant
square agree; the en-passant square counts only when an enemy pawn stands beside the pushed pawn
(lc0 records it only then).
"""

from __future__ import annotations

from collections.abc import Sequence

import chess
import numpy as np

HISTORY = 8
PLANES_PER_STEP = 13
AUX = HISTORY * PLANES_PER_STEP  # 104
NUM_PLANES = AUX + 8  # 112
PIECES = (chess.PAWN, chess.KNIGHT, chess.BISHOP, chess.ROOK, chess.QUEEN, chess.KING)


def _mirror(mask: int) -> int:
    """Flip a bitboard's ranks (a byte swap)."""
    return int.from_bytes(mask.to_bytes(8, "little"), "big")


def _piece_masks(board: chess.Board, us: chess.Color) -> list[int]:
    """12 bitboards (us P..K, them P..K) as ``us`` sees the board (mirrored when us is Black)."""
    masks = []
    for color in (us, not us):
        occupied = board.occupied_co[color]
        for piece in PIECES:
            m = board.pieces_mask(piece, color) & occupied
            masks.append(_mirror(m) if us == chess.BLACK else m)
    return masks


def absolute_board(board: chess.Board) -> np.ndarray:
    """int8 ``[64]`` in lc0 square order (rank·8 + file): +piece type for White, −piece for Black."""
    out = np.zeros(64, np.int8)
    for sq, piece in board.piece_map().items():
        out[sq] = piece.piece_type if piece.color == chess.WHITE else -piece.piece_type
    return out


def _ep_key(board: chess.Board) -> int | None:
    if board.ep_square is None:
        return None
    # pseudo-legal: an enemy pawn stands next to the pushed pawn
    return board.ep_square if board.has_pseudo_legal_en_passant() else None


def _position_key(board: chess.Board) -> tuple:
    return (
        board.pawns,
        board.knights,
        board.bishops,
        board.rooks,
        board.queens,
        board.kings,
        board.occupied_co[chess.WHITE],
        board.turn,
        board.clean_castling_rights(),
        _ep_key(board),
    )


def _unpack(masks: np.ndarray) -> np.ndarray:
    """uint64 ``[..., P]`` bitboards → float32 ``[..., P, 8, 8]`` planes (bit i = square i)."""
    as_bytes = masks.astype("<u8").view(np.uint8).reshape(*masks.shape, 8)
    bits = np.unpackbits(as_bytes, axis=-1, bitorder="little")
    return bits.reshape(*masks.shape, 8, 8).astype(np.float32)


class GameEncoder:
    """Walks one game and yields the 112 planes of the position before every move.

    ``encode(ply)`` is the input for the position after ``ply`` moves (0 = start), as lc0 builds it
    for ``GameState(moves=moves[:ply])``. Building everything once per game keeps a batch of
    positions from replaying the game again for each one.
    """

    def __init__(self, moves: Sequence[str | chess.Move], board: chess.Board | None = None):
        board = chess.Board() if board is None else board.copy(stack=False)
        # lc0 fills the missing history only when the game did not start at the standard board
        self._fill: tuple[list[int], list[int]] | None = None
        if board.board_fen() != chess.Board().board_fen():
            before = board.copy(stack=False)
            if board.ep_square is not None:  # undo the double push that made the square
                down = -8 if board.turn == chess.WHITE else 8
                pawn_at, origin = board.ep_square + down, board.ep_square - down
                piece = before.remove_piece_at(pawn_at)
                if piece is not None:
                    before.set_piece_at(origin, piece)
            self._fill = (_piece_masks(before, chess.WHITE), _piece_masks(before, chess.BLACK))
        self._views: list[tuple[list[int], list[int]]] = []  # (white's view, black's view)
        self._repeated: list[bool] = []
        self._aux: list[tuple[bool, tuple[bool, bool, bool, bool], int]] = []
        self._absolute: list[np.ndarray] = []
        self.king_home: list[bool] = []  # the mover's king on e1 / e8 (castling labels)
        self.boards_fen: list[str] = []
        seen: dict[tuple, int] = {}
        for i in range(len(moves) + 1):
            key = _position_key(board)
            self._repeated.append(seen.get(key, 0) >= 1)
            seen[key] = seen.get(key, 0) + 1
            self._views.append((_piece_masks(board, chess.WHITE), _piece_masks(board, chess.BLACK)))
            us = board.turn
            self._absolute.append(absolute_board(board))
            self.king_home.append(board.king(us) == (chess.E1 if us == chess.WHITE else chess.E8))
            castling = (
                board.has_queenside_castling_rights(us),
                board.has_kingside_castling_rights(us),
                board.has_queenside_castling_rights(not us),
                board.has_kingside_castling_rights(not us),
            )
            self._aux.append((us == chess.BLACK, castling, board.halfmove_clock))
            if i == len(moves):
                break
            move = moves[i]
            move = chess.Move.from_uci(move) if isinstance(move, str) else move
            if move not in board.legal_moves:
                raise ValueError(f"GameEncoder: illegal move {move.uci()} at ply {i}")
            board.push(move)

    def __len__(self) -> int:
        return len(self._views)

    def history(self, ply: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The 8 newest boards up to ``ply`` for a search to extend: int8 ``[8, 64]`` absolute
        boards (``absolute_board``), bool ``[8]`` repetition flags, bool ``[8]`` present."""
        boards = np.zeros((HISTORY, 64), np.int8)
        rep = np.zeros(HISTORY, bool)
        valid = np.zeros(HISTORY, bool)
        for step in range(min(HISTORY, ply + 1)):
            boards[step] = self._absolute[ply - step]
            rep[step] = self._repeated[ply - step]
            valid[step] = True
        if self._fill is not None:  # a FEN start: repeat the first position
            for step in range(ply + 1, HISTORY):
                boards[step] = self._absolute[0]
                valid[step] = True
        return boards, rep, valid

    def masks(self, ply: int) -> tuple[np.ndarray, int]:
        """uint64 ``[112]`` bitboards (all-ones for filled planes) and the rule-50 count."""
        black, castling, rule50 = self._aux[ply]
        out = np.zeros(NUM_PLANES, np.uint64)
        full = np.uint64(0xFFFFFFFFFFFFFFFF)
        for step in range(HISTORY):
            idx = ply - step
            base = step * PLANES_PER_STEP
            if idx < 0:
                if self._fill is None:
                    break
                # the first position again, from the current mover's view (lc0 stops
                # alternating the perspective at the first position)
                out[base : base + 12] = self._fill[1 if black else 0]
                continue
            out[base : base + 12] = self._views[idx][1 if black else 0]
            if self._repeated[idx]:
                out[base + 12] = full
        for j, flag in enumerate(castling):
            if flag:
                out[AUX + j] = full
        if black:
            out[AUX + 4] = full
        out[AUX + 7] = full
        return out, rule50

    def encode(self, ply: int) -> np.ndarray:
        """float32 ``[112, 8, 8]`` input planes of the position after ``ply`` moves."""
        masks, rule50 = self.masks(ply)
        planes = _unpack(masks)
        planes[AUX + 5] = float(rule50)
        return planes

    def encode_many(self, plies: Sequence[int]) -> np.ndarray:
        """float32 ``[len(plies), 112, 8, 8]``."""
        if not len(plies):
            return np.zeros((0, NUM_PLANES, 8, 8), np.float32)
        masks = np.stack([self.masks(p)[0] for p in plies])
        planes = _unpack(masks)
        planes[:, AUX + 5] = np.asarray([self._aux[p][2] for p in plies], np.float32)[:, None, None]
        return planes
