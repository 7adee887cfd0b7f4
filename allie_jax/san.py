"""A small SAN -> UCI resolver for reading PGN fast, with python-chess as the referee.

Reading a game needs only one thing from a board: turning each SAN move into its UCI move and
rejecting the moves python-chess would reject. ``chess.Board.parse_san`` + ``push`` does that
through full bitboard move generation and a move stack, which was a third of the PGN reader's
time. ``SanBoard`` keeps a 64-square mailbox, finds the pieces of the SAN's type that can reach
the target square, and checks king safety only where it can fail: the king moves, the side is in
check, the piece stands on a line with its own king, or the move is en passant.

Anything it does not resolve to exactly one legal move (no candidate, several candidates,
unusual syntax such as ``Kg1`` for castling or ``e2e4``) goes to python-chess on the same
position (``to_chess``), so errors and odd-but-legal moves come out exactly as
``parse_san`` gives them (tests/test_san.py compares the two on real and random games and on
mutated SAN).
"""

from __future__ import annotations

import re

import chess

__all__ = ["SanBoard"]

# Piece codes: type (1 pawn .. 6 king) | 8 for black; 0 is an empty square.
PAWN, KNIGHT, BISHOP, ROOK, QUEEN, KING = 1, 2, 3, 4, 5, 6
_PIECE_LETTERS = {"N": KNIGHT, "B": BISHOP, "R": ROOK, "Q": QUEEN, "K": KING}
_PROMO_LETTERS = {c: t for c, t in zip("nbrq", (KNIGHT, BISHOP, ROOK, QUEEN), strict=True)}
_PROMO_LETTERS.update({c.upper(): t for c, t in _PROMO_LETTERS.items()})
_PROMO_UCI = {KNIGHT: "n", BISHOP: "b", ROOK: "r", QUEEN: "q"}

_NAMES = [f + r for r in "12345678" for f in "abcdefgh"]
_UCI = [a + b for a in _NAMES for b in _NAMES]  # _UCI[frm * 64 + to]

_ORTH = ((0, 1), (0, -1), (1, 0), (-1, 0))
_DIAG = ((1, 1), (1, -1), (-1, 1), (-1, -1))


def _on(f: int, r: int) -> bool:
    return 0 <= f < 8 and 0 <= r < 8


def _ray(sq: int, df: int, dr: int) -> tuple[int, ...]:
    f, r = sq & 7, sq >> 3
    out = []
    f, r = f + df, r + dr
    while _on(f, r):
        out.append(r * 8 + f)
        f, r = f + df, r + dr
    return tuple(out)


def _steps(sq: int, deltas) -> tuple[int, ...]:
    f, r = sq & 7, sq >> 3
    return tuple((r + dr) * 8 + f + df for df, dr in deltas if _on(f + df, r + dr))


_KNIGHT_D = ((1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2))
_KING_D = _ORTH + _DIAG
KNIGHT_ADJ = [_steps(s, _KNIGHT_D) for s in range(64)]
KING_ADJ = [_steps(s, _KING_D) for s in range(64)]
ORTH_RAYS = [tuple(r for r in (_ray(s, *d) for d in _ORTH) if r) for s in range(64)]
DIAG_RAYS = [tuple(r for r in (_ray(s, *d) for d in _DIAG) if r) for s in range(64)]
# PAWN_FROM[color][sq]: squares from which a pawn of ``color`` (0 white, 1 black) attacks sq.
PAWN_FROM = [
    [_steps(s, ((-1, -1), (1, -1))) for s in range(64)],
    [_steps(s, ((-1, 1), (1, 1))) for s in range(64)],
]
# Lines between squares, indexed a * 64 + b: kind 1 orthogonal, 2 diagonal, 0 not aligned;
# BETWEEN the squares strictly between; BEYOND the squares past b on the ray from a through b.
LINE_KIND = [0] * 4096
BETWEEN: list[tuple[int, ...]] = [()] * 4096
BEYOND: list[tuple[int, ...]] = [()] * 4096
for _a in range(64):
    for _kind, _dirs in ((1, _ORTH), (2, _DIAG)):
        for _d in _dirs:
            _r = _ray(_a, *_d)
            for _i, _b in enumerate(_r):
                LINE_KIND[_a * 64 + _b] = _kind
                BETWEEN[_a * 64 + _b] = _r[:_i]
                BEYOND[_a * 64 + _b] = _r[_i + 1 :]

_SAN_PARTS_RE = re.compile(r"^([NBRQK])?([a-h])?([1-8])?x?([a-h][1-8])(?:=?([NBRQnbrq]))?[+#]?$")
_CASTLES = {
    **{s: "K" for s in ("O-O", "O-O+", "O-O#", "0-0", "0-0+", "0-0#")},
    **{s: "Q" for s in ("O-O-O", "O-O-O+", "O-O-O#", "0-0-0", "0-0-0+", "0-0-0#")},
}
# SAN string -> parsed parts; None marks syntax the fast path leaves to python-chess.
_PARTS_CACHE: dict[str, tuple | str | None] = {}
_PARTS_CACHE_MAX = 100_000


def _parse_parts(san: str):
    if (castle := _CASTLES.get(san)) is not None:
        return castle
    m = _SAN_PARTS_RE.match(san)
    if m is None:
        return None
    piece, file_, rank, to_name, promo = m.groups()
    ptype = _PIECE_LETTERS[piece] if piece else PAWN
    if ptype == PAWN and file_ and rank:
        return None  # "e2e4": python-chess's find_move path (accepts any piece's move)
    if promo and ptype != PAWN:
        return None  # "Nf8=Q": illegal, python-chess words the error
    return (
        ptype,
        ord(file_) - 97 if file_ else -1,
        ord(rank) - 49 if rank else -1,
        _NAMES.index(to_name),
        _PROMO_LETTERS[promo] if promo else 0,
    )


def _attacked(b: list[int], sq: int, by: int) -> bool:
    """Whether side ``by`` (0 white, 1 black) attacks ``sq`` on board ``b``."""
    base = by << 3
    code = base | KNIGHT
    for s in KNIGHT_ADJ[sq]:
        if b[s] == code:
            return True
    code = base | PAWN
    for s in PAWN_FROM[by][sq]:
        if b[s] == code:
            return True
    code = base | KING
    for s in KING_ADJ[sq]:
        if b[s] == code:
            return True
    queen = base | QUEEN
    code = base | ROOK
    for ray in ORTH_RAYS[sq]:
        for s in ray:
            p = b[s]
            if p:
                if p == code or p == queen:
                    return True
                break
    code = base | BISHOP
    for ray in DIAG_RAYS[sq]:
        for s in ray:
            p = b[s]
            if p:
                if p == code or p == queen:
                    return True
                break
    return False


_START = (
    [ROOK, KNIGHT, BISHOP, QUEEN, KING, BISHOP, KNIGHT, ROOK]
    + [PAWN] * 8
    + [0] * 32
    + [PAWN | 8] * 8
    + [ROOK | 8, KNIGHT | 8, BISHOP | 8, QUEEN | 8, KING | 8, BISHOP | 8, KNIGHT | 8, ROOK | 8]
)
# Castling right bits: 1 white O-O, 2 white O-O-O, 4 black O-O, 8 black O-O-O. A move from or
# to one of these squares clears the rights that need the piece standing there.
_RIGHTS_MASK = [15] * 64
for _sq, _bits in ((4, 3), (7, 1), (0, 2), (60, 12), (63, 4), (56, 8)):
    _RIGHTS_MASK[_sq] = 15 & ~_bits


class SanBoard:
    """A standard-chess position (the starting one unless ``from_fen``); ``push_san`` plays SAN."""

    __slots__ = ("board", "turn", "kings", "ep", "rights", "in_check", "history")

    def __init__(self) -> None:
        self.board = list(_START)
        self.turn = 0  # 0 white, 1 black
        self.kings = [4, 60]
        self.ep = -1  # the square a pawn just skipped (python-chess's ep_square), or -1
        self.rights = 15
        self.in_check = False
        self.history: list[str] = []  # UCI moves played

    @classmethod
    def from_fen(cls, fen: str) -> SanBoard:
        """A standard-chess position given as FEN (python-chess reads it; errors are its own)."""
        ref = chess.Board(fen)
        out = cls()
        out.board = [0] * 64
        for sq, piece in ref.piece_map().items():
            out.board[sq] = piece.piece_type | (0 if piece.color else 8)
        out.turn = 0 if ref.turn else 1
        white_king, black_king = ref.king(chess.WHITE), ref.king(chess.BLACK)
        if white_king is None or black_king is None:
            raise ValueError(f"FEN without both kings: {fen!r}")
        out.kings = [white_king, black_king]
        out.ep = ref.ep_square if ref.ep_square is not None else -1
        out.rights = (
            ref.has_kingside_castling_rights(chess.WHITE)
            | ref.has_queenside_castling_rights(chess.WHITE) << 1
            | ref.has_kingside_castling_rights(chess.BLACK) << 2
            | ref.has_queenside_castling_rights(chess.BLACK) << 3
        )
        out.in_check = ref.is_check()
        return out

    def copy(self) -> SanBoard:
        other = SanBoard.__new__(SanBoard)
        other.board = self.board[:]
        other.turn = self.turn
        other.kings = self.kings[:]
        other.ep = self.ep
        other.rights = self.rights
        other.in_check = self.in_check
        other.history = self.history[:]
        return other

    def push_san(self, san: str) -> str:
        """Play ``san`` and return its UCI move; raises python-chess's ``parse_san`` errors."""
        parts = _PARTS_CACHE.get(san, False)
        if parts is False:
            parts = _parse_parts(san)
            if len(_PARTS_CACHE) >= _PARTS_CACHE_MAX:
                _PARTS_CACHE.clear()
            _PARTS_CACHE[san] = parts
        if parts is None:
            return self._fallback(san)
        if parts.__class__ is str:
            return self._castle(san, parts)
        ptype, from_file, from_rank, to, promo = parts
        b = self.board
        us = self.turn
        mine = (us << 3) | ptype
        target = b[to]
        if target and target >> 3 == us:
            return self._fallback(san)
        cands: list[int]
        if ptype == PAWN:
            if (to < 8) if us == 0 else (to >= 56):
                return self._fallback(san)  # a pawn cannot reach its own back rank
            if (promo != 0) != (to < 8 or to >= 56):
                return self._fallback(san)  # promotion missing, or not on the last rank
            if from_file < 0 or from_file == to & 7:
                if target:
                    return self._fallback(san)
                one = to - 8 if us == 0 else to + 8
                if b[one] == mine:
                    cands = [one]
                elif not b[one] and (to >> 3) == (3 if us == 0 else 4):
                    two = one - 8 if us == 0 else one + 8
                    cands = [two] if b[two] == mine else []
                else:
                    cands = []
            else:
                if not target and to != self.ep:
                    return self._fallback(san)
                cands = [s for s in PAWN_FROM[us][to] if s & 7 == from_file and b[s] == mine]
        elif ptype == KNIGHT:
            cands = [s for s in KNIGHT_ADJ[to] if b[s] == mine]
        elif ptype == KING:
            cands = [s for s in KING_ADJ[to] if b[s] == mine]
        else:
            cands = []
            if ptype != BISHOP:
                for ray in ORTH_RAYS[to]:
                    for s in ray:
                        p = b[s]
                        if p:
                            if p == mine:
                                cands.append(s)
                            break
            if ptype != ROOK:
                for ray in DIAG_RAYS[to]:
                    for s in ray:
                        p = b[s]
                        if p:
                            if p == mine:
                                cands.append(s)
                            break
        if from_file >= 0 and ptype != PAWN:
            cands = [s for s in cands if s & 7 == from_file]
        if from_rank >= 0:
            cands = [s for s in cands if s >> 3 == from_rank]
        if len(cands) == 1:
            frm = cands[0]
            if not self._legal(frm, to, ptype):
                return self._fallback(san)
        else:
            legal = [s for s in cands if self._legal(s, to, ptype)]
            if len(legal) != 1:
                return self._fallback(san)
            frm = legal[0]
        return self._play(frm, to, ptype, promo)

    # -----------------------------------------------------------------------------------------

    def _legal(self, frm: int, to: int, ptype: int) -> bool:
        """Whether the pseudo-legal move frm -> to leaves the mover's king safe."""
        b = self.board
        us = self.turn
        them = us ^ 1
        if ptype == KING:
            moved, captured = b[frm], b[to]
            b[frm] = 0
            b[to] = moved
            safe = not _attacked(b, to, them)
            b[frm] = moved
            b[to] = captured
            return safe
        king = self.kings[us]
        ep_capture = ptype == PAWN and to == self.ep and (frm & 7) != (to & 7)
        if not self.in_check and not ep_capture:
            kind = LINE_KIND[king * 64 + frm]
            if not kind:
                return True  # not on a line with its king: cannot be pinned
            for s in BETWEEN[king * 64 + frm]:
                if b[s]:
                    return True
            slider = (them << 3) | (ROOK if kind == 1 else BISHOP)
            queen = (them << 3) | QUEEN
            for s in BEYOND[king * 64 + frm]:
                p = b[s]
                if p:
                    if p != slider and p != queen:
                        return True
                    # Pinned: legal only when it stays on the ray from the king to the pinner.
                    ray = BEYOND[king * 64 + frm]
                    return to in ray or to in BETWEEN[king * 64 + frm]
            return True
        # In check, or en passant (which also uncovers the captured pawn's square): try it.
        moved, captured = b[frm], b[to]
        b[frm] = 0
        b[to] = moved
        taken_sq = -1
        if ep_capture:
            taken_sq = to - 8 if us == 0 else to + 8
            taken = b[taken_sq]
            b[taken_sq] = 0
        safe = not _attacked(b, king, them)
        b[frm] = moved
        b[to] = captured
        if taken_sq >= 0:
            b[taken_sq] = taken
        return safe

    def _play(self, frm: int, to: int, ptype: int, promo: int) -> str:
        b = self.board
        us = self.turn
        them = us ^ 1
        moved = b[frm]
        b[frm] = 0
        b[to] = moved if not promo else (us << 3) | promo
        special = promo != 0
        self.rights &= _RIGHTS_MASK[frm] & _RIGHTS_MASK[to]
        ep = -1
        if ptype == PAWN:
            if to == self.ep and (frm & 7) != (to & 7):
                b[to - 8 if us == 0 else to + 8] = 0
                special = True
            elif to - frm == 16 or frm - to == 16:
                ep = (frm + to) >> 1
        elif ptype == KING:
            self.kings[us] = to
            if to - frm == 2 or frm - to == 2:  # castling played as the king's two-square move
                rook_from, rook_to = (frm + 3, frm + 1) if to > frm else (frm - 4, frm - 1)
                b[rook_to] = b[rook_from]
                b[rook_from] = 0
                special = True
        self.ep = ep
        self.turn = them
        king = self.kings[them]
        if special:
            self.in_check = _attacked(b, king, us)
        else:
            self.in_check = self._gives_check(frm, to, king, us)
        uci = _UCI[frm * 64 + to] if not promo else _UCI[frm * 64 + to] + _PROMO_UCI[promo]
        self.history.append(uci)
        return uci

    def _gives_check(self, frm: int, to: int, king: int, us: int) -> bool:
        """Check given by an ordinary move: by the moved piece, or uncovered behind it."""
        b = self.board
        code = b[to]
        ptype = code & 7
        if ptype == KNIGHT:
            if king in KNIGHT_ADJ[to]:
                return True
        elif ptype == PAWN:
            if to in PAWN_FROM[us][king]:
                return True
        elif ptype != KING:
            kind = LINE_KIND[to * 64 + king]
            if kind and (ptype == QUEEN or ptype == (ROOK if kind == 1 else BISHOP)):
                for s in BETWEEN[to * 64 + king]:
                    if b[s]:
                        break
                else:
                    return True
        kind = LINE_KIND[king * 64 + frm]
        if not kind:
            return False
        for s in BETWEEN[king * 64 + frm]:
            if b[s]:
                return False
        slider = (us << 3) | (ROOK if kind == 1 else BISHOP)
        queen = (us << 3) | QUEEN
        for s in BEYOND[king * 64 + frm]:
            p = b[s]
            if p:
                return p == slider or p == queen
        return False

    def _castle(self, san: str, side: str) -> str:
        b = self.board
        us = self.turn
        them = us ^ 1
        home = 4 if us == 0 else 60
        bit = (1 if side == "K" else 2) << (2 * us)
        if not self.rights & bit or self.in_check:
            return self._fallback(san)
        if side == "K":
            if b[home + 1] or b[home + 2]:
                return self._fallback(san)
            path = (home + 1, home + 2)
        else:
            if b[home - 1] or b[home - 2] or b[home - 3]:
                return self._fallback(san)
            path = (home - 1, home - 2)
        for s in path:
            if _attacked(b, s, them):
                return self._fallback(san)
        return self._play(home, path[1], KING, 0)

    def _fallback(self, san: str) -> str:
        """python-chess decides on this position: its move (played here too) or its exception."""
        move = self.to_chess().parse_san(san)  # raises Illegal/Invalid/AmbiguousMoveError
        if not move:
            raise chess.InvalidMoveError(f"null move {san!r} in a game")
        ptype = self.board[move.from_square] & 7
        return self._play(move.from_square, move.to_square, ptype, move.promotion or 0)

    def to_chess(self) -> chess.Board:
        """The same position as a python-chess board (without the move history)."""
        board = chess.Board.empty()
        board.set_piece_map(
            {sq: chess.Piece(p & 7, not p >> 3) for sq, p in enumerate(self.board) if p}
        )
        board.turn = self.turn == 0
        rights = self.rights
        board.castling_rights = (
            (chess.BB_H1 if rights & 1 else 0)
            | (chess.BB_A1 if rights & 2 else 0)
            | (chess.BB_H8 if rights & 4 else 0)
            | (chess.BB_A8 if rights & 8 else 0)
        )
        board.ep_square = self.ep if self.ep >= 0 else None
        return board
