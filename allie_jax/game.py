"""A game as the rest of the library sees it, and its token sequence with per-position targets.

Everything downstream (data packing, evaluation, the engine) goes through ``encode_game`` so the
layout of SPEC §1 lives in exactly one place:

    [elo_white, elo_black, TC, m1 .. mN, (<RESIGNED-OR-CHECKMATED> if Normal), <EOS>]

Position t predicts token t+1 (policy), the think time of that move, and the game result from
White's view. When the Elos are replaced by one ``<BOS>`` (augmentation) the header is two tokens.

Against the released code (y0mingzhang/allie, ``src/modeling/data.py``) the targets are identical
at every move position (checked on real games, packed or not), with two deliberate differences,
both kept:

1. Header positions before the time-control token carry no policy or value label here. The
   released collate labels every non-pad position: the last Elo slot (or ``<BOS>``) learns to
   predict the time-control token, and the Elo slots get the game result as value label. We label
   from the time-control position on (``h - 1``), because the header is given, not played: the
   engine never asks for a prediction at an Elo slot, predicting the time control teaches the
   data set's mix of controls (and, through the 5% augmentation, to predict ``<UNK>``, a label
   about our augmentation rather than the game), and a value read off two ratings before the
   time control is never used. The loss on the labels we share equals the released loss to 1e-6.
2. Think times keep the clock's resolution here: chess.com clocks carry tenths of a second
   (``[%clk 0:02:58.6]``) and so do our ``time_targets``; the released pipeline stored whole
   seconds. Lichess clocks are whole seconds, so Lichess targets are identical. The time head
   regresses seconds, and a tenth is real signal for bullet-fast moves; only the released flat
   file format (``data.flat_uint32``) rounds, because its 16-bit field holds whole seconds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from allie_jax import vocab

NO_TIME = -1.0  # think-time label meaning "unlabelled"


@dataclasses.dataclass
class Game:
    """One game. ``think_times[i]`` is the seconds spent on ``moves[i]`` (NO_TIME if unknown)."""

    moves: list[str]  # UCI, castling as the king's two-square move (e1g1)
    white_elo: int | None = None
    black_elo: int | None = None
    time_control: str | None = None  # "180+2"; None when unknown
    result: float | None = None  # +1 white wins, 0 draw, -1 black wins, None unknown
    termination: str = "Normal"  # Normal / Time forfeit / Abandoned / Rules infraction / other
    think_times: list[float] | None = None
    clocks: list[float] | None = None  # seconds left on the mover's clock after each move
    game_id: str = ""
    white: str = ""
    black: str = ""

    @property
    def ended_normally(self) -> bool:
        return self.termination == "Normal"


@dataclasses.dataclass
class EncodedGame:
    """Token ids (Elo ids are ``elo + 1997``) and aligned per-position targets."""

    tokens: np.ndarray  # int32 [L]
    policy_targets: np.ndarray  # int32 [L], -1 where no label
    time_targets: np.ndarray  # float32 [L] seconds, NO_TIME where no label
    value_targets: np.ndarray  # float32 [L], NaN where no label
    header_len: int  # 3, or 2 when the Elos were replaced by <BOS>


def header_tokens(
    white_elo: int | None,
    black_elo: int | None,
    time_control: str | None,
    *,
    drop_elo: bool = False,
    drop_time_control: bool = False,
) -> list[int]:
    """The game header; missing Elos become a single <BOS>, as in the augmentation."""
    if drop_elo or white_elo is None or black_elo is None:
        head = [vocab.BOS]
    else:
        head = [vocab.encode_elo(white_elo), vocab.encode_elo(black_elo)]
    tc = vocab.UNK if drop_time_control else vocab.encode_time_control(time_control)
    return head + [tc]


def encode_game(
    game: Game,
    *,
    partial: bool = False,
    drop_elo: bool = False,
    drop_time_control: bool = False,
    max_len: int | None = None,
) -> EncodedGame:
    """Encode a game; ``partial`` omits termination and EOS (a game still being played).

    ``max_len`` truncates the token sequence (targets stay aligned); the data pipeline instead
    continues long games in later windows behind a repeated header.
    """
    head = header_tokens(
        game.white_elo,
        game.black_elo,
        game.time_control,
        drop_elo=drop_elo,
        drop_time_control=drop_time_control,
    )
    moves = [vocab.encode_move(m) for m in game.moves]
    tail: list[int] = []
    if not partial:
        if game.ended_normally:
            tail.append(vocab.TERMINATION)
        tail.append(vocab.EOS)
    tokens = np.asarray(head + moves + tail, dtype=np.int32)
    n = len(tokens)
    h = len(head)
    policy = np.full(n, -1, dtype=np.int32)
    policy[h - 1 : n - 1] = tokens[h:]
    times = np.full(n, NO_TIME, dtype=np.float32)
    if game.think_times is not None:
        tt = np.asarray(game.think_times, dtype=np.float32)[: len(moves)]
        times[h - 1 : h - 1 + len(tt)] = np.where(tt >= 0, tt, NO_TIME)
    values = np.full(n, np.nan, dtype=np.float32)
    if game.result is not None:
        values[h - 1 :] = game.result
    enc = EncodedGame(tokens, policy, times, values, h)
    if max_len is not None and n > max_len:
        enc = EncodedGame(tokens[:max_len], policy[:max_len], times[:max_len], values[:max_len], h)
    return enc


def normalize_think_time(seconds):
    """The time head's regression target: clip to [0, 60] s, then standardise (SPEC §1).

    Uses the array's own ``clip`` so it works on numpy and jax arrays (inside jit) alike.
    """
    return (seconds.clip(0.0, 60.0) - TIME_MEAN) / TIME_STD


def denormalize_think_time(normalized):
    """Seconds from the time head's output (works on numpy and jax arrays)."""
    return normalized * TIME_STD + TIME_MEAN


TIME_MEAN = 4.64001
TIME_STD = 6.16533
