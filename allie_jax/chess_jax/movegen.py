"""Legal moves of one side-relative position as pgx's 4,672-action mask, with a cheap legality test.

pgx generates the pseudo-legal moves and then plays each of up to 200 of them to see whether the
mover's king is attacked afterwards; that test is ~85% of its cost, and the 200 cap could drop
moves in contrived positions. Here the pseudo-legal moves are pgx's, but legality comes from
checks and pins computed once per position (the usual engine method):

* a king move is legal if its destination is not attacked once the king has left its square;
* another piece's move must land on a square that resolves a single check (capture or block; none
  resolve a double check) and, if the piece is pinned, stay on the pin line;
* en passant (which can expose the king along the rank) and castling keep pgx's exact tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import compat

pgx_chess = compat.pgx_chess()  # pgx 2.6.0's chess rules (a private module, imported at first use)

PAWN, KNIGHT, BISHOP, ROOK, QUEEN, KING = 1, 2, 3, 4, 5, 6
_DIRECTIONS = ((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (1, -1), (-1, 1), (-1, -1))  # (file, rank)


def _build_rays() -> np.ndarray:
    """int32 [64, 8, 7]: squares along each direction from a square (pgx numbering), -1 past the edge."""
    rays = -np.ones((64, 8, 7), np.int32)
    for sq in range(64):
        file, rank = sq // 8, sq % 8
        for d, (df, dr) in enumerate(_DIRECTIONS):
            for i in range(7):
                f, r = file + df * (i + 1), rank + dr * (i + 1)
                if 0 <= f < 8 and 0 <= r < 8:
                    rays[sq, d, i] = f * 8 + r
    return rays


def _build_knights() -> np.ndarray:
    jumps = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
    out = -np.ones((64, 8), np.int32)
    for sq in range(64):
        file, rank = sq // 8, sq % 8
        for j, (df, dr) in enumerate(jumps):
            f, r = file + df, rank + dr
            if 0 <= f < 8 and 0 <= r < 8:
                out[sq, j] = f * 8 + r
    return out


def _build_pawn_attackers() -> np.ndarray:
    """int32 [64, 2]: squares from which an opponent pawn attacks a square (the mover plays up)."""
    out = -np.ones((64, 2), np.int32)
    for sq in range(64):
        file, rank = sq // 8, sq % 8
        for j, df in enumerate((-1, 1)):
            if 0 <= file + df < 8 and rank + 1 < 8:
                out[sq, j] = (file + df) * 8 + rank + 1
    return out


_RAYS = jnp.asarray(_build_rays())
_KNIGHTS = jnp.asarray(_build_knights())
_PAWN_ATTACKERS = jnp.asarray(_build_pawn_attackers())
_ORTHOGONAL = jnp.asarray([True] * 4 + [False] * 4)
_NO_SQUARE = 64  # sentinel column of 65-wide scratch arrays


def _checks_and_pins(board: jax.Array, king: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(target_ok bool [64], pin_dir int32 [64] (-1 = not pinned), pin_line bool [8, 65])."""
    ray = _RAYS[king]  # [8, 7]
    on_board = ray >= 0
    values = jnp.where(on_board, board[jnp.clip(ray, 0, 63)], 0)
    occupied = values != 0
    steps = jnp.arange(7)
    first = jnp.argmax(occupied, axis=1)
    has_first = occupied.any(axis=1)
    behind = occupied & (steps[None, :] > first[:, None])
    second = jnp.argmax(behind, axis=1)
    has_second = behind.any(axis=1)
    first_value = jnp.take_along_axis(values, first[:, None], axis=1)[:, 0]
    second_value = jnp.take_along_axis(values, second[:, None], axis=1)[:, 0]
    slider = jnp.where(_ORTHOGONAL, -ROOK, -BISHOP)

    def attacks_along(v: jax.Array) -> jax.Array:
        return (v == -QUEEN) | (v == slider)

    slider_check = has_first & attacks_along(first_value)  # [8]
    pinned = has_first & (first_value > 0) & has_second & attacks_along(second_value)

    knight_sq = _KNIGHTS[king]
    knight_check = (knight_sq >= 0) & (board[jnp.clip(knight_sq, 0, 63)] == -KNIGHT)
    pawn_sq = _PAWN_ATTACKERS[king]
    pawn_check = (pawn_sq >= 0) & (board[jnp.clip(pawn_sq, 0, 63)] == -PAWN)
    checkers = slider_check.sum() + knight_check.sum() + pawn_check.sum()

    # Squares that answer a single check: the checker and, for a slider, the squares between.
    check_line = slider_check[:, None] & on_board & (steps[None, :] <= first[:, None])
    block = jnp.zeros(65, jnp.bool_)
    block = block.at[jnp.where(check_line, ray, _NO_SQUARE)].set(True)
    block = block.at[jnp.where(knight_check, knight_sq, _NO_SQUARE)].set(True)
    block = block.at[jnp.where(pawn_check, pawn_sq, _NO_SQUARE)].set(True)
    target_ok = jnp.where(checkers == 0, True, (checkers == 1) & block[:64])

    pinned_square = jnp.take_along_axis(ray, first[:, None], axis=1)[:, 0]
    pin_dir = jnp.full(65, -1, jnp.int32)
    pin_dir = pin_dir.at[jnp.where(pinned, pinned_square, _NO_SQUARE)].set(jnp.arange(8))
    line = pinned[:, None] & on_board & (steps[None, :] <= second[:, None])
    pin_line = jnp.zeros((8, 65), jnp.bool_)
    pin_line = pin_line.at[jnp.arange(8)[:, None], jnp.where(line, ray, _NO_SQUARE)].set(True)
    return target_ok, pin_dir[:64], pin_line


def legal_action_mask(state: pgx_chess.GameState) -> jax.Array:
    """bool [4672]: the same mask as pgx's ``_legal_action_mask``, for one position."""
    board = state.board
    king = jnp.argmax(board == KING)
    target_ok, pin_dir, pin_line = _checks_and_pins(board, king)

    # King destinations: not attacked with the king lifted off its square.
    lifted = state._replace(board=board.at[king].set(0))
    king_to = pgx_chess.LEGAL_DEST[KING, king, :8]
    safe = ~jax.vmap(pgx_chess._is_attacked, in_axes=(None, 0))(lifted, jnp.clip(king_to, 0, 63))
    king_ok = jnp.zeros(65, jnp.bool_).at[jnp.where(king_to >= 0, king_to, _NO_SQUARE)].set(safe)

    def moves_from(from_: jax.Array) -> jax.Array:
        piece = board[jnp.clip(from_, 0, 63)]

        def label(to: jax.Array) -> jax.Array:
            safe_to = jnp.clip(to, 0, 63)
            ok = (from_ >= 0) & (piece > 0) & (to >= 0) & (board[safe_to] <= 0)
            between = pgx_chess.BETWEEN[from_, safe_to]
            clear = ((between < 0) | (board[jnp.clip(between, 0, 63)] == 0)).all()
            ok &= pgx_chess.CAN_MOVE[piece, from_, safe_to] & clear
            same_file = from_ // 8 == safe_to // 8
            pawn_ok = (same_file & (board[safe_to] == 0)) | (~same_file & (board[safe_to] < 0))
            ok &= (piece != PAWN) | pawn_ok
            d = pin_dir[jnp.clip(from_, 0, 63)]
            not_king = target_ok[safe_to] & ((d < 0) | pin_line[jnp.maximum(d, 0), safe_to])
            ok &= jnp.where(piece == KING, king_ok[safe_to], not_king)
            return jnp.where(ok, from_ * 73 + pgx_chess.TO_PLANE[from_, safe_to], -1)

        return jax.vmap(label)(pgx_chess.LEGAL_DEST[piece, jnp.clip(from_, 0, 63)])

    pieces = jnp.nonzero(board > 0, size=16, fill_value=-1)[0]
    labels = jax.vmap(moves_from)(pieces).reshape(-1)
    mask = jnp.zeros(64 * 73 + 1, jnp.bool_)  # last column: sentinel for -1
    mask = mask.at[jnp.where(labels >= 0, labels, 64 * 73)].set(True)

    # En passant: played out in full, since the capture can uncover the king along the rank.
    to = state.en_passant

    def en_passant(from_: jax.Array) -> jax.Array:
        safe_from = jnp.clip(from_, 0, 63)
        ok = (from_ >= 0) & (from_ < 64) & (to >= 0)
        ok &= (board[safe_from] == PAWN) & (board[jnp.clip(to - 1, 0, 63)] == -PAWN)
        after = pgx_chess._apply_move(state, pgx_chess.Action(from_=safe_from, to=to))
        ok &= ~pgx_chess._is_checked(after)
        return jnp.where(
            ok, safe_from * 73 + pgx_chess.TO_PLANE[safe_from, jnp.clip(to, 0, 63)], 64 * 73
        )

    mask = mask.at[jax.vmap(en_passant)(jnp.stack([to - 9, to + 7]))].set(True)
    mask = mask.at[64 * 73].set(False)

    # Castling and under-promotions: pgx's own rules.
    b = board
    queen_side = state.castling_rights[0, 0] & (b[0] == ROOK) & (b[8] == 0) & (b[16] == 0)
    queen_side &= (b[24] == 0) & (b[32] == KING)
    king_side = state.castling_rights[0, 1] & (b[32] == KING) & (b[40] == 0) & (b[48] == 0)
    king_side &= b[56] == ROOK
    attacked = jax.vmap(pgx_chess._is_attacked, in_axes=(None, 0))(
        state, jnp.int32([16, 24, 32, 40, 48])
    )
    mask = mask.at[2364].set(mask[2364] | (queen_side & ~attacked[:3].any()))
    mask = mask.at[2367].set(mask[2367] | (king_side & ~attacked[2:].any()))

    from_rank7 = jnp.int32([6, 14, 22, 30, 38, 46, 54, 62])
    under = from_rank7[None, :] * 73 + jnp.arange(9)[:, None]  # [9 planes, 8 files]
    under_to = pgx_chess.FROM_PLANE[from_rank7[None, :], jnp.arange(9)[:, None]]
    plain = (
        from_rank7[None, :] * 73
        + pgx_chess.TO_PLANE[from_rank7[None, :], jnp.clip(under_to, 0, 63)]
    )
    ok = (board[from_rank7][None, :] == PAWN) & (under_to >= 0) & mask[plain]
    mask = mask.at[jnp.where(ok, under, 64 * 73)].set(True)
    return mask[:-1]
