"""``position``: the game so far, read from ``position startpos|fen F [moves ...]``.

The model reads the game, not a board: ``position startpos moves ...`` is the game so far, and a
``position fen F`` gets a history searched for it (``engine.fen_history``; the thinking half of
the engine, ``engine/uci_think.py``, waits for it). python-chess is imported inside the functions,
so this module loads before ``uciok`` (see ``engine/uci.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import chess

    from allie_jax.game import Game


class PositionError(ValueError):
    """A ``position`` command the engine refuses; the message is the ``info string`` it sends
    (the position before the command is kept)."""


@dataclasses.dataclass
class Position:
    start_fen: str | None  # None: the standard start
    moves: list[str]
    known_board: chess.Board | None = None  # None: replayed when first read

    @property
    def board(self) -> chess.Board:
        """The board after the moves (the handler's first position builds it on first use, so
        python-chess is not imported before ``uciok``)."""
        if self.known_board is None:
            import chess

            board = chess.Board(self.start_fen) if self.start_fen else chess.Board()
            for move in self.moves:
                board.push_uci(move)
            self.known_board = board
        return self.known_board

    def continued_by(self, other: Position) -> bool:
        """Whether ``other`` is this game with moves added (the same game goes on)."""
        return other.start_fen == self.start_fen and other.moves[: len(self.moves)] == self.moves


def parse_position(args: list[str]) -> Position:
    """The ``position`` command's arguments as a ``Position`` (a FEN of the standard start reads
    as ``startpos``); raises ``PositionError`` for anything unreadable, impossible or illegal."""
    import chess

    if not args:
        raise PositionError("position needs startpos or fen")
    if "moves" in args:
        k = args.index("moves")
        spec, moves = args[:k], args[k + 1 :]
    else:
        spec, moves = args, []
    if spec[0] == "startpos" and len(spec) == 1:
        fen, board = None, chess.Board()
    elif spec[0] == "fen" and len(spec) > 1:
        fen = " ".join(spec[1:])
        try:
            board = chess.Board(fen)
        except ValueError as exc:
            raise PositionError(f"error: invalid fen {fen!r} ({exc}); position kept") from None
        if board.is_valid() is False:
            raise PositionError(f"error: impossible position {fen!r}; position kept")
        if fen == chess.STARTING_FEN:
            fen = None
    else:
        raise PositionError(f"error: cannot parse position {' '.join(args)!r}; position kept")
    ucis = []
    for ply, text in enumerate(moves):
        try:
            move = chess.Move.from_uci(text)
        except ValueError:
            move = None
        if move is None or move not in board.legal_moves:
            raise PositionError(
                f"error: illegal move {ply + 1} {text!r} in {board.fen()}; position kept"
            )
        board.push(move)
        ucis.append(move.uci())
    return Position(fen, ucis, board)


def replay_board_light(game: Game, fen: str | None) -> chess.Board:
    """The board after ``game.moves`` from ``fen`` (or the start); moves are known legal."""
    import chess

    board = chess.Board(fen) if fen else chess.Board()
    for uci in game.moves:
        board.push_uci(uci)
    return board
