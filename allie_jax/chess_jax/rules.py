"""Chess rules for batches of positions inside ``jax.jit``, in Allie's 1,968-move vocabulary.

Move application and pseudo-legal move generation are pgx's (its side-relative board: the side to
move is positive and sits on ranks 1-2); the legality filter (``movegen``) and game end are ours,
the latter so that it matches python-chess exactly:

* ``rules="standard"``: checkmate, stalemate, insufficient material, threefold repetition and the
  50-move rule all end the game (python-chess: ``is_checkmate() or is_stalemate() or
  is_insufficient_material() or is_repetition(3) or halfmove_clock >= 100``).
* ``rules="released"``: the released Allie's rule, ``is_game_over(claim_draw=False)``: mate,
  stalemate, insufficient material, the 75-move rule and fivefold repetition only.

Repetitions are counted from a ring buffer of 64-bit position keys that follow python-chess's
notion of identity (pieces, side to move, castling rights, and the en passant square only when an
en passant capture is legal). Only positions since the last capture or pawn move can repeat, and a
game is over once that span reaches 100 (standard) or 150 (released) plies, so ``HISTORY`` = 150
keys is exact for both rule sets while keeping a state at ~1.3 kB (it sits in every search node).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import compat, vocab
from allie_jax.chess_jax import mapping, movegen

pgx_chess = compat.pgx_chess()  # pgx 2.6.0's chess rules (a private module, imported at first use)

HISTORY = 150
RULES = ("standard", "released")
EMPTY, PAWN, KNIGHT, BISHOP, ROOK, QUEEN, KING = range(7)


class ChessState(NamedTuple):
    """A batch of positions (leading axis B), in pgx's side-relative coordinates.

    ``board`` holds +piece for the side to move and -piece for the opponent, squares file-major
    (a1=0, a2=1, ...) with the ranks mirrored when Black is to move.
    """

    board: jax.Array  # int8 [B, 64]
    color: jax.Array  # int32 [B]: 0 White to move, 1 Black
    castling: jax.Array  # bool [B, 2, 2]: [mover, opponent] x [queen side, king side]
    en_passant: jax.Array  # int32 [B]: side-relative en passant target square, -1 if none
    halfmove: jax.Array  # int32 [B]: plies since the last capture or pawn move
    ply: jax.Array  # int32 [B]: plies played since the initial position
    keys: jax.Array  # uint32 [B, HISTORY, 2]: position key of ply p at slot p % HISTORY
    released: jax.Array  # bool [B]: game end by the released rule (75-move, fivefold)


_rng = np.random.default_rng(20241003)
_Z_BOARD = jnp.asarray(_rng.integers(0, 2**32, (64, 13, 2), dtype=np.uint32))
_Z_COLOR = jnp.asarray(_rng.integers(0, 2**32, (2, 2), dtype=np.uint32))
_Z_CASTLING = jnp.asarray(_rng.integers(0, 2**32, (4, 2), dtype=np.uint32))
_Z_EP = jnp.asarray(_rng.integers(0, 2**32, (65, 2), dtype=np.uint32))  # index 64: none


def _table(name: str) -> jax.Array:
    """``mapping``'s table ``name`` as a constant of the program being traced (the tables, and
    pgx, load at the first trace: an engine running stored executables never builds them)."""
    return jnp.asarray(getattr(mapping, name))


# pgx square (file-major) of dark squares: a1 is dark; (file + rank) even <=> dark.
_DARK = jnp.asarray([(sq // 8 + sq % 8) % 2 == 0 for sq in range(64)])


def _pgx_state(s: ChessState) -> pgx_chess.GameState:
    """A pgx GameState view of one position (history fields are unused by the helpers we call)."""
    return pgx_chess.GameState(
        color=s.color,
        board=s.board.astype(jnp.int32),
        castling_rights=s.castling,
        en_passant=s.en_passant,
        halfmove_count=s.halfmove,
        fullmove_count=jnp.int32(1),
        hash_history=jnp.zeros((1, 2), jnp.uint32),
        board_history=jnp.zeros((1, 64), jnp.int32),
        legal_action_mask=jnp.zeros((1,), jnp.bool_),
        step_count=s.ply,
    )


def _has_legal_en_passant(g: pgx_chess.GameState) -> jax.Array:
    """Whether the mover has a legal en passant capture (python-chess keys the ep square on it)."""
    to = g.en_passant

    def legal(from_: jax.Array) -> jax.Array:
        ok = (to >= 0) & (from_ >= 0) & (from_ < 64)
        safe_from = jnp.clip(from_, 0, 63)
        ok &= (g.board[safe_from] == PAWN) & (g.board[jnp.clip(to - 1, 0, 63)] == -PAWN)
        after = pgx_chess._apply_move(g, pgx_chess.Action(from_=safe_from, to=to))
        return ok & ~pgx_chess._is_checked(after)

    return jax.vmap(legal)(jnp.stack([to - 9, to + 7])).any()


def _position_key(g: pgx_chess.GameState) -> jax.Array:
    """uint32 [2]: a Zobrist key of (pieces, side to move, castling rights, legal ep square)."""
    key = jax.lax.reduce(
        _Z_BOARD[jnp.arange(64), g.board + 6], jnp.uint32(0), jax.lax.bitwise_xor, (0,)
    )
    key ^= _Z_COLOR[g.color]
    castle = jnp.where(g.castling_rights.reshape(4, 1), _Z_CASTLING, jnp.uint32(0))
    key ^= jax.lax.reduce(castle, jnp.uint32(0), jax.lax.bitwise_xor, (0,))
    ep = jnp.where(_has_legal_en_passant(g), g.en_passant, 64)
    return key ^ _Z_EP[ep]


def _flip(g: pgx_chess.GameState) -> pgx_chess.GameState:
    """Hand the move to the other side: mirror ranks, negate pieces, swap castling rights."""
    return g._replace(
        board=-jnp.flip(g.board.reshape(8, 8), axis=1).reshape(64),
        color=1 - g.color,
        en_passant=pgx_chess._flip_pos(g.en_passant),
        castling_rights=g.castling_rights[::-1],
    )


def _initial_one(released: jax.Array) -> ChessState:
    g = pgx_chess.GameState()
    keys = jnp.zeros((HISTORY, 2), jnp.uint32).at[0].set(_position_key(g))
    return ChessState(
        board=g.board.astype(jnp.int8),
        color=jnp.int32(0),
        castling=g.castling_rights,
        en_passant=jnp.int32(-1),
        halfmove=jnp.int32(0),
        ply=jnp.int32(0),
        keys=keys,
        released=released,
    )


def _check_rules(rules: str) -> bool:
    if rules not in RULES:
        raise ValueError(f"rules must be one of {RULES}, got {rules!r}")
    return rules == "released"


def initial_state(batch_size: int, rules: str = "standard") -> ChessState:
    """``batch_size`` copies of the starting position."""
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    released = jnp.full((batch_size,), _check_rules(rules))
    return jax.vmap(_initial_one)(released)


def _apply_one(s: ChessState, move_id: jax.Array) -> ChessState:
    action = _table("VOCAB_TO_PGX")[s.color, jnp.clip(move_id, 0, vocab.NUM_MOVES - 1)]
    action = jnp.minimum(action, mapping.NUM_PGX_ACTIONS - 1)  # an illegal id must not crash
    g = pgx_chess._apply_move(_pgx_state(s), pgx_chess.Action._from_label(action))
    g = _flip(g)
    ply = s.ply + 1
    keys = s.keys.at[ply % HISTORY].set(_position_key(g))
    return ChessState(
        board=g.board.astype(jnp.int8),
        color=g.color,
        castling=g.castling_rights,
        en_passant=g.en_passant,
        halfmove=g.halfmove_count,
        ply=ply,
        keys=keys,
        released=s.released,
    )


def _legal_mask_one(s: ChessState) -> jax.Array:
    pgx_mask = movegen.legal_action_mask(_pgx_state(s))
    pgx_mask = jnp.concatenate([pgx_mask, jnp.zeros((1,), jnp.bool_)])  # NO_ACTION column
    legal = pgx_mask[_table("VOCAB_TO_PGX")[s.color]]
    pawn = s.board[_table("MOVE_FROM_PGX")[s.color]] == PAWN
    promoting = pawn & _table("MOVE_TO_LAST_RANK")[s.color]
    kind = _table("MOVE_KIND")
    piece_ok = jnp.where(
        kind == mapping.KIND_NORMAL,
        ~promoting,
        jnp.where(kind == mapping.KIND_QUEEN_PROMOTION, pawn, True),
    )
    return legal & piece_ok


def _insufficient_material(board: jax.Array) -> jax.Array:
    """python-chess's ``is_insufficient_material`` (both sides unable to mate)."""
    piece = jnp.abs(board)
    bishops = piece == BISHOP
    any_knight = (piece == KNIGHT).any()
    any_pawn = (piece == PAWN).any()
    bishops_same_colour = ~(bishops & _DARK).any() | ~(bishops & ~_DARK).any()

    def side(sign: int) -> jax.Array:
        mine = sign * board > 0
        theirs = sign * board < 0
        heavy = (mine & ((piece == PAWN) | (piece == ROOK) | (piece == QUEEN))).any()
        my_knight = (mine & (piece == KNIGHT)).any()
        my_bishop = (mine & bishops).any()
        knight_ok = (mine.sum() <= 2) & ~(theirs & (piece != KING) & (piece != QUEEN)).any()
        bishop_ok = bishops_same_colour & ~any_pawn & ~any_knight
        return ~heavy & jnp.where(my_knight, knight_ok, jnp.where(my_bishop, bishop_ok, True))

    return side(1) & side(-1)


def _repetitions(s: ChessState) -> jax.Array:
    """How many times the current position has occurred since the last capture or pawn move."""
    slots = jnp.arange(HISTORY)
    age = (s.ply - slots) % HISTORY
    window = (age >= 1) & (age <= s.halfmove) & (age <= s.ply)
    current = s.keys[s.ply % HISTORY]
    same = (s.keys == current).all(axis=-1)
    return 1 + (window & same).sum()


def _outcome_one(s: ChessState, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    g = _pgx_state(s)
    no_moves = ~mask.any()
    mate = no_moves & pgx_chess._is_checked(g)
    reps = _repetitions(s)
    draw_rule = jnp.where(
        s.released,
        (s.halfmove >= 150) | (reps >= 5),
        (s.halfmove >= 100) | (reps >= 3),
    )
    done = no_moves | _insufficient_material(g.board) | draw_rule
    loser_sign = jnp.where(s.color == 0, -1.0, 1.0)  # the mated side is the side to move
    result = jnp.where(mate, loser_sign, 0.0).astype(jnp.float32)
    return done, result


@jax.jit
def apply(state: ChessState, move_ids: jax.Array) -> ChessState:
    """Play ``move_ids`` int32 [B] (must be legal; an illegal id gives an unspecified position)."""
    return jax.vmap(_apply_one)(state, move_ids.astype(jnp.int32))


@jax.jit
def legal_mask(state: ChessState) -> jax.Array:
    """bool [B, 1968]: the legal moves of each position (also of a finished game: see outcome)."""
    return jax.vmap(_legal_mask_one)(state)


@jax.jit
def outcome(state: ChessState, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(done bool [B], result_white float32 [B]: +1 White mated Black, -1 the reverse, else 0).

    Pass ``mask`` (``legal_mask(state)``) when you already have it, to skip recomputing it.
    """
    if mask is None:
        mask = legal_mask(state)
    return jax.vmap(_outcome_one)(state, mask)


@jax.jit
def white_to_move(state: ChessState) -> jax.Array:
    """bool [B]."""
    return state.color == 0


@jax.jit
def is_check(state: ChessState) -> jax.Array:
    """bool [B]: the side to move is in check."""
    return jax.vmap(lambda s: pgx_chess._is_checked(_pgx_state(s)))(state)


@jax.jit
def _replay(state: ChessState, move_ids: jax.Array, lengths: jax.Array) -> ChessState:
    def step(s: ChessState, xs: tuple[jax.Array, jax.Array]) -> tuple[ChessState, None]:
        t, ids = xs
        moved = apply(s, ids)
        active = t < lengths
        s = jax.tree.map(
            lambda new, old: jnp.where(active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            moved,
            s,
        )
        return s, None

    steps = jnp.arange(move_ids.shape[1], dtype=jnp.int32)
    state, _ = jax.lax.scan(step, state, (steps, move_ids.T))
    return state


def replay(move_ids: jax.Array, lengths: jax.Array, rules: str = "standard") -> ChessState:
    """Positions after the first ``lengths[b]`` moves of each row of ``move_ids`` int32 [B, T].

    Replaying the whole game (rather than setting up a FEN) is what gives repetition history.
    The moves must be legal; entries past a row's length are ignored.
    """
    move_ids = jnp.asarray(move_ids)
    lengths = jnp.asarray(lengths)
    if move_ids.ndim != 2:
        raise ValueError(f"move_ids must be [B, T], got shape {move_ids.shape}")
    if lengths.shape != move_ids.shape[:1]:
        raise ValueError(f"lengths must be [B]={move_ids.shape[:1]}, got shape {lengths.shape}")
    if not jnp.issubdtype(move_ids.dtype, jnp.integer):
        raise ValueError(f"move_ids must be integers, got {move_ids.dtype}")
    state = initial_state(move_ids.shape[0], rules)
    return _replay(state, move_ids.astype(jnp.int32), lengths.astype(jnp.int32))


# ----------------------------------------------------------------- repetition features (public)
def _quiet_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (side to move, move): from/to squares in the frame of the position after the move
    (pgx's, mirrored for the new side to move) and whether the move is a king's two-file step."""
    table = vocab.move_table()
    frm = np.zeros((2, vocab.NUM_MOVES), np.int32)
    to = np.zeros((2, vocab.NUM_MOVES), np.int32)
    for color in (0, 1):
        for i, (f, t, _) in enumerate(table):
            frm[color, i] = mapping.vocab_to_pgx_square(int(f), 1 - color)
            to[color, i] = mapping.vocab_to_pgx_square(int(t), 1 - color)
    two_files = np.abs(table[:, 0] % 8 - table[:, 1] % 8) == 2
    return frm, to, two_files


_CHILD_FROM, _CHILD_TO, _TWO_FILES = (jnp.asarray(x) for x in _quiet_tables())


def _quiet(s: ChessState, mask: jax.Array) -> jax.Array:
    """bool [1968]: legal moves that can lead back to an earlier position (see below)."""
    piece = s.board[_table("MOVE_FROM_PGX")[s.color]].astype(jnp.int32)
    flipped_to = -jnp.flip(s.board.reshape(8, 8), axis=1).reshape(64)[_CHILD_TO[s.color]]
    quiet = mask & (piece != PAWN) & (flipped_to == EMPTY) & ~((piece == KING) & _TWO_FILES)
    return quiet & (s.halfmove >= 3)


def _child_counts_one(s: ChessState, moves: jax.Array) -> jax.Array:
    """int32 [M]: earlier occurrences (capped at 2) of the position after each of ``moves``
    (quiet moves: see ``child_repetitions``).

    The key is the current one re-keyed incrementally in the new side's frame (the piece leaves
    ``from`` for ``to``, the side flips, the en passant square goes), compared with the keys since
    the last capture or pawn move.
    """
    color = s.color
    # the mover's (positive) piece
    piece = s.board[_table("MOVE_FROM_PGX")[color][moves]].astype(jnp.int32)
    flipped = -jnp.flip(s.board.reshape(8, 8), axis=1).reshape(64).astype(jnp.int32)
    base = jax.lax.reduce(
        _Z_BOARD[jnp.arange(64), flipped + 6], jnp.uint32(0), jax.lax.bitwise_xor, (0,)
    )
    base ^= _Z_COLOR[1 - color]
    castle = jnp.where(s.castling[::-1].reshape(4, 1), _Z_CASTLING, jnp.uint32(0))
    base ^= jax.lax.reduce(castle, jnp.uint32(0), jax.lax.bitwise_xor, (0,))
    base ^= _Z_EP[64]
    f, t = _CHILD_FROM[color][moves], _CHILD_TO[color][moves]
    theirs = 6 - piece  # the piece as the new side sees it (−piece), offset by 6 as in the key
    key = base[None] ^ _Z_BOARD[f, theirs] ^ _Z_BOARD[f, 6] ^ _Z_BOARD[t, 6] ^ _Z_BOARD[t, theirs]
    slots = jnp.arange(HISTORY)
    age = (s.ply - slots) % HISTORY
    window = (age >= 1) & (age <= s.halfmove) & (age <= s.ply)
    same = (key[:, None, :] == s.keys[None]).all(-1) & window[None]
    return jnp.minimum(same.sum(-1), 2).astype(jnp.int32)


# Quiet legal moves a position is checked for in the compact pass (a batch where some position
# has more takes the pass over every move): real positions have 20-40.
_COMPACT_MOVES = 64


@jax.jit
def child_repetitions(state: ChessState, mask: jax.Array | None = None) -> jax.Array:
    """int32 [B, 1968]: per legal move, earlier occurrences (capped at 2) of the position it
    leads to; −1 for illegal moves (the board model's ``move_info``).

    Only a quiet move (no pawn, no capture, no castling) with at least 3 plies since the last
    capture or pawn move can lead back to an earlier position: the others are irreversible or
    change the castling rights. Those are re-keyed: the first ``_COMPACT_MOVES`` of each
    position, or every move when some position of the batch has more, none when no position has
    any.
    """
    if mask is None:
        mask = legal_mask(state)
    quiet = jax.vmap(_quiet)(state, mask)
    base = jnp.where(mask, 0, -1).astype(jnp.int32)

    def none():
        return base

    def compact():
        def one(s, q, row):
            moves = jnp.nonzero(q, size=_COMPACT_MOVES, fill_value=0)[0].astype(jnp.int32)
            real = jnp.arange(_COMPACT_MOVES) < q.sum()
            cols = jnp.where(real, moves, vocab.NUM_MOVES)  # padding writes are dropped
            return row.at[cols].set(_child_counts_one(s, moves), mode="drop")

        return jax.vmap(one)(state, quiet, base)

    def full():
        moves = jnp.arange(vocab.NUM_MOVES, dtype=jnp.int32)
        counts = jax.vmap(_child_counts_one, in_axes=(0, None))(state, moves)
        return jnp.where(quiet, counts, base)

    most = quiet.sum(-1).max()
    branch = jnp.where(most == 0, 0, jnp.where(most <= _COMPACT_MOVES, 1, 2))
    return jax.lax.switch(branch, [none, compact, full])


@jax.jit
def repetitions(state: ChessState) -> jax.Array:
    """int32 [B]: occurrences of each current position since the last capture or pawn move,
    this one included (1 = first time)."""
    return jax.vmap(_repetitions)(state)


@jax.jit
def legal_en_passant(state: ChessState) -> jax.Array:
    """bool [B]: the side to move has a legal en passant capture (python-chess keys ep on it).

    Checked only when some position of the batch has an en passant square (after a double
    pawn push): the check plays both candidate captures."""
    return jax.lax.cond(
        (state.en_passant >= 0).any(),
        lambda: jax.vmap(lambda s: _has_legal_en_passant(_pgx_state(s)))(state),
        lambda: jnp.zeros(state.color.shape, bool),
    )
