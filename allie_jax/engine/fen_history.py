"""A move history for a position given as a FEN, so a model that reads games can read it.

Allie reads the moves from the standard start, not a board. Opening books (EPD files, the
``position fen`` of fastchess and cutechess) give positions a few moves deep; for those a legal
move sequence from the standard start that reaches the position *exactly* (the pieces, the side
to move, the castling rights and the en-passant square) is a history the model can read, and
usually very close to how such positions arise.

``find_history`` is a bounded best-first search (weighted A*): the cost of a node is its plies
plus a weighted lower bound on the plies still needed (each side's pieces must travel to the
squares they occupy in the target, each piece the target lacks must be captured by the other
side, and the plies alternate between the sides). Moves of a piece from a square it already
holds in the target, pushes of pawns the target has not moved, and captures of pieces the target
still has are tried last. It is meant for openings of up to ``MAX_PLIES`` plies; deeper
positions, or ones the node budget cannot reach, get ``None`` and a reason.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import itertools
import threading
import time

import chess

MAX_PLIES = 24  # a history longer than this is not searched for
MAX_NODES = 60_000  # positions expanded per search
WEIGHT = 4.0  # of the heuristic in the node cost (speed over the shortest path)
_PIECES = (chess.PAWN, chess.KNIGHT, chess.BISHOP, chess.ROOK, chess.QUEEN, chess.KING)


@dataclasses.dataclass(frozen=True)
class History:
    """The outcome for one FEN: ``moves`` (UCI, from the standard start) or ``why`` not."""

    fen: str
    moves: tuple[str, ...] | None
    why: str = ""
    nodes: int = 0
    timed_out: bool = False  # the time limit ended the search (a quieter moment may find it)

    @property
    def found(self) -> bool:
        return self.moves is not None


def position_key(board: chess.Board) -> tuple:
    """What "the same position" means here: pieces, side to move, castling rights, and the
    en-passant square when an en-passant capture is legal (as FEN and repetition rules read it)."""
    ep = board.ep_square if board.has_legal_en_passant() else None
    return (board.board_fen(), board.turn, board.clean_castling_rights(), ep)


@functools.cache
def _knight_distance(a: int, b: int) -> int:
    dist = {a: 0}
    queue = collections.deque([a])
    while queue:
        s = queue.popleft()
        if s == b:
            return dist[s]
        for t in chess.SquareSet(chess.BB_KNIGHT_ATTACKS[s]):
            if t not in dist:
                dist[t] = dist[s] + 1
                queue.append(t)
    return 6


def _distance(piece: chess.Piece, a: int, b: int) -> int:
    """Fewest moves for ``piece`` from square a to b on an empty board (a lower bound)."""
    if a == b:
        return 0
    fa, ra, fb, rb = (
        chess.square_file(a),
        chess.square_rank(a),
        chess.square_file(b),
        chess.square_rank(b),
    )
    df, dr = abs(fa - fb), abs(ra - rb)
    kind = piece.piece_type
    if kind == chess.KNIGHT:
        return _knight_distance(a, b)
    if kind == chess.KING:
        return max(df, dr)
    if kind == chess.ROOK:
        return 1 if df == 0 or dr == 0 else 2
    if kind == chess.BISHOP:
        if (fa + ra) % 2 != (fb + rb) % 2:
            return 99
        return 1 if df == dr else 2
    if kind == chess.QUEEN:
        return 1 if df == 0 or dr == 0 or df == dr else 2
    forward = rb - ra if piece.color == chess.WHITE else ra - rb
    if forward < df or forward <= 0:
        return 99  # a pawn never goes back, and needs a capture per file it changes
    start = chess.square_rank(a) == (1 if piece.color == chess.WHITE else 6)
    if df == 0 and start and forward == 2:
        return 1
    return forward


@functools.cache
def _table(piece_type: int, color: bool) -> tuple[tuple[int, ...], ...]:
    """``_distance`` for every (from, to) pair of one piece kind."""
    piece = chess.Piece(piece_type, color)
    return tuple(tuple(_distance(piece, a, b) for b in chess.SQUARES) for a in chess.SQUARES)


class _Target:
    """The target position, pre-digested for the heuristic."""

    def __init__(self, board: chess.Board) -> None:
        self.board = board
        self.key = position_key(board)
        self.turn = board.turn
        self.map = board.piece_map()
        self.squares = {
            color: {s: p for s, p in self.map.items() if p.color == color} for color in chess.COLORS
        }
        self.counts = {
            color: {p: len(board.pieces(p, color)) for p in _PIECES} for color in chess.COLORS
        }

    def side_moves(self, board: chess.Board, color: chess.Color, pieces=None) -> int:
        """Lower bound on ``color``'s moves still needed."""
        pieces = board.piece_map() if pieces is None else pieces
        target = self.squares[color]
        # this side's pieces not already on a square the target has them on, by kind
        free: dict[int, list[int]] = {}
        counts = dict.fromkeys(_PIECES, 0)
        other_counts = dict.fromkeys(_PIECES, 0)
        for sq, piece in pieces.items():
            if piece.color == color:
                counts[piece.piece_type] += 1
                if target.get(sq) != piece:
                    free.setdefault(piece.piece_type, []).append(sq)
            else:
                other_counts[piece.piece_type] += 1
        need = 0
        for square, piece in target.items():
            if pieces.get(square) == piece:
                continue
            table = _table(piece.piece_type, color)
            best = min((table[s][square] for s in free.get(piece.piece_type, ())), default=99)
            if best >= 99 and piece.piece_type != chess.PAWN:
                best = 3  # by promotion or an unusual route: at least something
            need += best
        other = self.counts[not color]
        captures = sum(max(0, other_counts[p] - other[p]) for p in _PIECES)
        return max(need, captures)

    def plies_needed(self, board: chess.Board) -> int:
        """Fewest plies consistent with both sides' bounds and the side to move at the end."""
        pieces = board.piece_map()
        white = self.side_moves(board, chess.WHITE, pieces)
        black = self.side_moves(board, chess.BLACK, pieces)
        if white >= 99 or black >= 99:
            return 99
        for n in range(0, 80):
            first = board.turn
            n_first, n_second = (n + 1) // 2, n // 2
            w, b = (n_first, n_second) if first == chess.WHITE else (n_second, n_first)
            end_turn = first if n % 2 == 0 else (not first)
            if w >= white and b >= black and end_turn == self.turn:
                return n
        return 99

    def move_penalty(self, board: chess.Board, move: chess.Move) -> int:
        """0 for moves that look on the way to the target, 1 otherwise (tie-break only)."""
        piece = board.piece_at(move.from_square)
        if piece is None:
            return 1
        if self.squares[piece.color].get(move.from_square) == piece:
            return 1  # moving a piece off a square the target has it on
        captured = board.piece_at(move.to_square)
        if captured is not None:
            left = len(board.pieces(captured.piece_type, captured.color))
            if left <= self.counts[captured.color][captured.piece_type]:
                return 1  # the target still has all of those
        return 0


def _search(
    target: _Target, max_plies: int, max_nodes: int, time_limit_s: float, strict: bool
) -> History:
    fen = target.board.fen()
    start = chess.Board()
    h0 = target.plies_needed(start)
    if h0 > max_plies:
        return History(fen, None, f"needs at least {h0} plies from the start (over {max_plies})")
    tie = itertools.count()
    frontier = [(WEIGHT * h0, 0, next(tie), start, ())]
    seen = {position_key(start): 0}
    nodes = 0
    timed_out = False
    end = time.monotonic() + time_limit_s
    while frontier:
        _, g, _, board, path = heapq.heappop(frontier)
        if position_key(board) == target.key:
            return History(fen, tuple(path), "", nodes)
        nodes += 1
        if nodes > max_nodes:
            break
        if nodes % 64 == 0 and time.monotonic() > end:
            timed_out = True
            break
        if g >= max_plies:
            continue
        for move in board.legal_moves:
            penalty = target.move_penalty(board, move)
            if strict and penalty:
                continue
            child = board.copy(stack=False)
            child.push(move)
            key = position_key(child)
            if seen.get(key, 1 << 30) <= g + 1:
                continue
            h = target.plies_needed(child)
            if g + 1 + h > max_plies:
                continue
            seen[key] = g + 1
            cost = g + 1 + WEIGHT * h + 0.5 * penalty
            heapq.heappush(frontier, (cost, g + 1, next(tie), child, path + (move.uci(),)))
    why = (
        f"no move sequence of at most {max_plies} plies from the standard start found "
        f"in {nodes} positions" + (f" ({time_limit_s:.1f} s)" if timed_out else "")
    )
    return History(fen, None, why, nodes, timed_out)


_CACHE: collections.OrderedDict[str, History] = collections.OrderedDict()
_CACHE_SIZE = 4096
_LOCK = threading.Lock()
# FEN -> how many searches of it ran out of time: each retry gets twice the time of the last
# (up to MAX_RETRY_FACTOR times the caller's), so on a busy machine, where every try of the
# same length can time out, the engine's retry at each move finds the history within a few moves
_TIMEOUTS: collections.OrderedDict[str, int] = collections.OrderedDict()
MAX_RETRY_FACTOR = 16


def find_history(
    fen: str,
    *,
    max_plies: int = MAX_PLIES,
    max_nodes: int = MAX_NODES,
    time_limit_s: float = 3.0,
) -> History:
    """A legal sequence from the standard start reaching ``fen`` exactly, or why there is none.

    Results are cached per FEN (an opening book asks for the same positions again and again).
    A search that ran out of time is not cached; the next search of that FEN gets twice the
    time (``time_limit_s`` times 2, 4, ... up to ``MAX_RETRY_FACTOR``).
    A FEN python-chess cannot read raises ValueError naming it.
    """
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        raise ValueError(f"fen {fen!r}: {exc}") from None
    norm = board.fen()
    with _LOCK:
        hit = _CACHE.get(norm)
        if hit is not None:
            _CACHE.move_to_end(norm)
            return hit
        time_limit_s *= min(2 ** _TIMEOUTS.get(norm, 0), MAX_RETRY_FACTOR)
    if position_key(board) == position_key(chess.Board()):
        result = History(norm, (), "", 0)
    elif not board.is_valid():
        result = History(norm, None, f"not a legal position ({board.status()!r})")
    else:
        target = _Target(board)
        # The FEN's move number says how many plies the game took to get here: a history of
        # exactly that length exists (if the counters are right), and the bound prunes hard.
        plies = 2 * (board.fullmove_number - 1) + (board.turn == chess.BLACK)
        bounds = [plies] if 0 < plies < max_plies else []
        bounds.append(max_plies)
        result = History(norm, None, "", 0)
        share = time_limit_s / (2 * len(bounds))
        for bound in bounds:  # first only the moves that look on the way, then every move
            for strict in (True, False):
                result = _search(target, bound, max_nodes, share, strict=strict)
                if result.found:
                    break
            if result.found:
                break
    with _LOCK:
        if result.timed_out:  # not cached: a quieter moment, or more time, may find it
            _TIMEOUTS[norm] = _TIMEOUTS.get(norm, 0) + 1
            _TIMEOUTS.move_to_end(norm)
            while len(_TIMEOUTS) > _CACHE_SIZE:
                _TIMEOUTS.popitem(last=False)
        else:
            _TIMEOUTS.pop(norm, None)
            _CACHE[norm] = result
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return result


def cached(fen: str) -> History | None:
    """The cached outcome for ``fen`` (None if it was never searched)."""
    try:
        norm = chess.Board(fen).fen()
    except ValueError:
        return None
    with _LOCK:
        return _CACHE.get(norm)
