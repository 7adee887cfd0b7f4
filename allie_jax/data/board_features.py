"""One position as the board-state transformer reads it, built with python-chess (seed 001).

The features are absolute (White at the bottom, White/Black pieces); the model flips them itself
when configured colour-relative, so the data and every target stay the same for all ablations.

Per position (numpy, no batch axis):

    squares      int8 [64]     0 empty, 1..6 White P N B R Q K, 7..12 Black P N B R Q K (a1 = 0)
    side         int8          1 White to move, 0 Black
    castling     int8 [4]      White O-O, White O-O-O, Black O-O, Black O-O-O
    ep_file      int8          file of a *legal* en-passant capture (python-chess's FEN rule), −1 none
    repetition   int8          earlier occurrences of this position in the game: 0, 1, 2 (= 2+)
    halfmoves    int16         the fifty-move clock (plies)
    fullmoves    int16         the full-move number
    white_elo, black_elo int16  0 when unknown
    move_info    int8 [1968]   −1 illegal; else earlier occurrences (0, 1, 2+) of the position the
                               move leads to — the refinement tokens' repetition embedding
    policy_target int32        the move played (−1 none)
    rights_target int8 [13]    castling (4) + en passant available (1) + its file (8) after the move
    value_target float32       game result from White's view (NaN unknown)

Repetitions use python-chess's transposition key (pieces, side, castling, legal en passant), the
same notion of "same position" as the threefold rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import chess
import numpy as np

from allie_jax import compat, vocab
from allie_jax.game import Game

NUM_STATES = 13
NUM_RIGHTS = 13  # 4 castling + en passant available + 8 files
MAX_REPETITION = 2  # 2 stands for "2 or more"

FIELDS: dict[str, tuple[tuple[int, ...], np.dtype]] = {
    "squares": ((64,), np.dtype(np.int8)),
    "side": ((), np.dtype(np.int8)),
    "castling": ((4,), np.dtype(np.int8)),
    "ep_file": ((), np.dtype(np.int8)),
    "repetition": ((), np.dtype(np.int8)),
    "halfmoves": ((), np.dtype(np.int16)),
    "fullmoves": ((), np.dtype(np.int16)),
    "white_elo": ((), np.dtype(np.int16)),
    "black_elo": ((), np.dtype(np.int16)),
    "move_info": ((vocab.NUM_MOVES,), np.dtype(np.int8)),
    "policy_target": ((), np.dtype(np.int32)),
    "rights_target": ((NUM_RIGHTS,), np.dtype(np.int8)),
    "value_target": ((), np.dtype(np.float32)),
}
INPUT_FIELDS = (
    "squares",
    "side",
    "castling",
    "ep_file",
    "repetition",
    "halfmoves",
    "fullmoves",
    "white_elo",
    "black_elo",
    "move_info",
)


def square_state(piece: chess.Piece | None) -> int:
    """0 empty, 1..6 White pawn..king, 7..12 Black pawn..king."""
    if piece is None:
        return 0
    return piece.piece_type + (0 if piece.color == chess.WHITE else 6)


def _ep_file(board: chess.Board) -> int:
    return chess.square_file(board.ep_square) if board.has_legal_en_passant() else -1


def _castling(board: chess.Board) -> np.ndarray:
    return np.asarray(
        [
            board.has_kingside_castling_rights(chess.WHITE),
            board.has_queenside_castling_rights(chess.WHITE),
            board.has_kingside_castling_rights(chess.BLACK),
            board.has_queenside_castling_rights(chess.BLACK),
        ],
        np.int8,
    )


def rights_vector(board: chess.Board) -> np.ndarray:
    """The 13 rights of ``board``: castling (4), en passant available, en-passant file one-hot."""
    out = np.zeros(NUM_RIGHTS, np.int8)
    out[:4] = _castling(board)
    f = _ep_file(board)
    if f >= 0:
        out[4] = 1
        out[5 + f] = 1
    return out


def move_id(move: chess.Move) -> int:
    """The vocabulary id of a python-chess move (castling is already the king's two-square move)."""
    return vocab.encode_move(move.uci())


def _key(board: chess.Board):
    return compat.chess_transposition_key(board)  # the threefold rule's "same position"


def position_features(
    board: chess.Board,
    seen: Counter | None = None,
    *,
    white_elo: int | None = None,
    black_elo: int | None = None,
) -> dict[str, np.ndarray]:
    """Input features of ``board``; ``seen`` counts the transposition keys of earlier positions
    (this one excluded). Without it the repetition features come from ``board.move_stack``."""
    if seen is None:
        seen = _history_counter(board)
    squares = np.zeros(64, np.int8)
    for sq, piece in board.piece_map().items():
        squares[sq] = square_state(piece)
    move_info = np.full(vocab.NUM_MOVES, -1, np.int8)
    # A repeated position needs the moves in between to be reversible: the move itself plus at
    # least three earlier plies, so with a clock below 3 every legal move leads somewhere new.
    check_repeats = board.halfmove_clock >= 3 and bool(seen)
    for move in board.legal_moves:
        count = 0
        if check_repeats and not board.is_zeroing(move):
            board.push(move)
            count = min(seen.get(_key(board), 0), MAX_REPETITION)
            board.pop()
        move_info[move_id(move)] = count
    return {
        "squares": squares,
        "side": np.int8(board.turn == chess.WHITE),
        "castling": _castling(board),
        "ep_file": np.int8(_ep_file(board)),
        "repetition": np.int8(min(seen.get(_key(board), 0), MAX_REPETITION)),
        "halfmoves": np.int16(min(board.halfmove_clock, 32_767)),
        "fullmoves": np.int16(min(board.fullmove_number, 32_767)),
        "white_elo": np.int16(white_elo or 0),
        "black_elo": np.int16(black_elo or 0),
        "move_info": move_info,
    }


def _history_counter(board: chess.Board) -> Counter:
    """Transposition keys of the positions before ``board`` in its move stack."""
    replay = board.root()
    seen: Counter = Counter()
    for move in board.move_stack:
        seen[_key(replay)] += 1
        replay.push(move)
    return seen


def game_examples(
    game: Game, start_fen: str | None = None, *, plies: Sequence[int] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """One training example per position of ``game`` that has a next move (``plies`` selects)."""
    board = chess.Board(start_fen) if start_fen else chess.Board()
    seen: Counter = Counter()
    wanted = None if plies is None else set(plies)
    value = np.float32(np.nan if game.result is None else game.result)
    for ply, uci in enumerate(game.moves):
        move = chess.Move.from_uci(uci)
        if move not in board.legal_moves:
            raise ValueError(f"game {game.game_id!r}: move {ply + 1} {uci!r} is illegal")
        if wanted is None or ply in wanted:
            ex = position_features(board, seen, white_elo=game.white_elo, black_elo=game.black_elo)
            board.push(move)
            ex["rights_target"] = rights_vector(board)
            board.pop()
            ex["policy_target"] = np.int32(move_id(move))
            ex["value_target"] = value
            yield ex
        seen[_key(board)] += 1
        board.push(move)


def stack(examples: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Batch examples (each key stacked on a new leading axis, dtypes as ``FIELDS``)."""
    if not examples:
        raise ValueError("stack() needs at least one example")
    return {
        k: np.stack([np.asarray(e[k], FIELDS[k][1]) for e in examples]) for k in examples[0].keys()
    }


def board_inputs(
    boards: Sequence[chess.Board],
    *,
    white_elos: Sequence[int | None] | None = None,
    black_elos: Sequence[int | None] | None = None,
) -> dict[str, np.ndarray]:
    """Model inputs for a batch of python-chess boards (repetitions from their move stacks)."""
    n = len(boards)
    we = list(white_elos) if white_elos is not None else [None] * n
    be = list(black_elos) if black_elos is not None else [None] * n
    return stack(
        [
            position_features(b, white_elo=w, black_elo=k)
            for b, w, k in zip(boards, we, be, strict=True)
        ]
    )
