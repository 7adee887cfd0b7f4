"""Games → per-position records for the evaluator, with the rules computed by python-chess.

Position i of a game with N moves is the board before move i (i = 0..N−1); position N is the final
board (scored for resignation). In a causal pass over ``encode_game(game, partial=True)`` the model's
prediction for position i sits at token index ``header_len − 1 + i`` (SPEC §1), so one pass gives
every position of the game.

The special-move flags follow the paper's Table "accuracy": the human's move castles, captures en
passant, promotes, or reaches a position for the third time (claiming or entering a threefold
repetition; python-chess counts repetitions of the full position: pieces, side to move, castling
and en-passant rights).
"""

from __future__ import annotations

import dataclasses
import math

import chess
import numpy as np

from allie_jax import vocab
from allie_jax.game import NO_TIME, Game

SPECIAL_MOVES = ("castling", "en_passant", "promotion", "threefold")


def _move_index_table() -> np.ndarray:
    """int32 [64 · 64 · 6]: (from, to, python-chess promotion piece type or 0) -> token id (−1 none).

    Indexing by squares avoids building a UCI string per legal move (the evaluator's hot loop).
    """
    table = np.full(64 * 64 * 6, -1, dtype=np.int32)
    piece = (
        0,
        chess.QUEEN,
        chess.ROOK,
        chess.BISHOP,
        chess.KNIGHT,
    )  # vocab promo 0 none, 1..4 qrbn
    for i, (frm, to, promo) in enumerate(vocab.move_table()):
        table[(frm * 64 + to) * 6 + piece[int(promo)]] = i
    return table


_MOVE_INDEX = _move_index_table()


def _key(move: chess.Move) -> int:
    return (move.from_square * 64 + move.to_square) * 6 + (move.promotion or 0)


def _legal_ids(board: chess.Board) -> np.ndarray:
    ids = _MOVE_INDEX[[_key(m) for m in board.generate_legal_moves()]]
    return ids.astype(np.int32, copy=False)


def initial_clock(time_control: str | None) -> float:
    """Base time in seconds of a control like "180+2" (nan when unknown)."""
    if not time_control:
        return math.nan
    base = time_control.split("+")[0].strip()
    try:
        return float(base)
    except ValueError:
        return math.nan


@dataclasses.dataclass
class GamePositions:
    """Arrays over the N moves of a game (index i = the position before move i), plus the final board."""

    move_ids: np.ndarray  # int32 [N] the human's move at each position
    white_to_move: np.ndarray  # bool [N + 1]
    mover_elo: np.ndarray  # float64 [N] (nan when unknown)
    clock_before: np.ndarray  # float64 [N] mover's clock before the move, seconds (nan unknown)
    think_time: np.ndarray  # float64 [N] seconds spent on the move (NO_TIME unlabelled)
    in_check: np.ndarray  # bool [N + 1]
    legal_ids: list[np.ndarray]  # N + 1 arrays of legal move ids (the last: the final board)
    special: dict[str, np.ndarray]  # SPECIAL_MOVES -> bool [N]
    result: float | None  # White's view, +1 / 0 / −1
    final_checkmate: bool
    resigned: bool  # decisive "Normal" ending that is not checkmate: someone resigned
    loser_to_move: bool  # the resigning side is the side to move at the final board

    @property
    def num_moves(self) -> int:
        return len(self.move_ids)

    def legal_mask(self, *, include_final: bool = True) -> np.ndarray:
        """bool [N (+1), 1968] legal-move mask of every position."""
        rows = self.legal_ids if include_final else self.legal_ids[:-1]
        mask = np.zeros((len(rows), vocab.NUM_MOVES), dtype=bool)
        for r, ids in enumerate(rows):
            mask[r, ids] = True
        return mask

    def accuracy_mask(self, *, min_ply: int = 10, min_clock: float = 30.0) -> np.ndarray:
        """Positions counted for move matching (``protocol_mask`` over this game's moves)."""
        ply = np.arange(self.num_moves)
        return protocol_mask(ply, self.num_moves, self.clock_before, min_ply, min_clock)


def protocol_mask(
    ply: np.ndarray,
    num_moves: np.ndarray | int,
    clock_before: np.ndarray,
    min_ply: int = 10,
    min_clock: float = 30.0,
) -> np.ndarray:
    """The move-matching protocol: a human move was made, after the first ``min_ply`` plies, and not
    under time pressure (mover's clock < ``min_clock`` s). A position without a clock keeps its
    place: the time-pressure rule cannot be applied to it. Used on games and on records alike."""
    ply = np.asarray(ply)
    low_clock = np.nan_to_num(np.asarray(clock_before, np.float64), nan=np.inf) < min_clock
    return (ply < np.asarray(num_moves)) & (ply >= min_ply) & ~low_clock


def clock_before_moves(game: Game) -> np.ndarray:
    """float64 [N]: the mover's clock before each move, seconds (nan unknown): the base time for
    each side's first move, then the clock the mover had left after their previous move."""
    n = len(game.moves)
    clock_before = np.full(n, np.nan)
    if game.clocks is None:
        return clock_before
    start = initial_clock(game.time_control)
    clocks = np.asarray(game.clocks, dtype=np.float64)
    clocks = np.where(clocks >= 0, clocks, np.nan)  # NO_TIME marks a missing [%clk]
    for i in range(n):
        clock_before[i] = start if i < 2 else (clocks[i - 2] if i - 2 < len(clocks) else np.nan)
    return clock_before


def header_length(game: Game) -> int:
    """Tokens before the first move: two Elos and the time control, or <BOS> and the time control
    when an Elo is missing (``game.header_tokens``)."""
    return 3 if game.white_elo is not None and game.black_elo is not None else 2


def context_positions(game: Game, max_len: int) -> int:
    """Positions 0..K−1 of ``game`` that a model with ``max_len`` tokens scores (final board
    included when it fits)."""
    return min(len(game.moves) + 1, max_len - header_length(game) + 1)


def game_positions(game: Game) -> GamePositions:
    """Replay ``game`` with python-chess; an illegal move raises ValueError naming the game and ply."""
    board = chess.Board()
    n = len(game.moves)
    move_ids = np.empty(n, dtype=np.int32)
    white_to_move = np.empty(n + 1, dtype=bool)
    in_check = np.empty(n + 1, dtype=bool)
    legal_ids: list[np.ndarray] = []
    special = {k: np.zeros(n, dtype=bool) for k in SPECIAL_MOVES}
    for i, uci in enumerate(game.moves):
        try:
            move = chess.Move.from_uci(uci)
        except ValueError:
            move = None
        if move is None or not board.is_legal(move):
            raise ValueError(f"game {game.game_id or '?'}: illegal move {uci!r} at ply {i}")
        white_to_move[i] = board.turn == chess.WHITE
        in_check[i] = board.is_check()
        legal_ids.append(_legal_ids(board))
        move_ids[i] = vocab.MOVE_TO_ID[uci]
        special["castling"][i] = board.is_castling(move)
        special["en_passant"][i] = board.is_en_passant(move)
        special["promotion"][i] = move.promotion is not None
        board.push(move)
        special["threefold"][i] = board.is_repetition(3)
    white_to_move[n] = board.turn == chess.WHITE
    in_check[n] = board.is_check()
    legal_ids.append(_legal_ids(board))
    final_checkmate = board.is_checkmate()

    elos = (game.white_elo, game.black_elo)
    mover_elo = np.array(
        [np.nan if elos[i % 2] is None else float(elos[i % 2]) for i in range(n)], dtype=np.float64
    )
    clock_before = clock_before_moves(game)
    think = np.full(n, NO_TIME, dtype=np.float64)
    if game.think_times is not None:
        tt = np.asarray(game.think_times, dtype=np.float64)[:n]
        think[: len(tt)] = tt
    resigned = game.ended_normally and game.result in (1.0, -1.0) and not final_checkmate and n > 0
    loser_is_white = game.result == -1.0
    return GamePositions(
        move_ids=move_ids,
        white_to_move=white_to_move,
        mover_elo=mover_elo,
        clock_before=clock_before,
        think_time=think,
        in_check=in_check,
        legal_ids=legal_ids,
        special=special,
        result=game.result,
        final_checkmate=final_checkmate,
        resigned=bool(resigned),
        loser_to_move=bool(resigned and white_to_move[n] == loser_is_white),
    )


def random_game(
    rng: np.random.Generator, *, max_plies: int = 200, elo_range: tuple[int, int] = (1000, 2500)
) -> Game:
    """A game of uniformly random legal moves (seeded): out-of-distribution positions for the
    legality check. Its length is uniform in [1, max_plies] unless it ends earlier."""
    board = chess.Board()
    target = int(rng.integers(1, max_plies + 1))
    moves = []
    while len(moves) < target and not board.is_game_over(claim_draw=False):
        legal = list(board.legal_moves)
        move = legal[int(rng.integers(len(legal)))]
        moves.append(move.uci())
        board.push(move)
    lo, hi = elo_range
    return Game(
        moves=moves,
        white_elo=int(rng.integers(lo, hi + 1)),
        black_elo=int(rng.integers(lo, hi + 1)),
        time_control="180+0",
        result=None,
        termination="Unterminated",
        game_id=f"random-{target}-{len(moves)}",
    )
