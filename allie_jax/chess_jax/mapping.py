"""Static tables between Allie's 1,968 absolute UCI moves and pgx's 4,672 side-relative actions.

pgx numbers squares file-major (a1=0, a2=1, ..., h8=63) and mirrors the ranks when Black is to
move, so a move's pgx action depends on the side to move. Queen promotions are plain queen-move
actions in pgx (the pawn becomes a queen by itself), so the same pgx action is "a7a8" for a rook
and "a7a8q" for a pawn: ``KIND`` tells the rules which piece test to apply when translating a mask.
"""

from __future__ import annotations

import functools

import numpy as np

from allie_jax import compat, vocab

pgx_chess = compat.pgx_chess()  # pgx 2.6.0's chess rules (a private module, imported at first use)

NUM_PGX_ACTIONS = 64 * 73  # 4672
NO_ACTION = NUM_PGX_ACTIONS  # sentinel index of an always-False extra mask column

KIND_NORMAL = 0  # not a promotion: illegal if a pawn would reach the last rank
KIND_QUEEN_PROMOTION = 1  # legal only if the moving piece is a pawn
KIND_UNDERPROMOTION = 2  # pgx underpromotion planes exist only for pawns


def vocab_to_pgx_square(square: int, color: int) -> int:
    """Our square (a1=0, b1=1, ...) to pgx's side-relative one (file-major, ranks mirrored for Black)."""
    file, rank = square % 8, square // 8
    if color == 1:
        rank = 7 - rank
    return file * 8 + rank


@functools.cache
def _build() -> dict[str, np.ndarray]:
    to_plane = np.asarray(pgx_chess.TO_PLANE)
    table = vocab.move_table()
    kind = np.zeros(vocab.NUM_MOVES, np.int32)
    kind[table[:, 2] == 1] = KIND_QUEEN_PROMOTION
    kind[table[:, 2] >= 2] = KIND_UNDERPROMOTION
    action = np.full((2, vocab.NUM_MOVES), NO_ACTION, np.int32)
    from_sq = np.zeros((2, vocab.NUM_MOVES), np.int32)
    to_last_rank = np.zeros((2, vocab.NUM_MOVES), bool)
    for color in (0, 1):
        for i, (frm, to, promo) in enumerate(table):
            pf, pt = vocab_to_pgx_square(frm, color), vocab_to_pgx_square(to, color)
            from_sq[color, i] = pf
            to_last_rank[color, i] = pt % 8 == 7
            if promo == 1 and not (pf % 8 == 6 and pt % 8 == 7):
                continue  # the other side's promotion
            if promo <= 1:
                plane = to_plane[pf, pt]
                if plane >= 0:
                    action[color, i] = pf * 73 + plane
            elif pf % 8 == 6 and pt % 8 == 7:
                direction = {0: 0, 1: 1, -1: 2}[pt // 8 - pf // 8]
                action[color, i] = pf * 73 + (promo - 2) * 3 + direction
    # Inverse: pgx action -> our id, reading a last-rank pawn move as a queen promotion or not.
    inverse = np.full((2, NUM_PGX_ACTIONS), -1, np.int32)
    inverse_pawn = np.full((2, NUM_PGX_ACTIONS), -1, np.int32)
    for color in (0, 1):
        for i in range(vocab.NUM_MOVES):
            a = action[color, i]
            if a == NO_ACTION:
                continue
            if kind[i] == KIND_QUEEN_PROMOTION:
                inverse_pawn[color, a] = i
            elif kind[i] == KIND_UNDERPROMOTION:
                inverse_pawn[color, a] = i
            else:
                inverse[color, a] = i
                if not to_last_rank[color, i] or inverse_pawn[color, a] < 0:
                    inverse_pawn[color, a] = i
    return dict(
        action=action,
        kind=kind,
        from_sq=from_sq,
        to_last_rank=to_last_rank,
        inverse=inverse,
        inverse_pawn=inverse_pawn,
    )


#: The tables by name (numpy, built at first use, when pgx is imported):
#: ``VOCAB_TO_PGX`` int32 [2, 1968]: pgx action of each of our moves, per side to move (NO_ACTION
#: if none); ``MOVE_KIND`` int32 [1968]: KIND_NORMAL / KIND_QUEEN_PROMOTION / KIND_UNDERPROMOTION;
#: ``MOVE_FROM_PGX`` int32 [2, 1968]: pgx (side-relative) from-square of each move;
#: ``MOVE_TO_LAST_RANK`` bool [2, 1968]: the move lands on the mover's last rank;
#: ``PGX_TO_VOCAB`` int32 [2, 4672]: our id of a pgx action when the mover is not a pawn (-1 if
#: none); ``PGX_TO_VOCAB_PAWN`` int32 [2, 4672]: the same when the mover is a pawn (last rank =
#: "q" promotion).
_TABLE_NAMES = {
    "VOCAB_TO_PGX": "action",
    "MOVE_KIND": "kind",
    "MOVE_FROM_PGX": "from_sq",
    "MOVE_TO_LAST_RANK": "to_last_rank",
    "PGX_TO_VOCAB": "inverse",
    "PGX_TO_VOCAB_PAWN": "inverse_pawn",
}


def __getattr__(name: str) -> np.ndarray:
    """``mapping.VOCAB_TO_PGX`` and the other tables, built at their first use (PEP 562)."""
    if name in _TABLE_NAMES:
        return _build()[_TABLE_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
