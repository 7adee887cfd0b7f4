"""lc0's 1,858-entry policy index, its convolutional policy map, and the bridge to our vocabulary.

lc0 always sees the board from the side to move: Black's moves are mirrored (rank r → 9 − r)
before indexing, castling is written king-to-rook (``e1h1``, ``e1a1``), a knight promotion is the
plain pawn move (``a7a8``) and the other promotions carry a suffix (``a7a8q``, ``a7a8r``,
``a7a8b``). The index orders, generated here from those rules (no table copied):

- 1,792 ordinary moves: from-squares a1, b1, .., h1, a2, .. h8; for each, every square on the same
  rank, file or diagonal, or a knight's jump away, in the same square order;
- 66 promotions: pawns on the 7th rank, files a..h, targets left, straight, right (file order),
  pieces q, r, b.

The convolutional policy head outputs 80 planes of 8×8 (plane-major, square = rank·8 + file):
56 queen-like planes (directions N, NE, E, SE, S, SW, W, NW × distance 1..7), 8 knight planes
(jumps (1,2), (2,1), (2,−1), (1,−2), (−1,−2), (−2,−1), (−2,1), (−1,2) as (file, rank)), and 9
promotion planes (directions NW, N, NE × pieces r, b, q); the 7 remaining planes are unused.
"""

from __future__ import annotations

import functools

import chess
import numpy as np

from allie_jax import vocab

NUM_LC0_MOVES = 1858
NUM_POLICY_PLANES = 80
FILES = "abcdefgh"

QUEEN_DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))
KNIGHT_JUMPS = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
PROMO_DIRECTIONS = (-1, 0, 1)  # file offsets NW, N, NE
CONV_PROMO_PIECES = "rbq"
INDEX_PROMO_PIECES = "qrb"


def _name(file: int, rank: int) -> str:
    return f"{FILES[file]}{rank + 1}"


def _reachable(f0: int, r0: int, f1: int, r1: int) -> bool:
    df, dr = abs(f1 - f0), abs(r1 - r0)
    if (df, dr) == (0, 0):
        return False
    return df == 0 or dr == 0 or df == dr or (df, dr) in ((1, 2), (2, 1))


@functools.cache
def lc0_moves() -> tuple[str, ...]:
    """The 1,858 lc0 policy labels in index order (from the side to move's view)."""
    moves = []
    for from_sq in range(64):
        f0, r0 = from_sq % 8, from_sq // 8
        for to_sq in range(64):
            f1, r1 = to_sq % 8, to_sq // 8
            if _reachable(f0, r0, f1, r1):
                moves.append(_name(f0, r0) + _name(f1, r1))
    for f0 in range(8):
        for df in PROMO_DIRECTIONS:
            if 0 <= f0 + df < 8:
                for piece in INDEX_PROMO_PIECES:
                    moves.append(_name(f0, 6) + _name(f0 + df, 7) + piece)
    assert len(moves) == NUM_LC0_MOVES, len(moves)
    return tuple(moves)


@functools.cache
def lc0_index() -> dict[str, int]:
    return {m: i for i, m in enumerate(lc0_moves())}


@functools.cache
def conv_policy_map() -> np.ndarray:
    """int32 ``[80 * 64]``: lc0 index of each (plane, square) output of the conv head, −1 if unused."""
    index = lc0_index()
    table = np.full(NUM_POLICY_PLANES * 64, -1, np.int32)

    def put(plane: int, sq: int, move: str) -> None:
        table[plane * 64 + sq] = index[move]

    for d, (df, dr) in enumerate(QUEEN_DIRECTIONS):
        for dist in range(1, 8):
            plane = d * 7 + dist - 1
            for sq in range(64):
                f, r = sq % 8, sq // 8
                f1, r1 = f + df * dist, r + dr * dist
                if 0 <= f1 < 8 and 0 <= r1 < 8:
                    put(plane, sq, _name(f, r) + _name(f1, r1))
    for k, (df, dr) in enumerate(KNIGHT_JUMPS):
        for sq in range(64):
            f, r = sq % 8, sq // 8
            if 0 <= f + df < 8 and 0 <= r + dr < 8:
                put(56 + k, sq, _name(f, r) + _name(f + df, r + dr))
    for d, df in enumerate(PROMO_DIRECTIONS):
        for p, piece in enumerate(CONV_PROMO_PIECES):
            for f in range(8):
                if 0 <= f + df < 8:
                    put(64 + d * 3 + p, 6 * 8 + f, _name(f, 6) + _name(f + df, 7) + piece)
    assert sorted(table[table >= 0].tolist()) == list(range(NUM_LC0_MOVES))
    return table


def _mirror_uci(uci: str) -> str:
    """Flip ranks (1 ↔ 8): Black's move as lc0 sees it."""
    return uci[0] + str(9 - int(uci[1])) + uci[2] + str(9 - int(uci[3])) + uci[4:]


def lc0_label(board: chess.Board, move: chess.Move) -> str:
    """lc0's policy label of a legal ``move`` in ``board`` (the reference rule, one move at a time)."""
    uci = move.uci()
    if board.is_castling(move):
        rook_file = (
            "h" if chess.square_file(move.to_square) > chess.square_file(move.from_square) else "a"
        )
        uci = uci[:2] + rook_file + uci[3]
    if move.promotion == chess.KNIGHT:
        uci = uci[:4]
    if board.turn == chess.BLACK:
        uci = _mirror_uci(uci)
    return uci


def lc0_move_index(board: chess.Board, move: chess.Move) -> int:
    """Index 0..1857 of a legal ``move`` in ``board``."""
    return lc0_index()[lc0_label(board, move)]


@functools.cache
def vocab_to_lc0() -> np.ndarray:
    """int32 ``[2, 2, 1968]``: lc0 index of each vocabulary move, −1 where it cannot occur.

    Axis 0: side to move (0 White, 1 Black). Axis 1: 1 when the mover's king stands on its
    home square (e1 / e8), where the vocabulary's two-square king moves (``e1g1``) are castling
    and map to lc0's king-to-rook labels; elsewhere ``e1g1`` is an ordinary rook or queen move.
    """
    index = lc0_index()
    table = np.full((2, 2, vocab.NUM_MOVES), -1, np.int32)
    castles = {"e1g1": "e1h1", "e1c1": "e1a1"}
    for black in (0, 1):
        for king_home in (0, 1):
            for vid, uci in enumerate(vocab.MOVES):
                label = _mirror_uci(uci) if black else uci
                if len(label) == 5:
                    if label[1] != "7" or label[3] != "8":
                        continue  # the other side's promotion
                    if label[4] == "n":
                        label = label[:4]
                if king_home and label in castles:
                    label = castles[label]
                table[black, king_home, vid] = index.get(label, -1)
    return table


def lc0_to_vocab_logits(
    lc0_logits: np.ndarray, black: np.ndarray, king_home: np.ndarray, legal: np.ndarray
) -> np.ndarray:
    """Gather ``[B, 1858]`` lc0 logits into ``[B, 1968]`` vocabulary logits (−inf off ``legal``).

    Works on numpy and jax arrays alike (``xp`` is taken from the input).
    """
    xp = np if isinstance(lc0_logits, np.ndarray) else __import__("jax").numpy
    table = xp.asarray(vocab_to_lc0())
    idx = table[xp.asarray(black).astype(xp.int32), xp.asarray(king_home).astype(xp.int32)]
    gathered = xp.take_along_axis(lc0_logits, xp.maximum(idx, 0), axis=-1)
    ok = xp.asarray(legal) & (idx >= 0)
    return xp.where(ok, gathered, -xp.inf)
