"""The token vocabulary, identical to the released Allie's so its checkpoint keeps working.

Ids 0..1967 are UCI move strings in a generated order (SPEC §1), 1968..1991 the 24 blitz time
controls, then five special tokens. An Elo rating is not a row of the embedding table: it travels
through the integer pipeline as ``elo + ELO_OFFSET`` (the released flat-file convention) and the
model turns it into a soft token by interpolating two learned vectors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads with the table: a UCI engine answers `uci` before it is imported
    import numpy as np

FILES = "abcdefgh"
PROMOTION_PIECES = "qrbn"


def _square(file: int, rank: int) -> str:
    return f"{FILES[file]}{rank + 1}"


def _generate_moves() -> list[str]:
    """Generate the 1,968 move strings in the released order (the order fixes the embedding rows)."""
    queen, knight = [], []
    for from_file in range(8):
        for from_rank in range(8):
            for to_rank in range(7, -1, -1):
                for to_file in range(7, -1, -1):
                    if (to_file, to_rank) == (from_file, from_rank):
                        continue
                    df, dr = abs(to_file - from_file), abs(to_rank - from_rank)
                    move = _square(from_file, from_rank) + _square(to_file, to_rank)
                    if df == 0 or dr == 0 or df == dr:
                        queen.append(move)
                    elif (df, dr) in ((1, 2), (2, 1)):
                        knight.append(move)
    promotions = []
    for file in range(8):
        for from_rank, to_rank in ((6, 7), (1, 0)):
            for to_file in (file + 1, file - 1, file):
                if not 0 <= to_file < 8:
                    continue
                for piece in PROMOTION_PIECES:
                    promotions.append(_square(file, from_rank) + _square(to_file, to_rank) + piece)
    return queen + knight + promotions


MOVES: tuple[str, ...] = tuple(_generate_moves())
NUM_MOVES = len(MOVES)  # 1968
assert NUM_MOVES == 1968, NUM_MOVES

TIME_CONTROLS: tuple[str, ...] = (
    "180+0 300+0 180+2 300+3 300+2 420+0 240+0 180+1 180+3 300+1 360+0 300+4 "
    "420+1 240+2 180+5 120+2 120+3 240+3 240+1 360+2 60+3 60+5 240+4 240+5"
).split()
TC_OFFSET = NUM_MOVES  # 1968
TERMINATION = TC_OFFSET + len(TIME_CONTROLS)  # 1992 <RESIGNED-OR-CHECKMATED>
BOS = TERMINATION + 1  # 1993
EOS = BOS + 1  # 1994
UNK = EOS + 1  # 1995
PAD = UNK + 1  # 1996
VOCAB_SIZE = PAD + 1  # 1997: rows of the embedding table
ELO_OFFSET = VOCAB_SIZE  # an id >= ELO_OFFSET encodes the Elo ``id - ELO_OFFSET``
MIN_ELO, MAX_ELO = 500, 3000
HEADER_LEN = 3  # [elo_white, elo_black, time control]
MAX_SEQ_LEN = 512

SPECIAL_TOKENS = {
    "<RESIGNED-OR-CHECKMATED>": TERMINATION,
    "<BOS>": BOS,
    "<EOS>": EOS,
    "<UNK>": UNK,
    "<PAD>": PAD,
}

MOVE_TO_ID: dict[str, int] = {m: i for i, m in enumerate(MOVES)}
TC_TO_ID: dict[str, int] = {tc: TC_OFFSET + i for i, tc in enumerate(TIME_CONTROLS)}
assert len(MOVES) + len(TIME_CONTROLS) + len(SPECIAL_TOKENS) == VOCAB_SIZE


def encode_move(uci: str) -> int:
    """Id of a UCI move string; castling must be the king's two-square move (e1g1)."""
    try:
        return MOVE_TO_ID[uci]
    except KeyError:
        raise ValueError(f"not a move of the Allie vocabulary: {uci!r}") from None


def decode_move(token: int) -> str:
    if not 0 <= token < NUM_MOVES:
        raise ValueError(f"token {token} is not a move id (0..{NUM_MOVES - 1})")
    return MOVES[token]


def encode_time_control(tc: str | None) -> int:
    """Token of a time control; any control outside the 24 blitz ones is ``<UNK>``."""
    if tc is None:
        return UNK
    return TC_TO_ID.get(normalize_time_control(tc), UNK)


def normalize_time_control(tc: str) -> str:
    """'180' (chess.com) -> '180+0'; other strings unchanged."""
    tc = tc.strip()
    return f"{tc}+0" if tc.isdigit() else tc


def encode_elo(elo: float) -> int:
    """Integer id carrying an Elo (clamped to [500, 3000]) through the token pipeline."""
    return ELO_OFFSET + int(round(min(max(elo, MIN_ELO), MAX_ELO)))


@functools.cache
def move_table() -> np.ndarray:
    """int32 [1968, 3]: from-square, to-square (0 = a1 .. 63 = h8) and promotion (0 none, 1..4 qrbn)."""
    import numpy as np

    table = np.zeros((NUM_MOVES, 3), dtype=np.int32)
    for i, move in enumerate(MOVES):
        frm = FILES.index(move[0]) + 8 * (int(move[1]) - 1)
        to = FILES.index(move[2]) + 8 * (int(move[3]) - 1)
        promo = PROMOTION_PIECES.index(move[4]) + 1 if len(move) == 5 else 0
        table[i] = (frm, to, promo)
    return table
