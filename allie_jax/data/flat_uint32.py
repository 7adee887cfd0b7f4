"""The released Allie training file: a flat little-endian ``uint32`` stream, one word per token.

SPEC §3 bit layout of a word:
    bits  0–13  token id, or elo + 1997 for the two Elo slots of the header
    bits 14–15  game result: 0 white wins, 1 draw, 2 black wins
    bits 16–31  think time of the move in whole seconds + 1 (0 = no label)
Games are concatenated, each ``[elo_white, elo_black, TC, m1 .. mN, (termination), <EOS>]``.
The think time sits on the word of the move it was spent on.

What the format cannot hold: fractional seconds (chess.com tenths are rounded), Elo outside
[500, 3000] (clamped, as the model does anyway), which non-Normal termination a game had (read
back as "other"), player names and game ids. A game without Elo is written with a single
``<BOS>`` header slot, the same shape as the Elo-dropping augmentation.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import numpy as np

from allie_jax import vocab
from allie_jax.game import NO_TIME, Game, header_tokens

_RESULT_CODE = {1.0: 0, 0.0: 1, -1.0: 2}
_CODE_RESULT = {0: 1.0, 1: 0.0, 2: -1.0}
TOKEN_MASK = (1 << 14) - 1
MAX_SECONDS = (1 << 16) - 2


class FlatFormatError(ValueError):
    """A word stream that does not follow the released layout."""


def game_to_words(game: Game) -> np.ndarray:
    if game.result not in _RESULT_CODE:
        raise FlatFormatError(f"game {game.game_id!r}: the flat format needs a result")
    tokens = header_tokens(game.white_elo, game.black_elo, game.time_control)
    n_head = len(tokens)
    tokens += [vocab.encode_move(m) for m in game.moves]
    if game.ended_normally:
        tokens.append(vocab.TERMINATION)
    tokens.append(vocab.EOS)
    words = np.asarray(tokens, dtype=np.uint32)
    if (words > TOKEN_MASK).any():
        raise FlatFormatError(f"game {game.game_id!r}: token beyond 14 bits")
    words |= np.uint32(_RESULT_CODE[game.result] << 14)
    if game.think_times is not None:
        t = np.asarray(game.think_times, dtype=np.float64)[: len(game.moves)]
        labelled = t >= 0
        seconds = np.where(labelled, np.minimum(np.round(t), MAX_SECONDS) + 1, 0).astype(np.uint32)
        words[n_head : n_head + len(t)] |= seconds << np.uint32(16)
    return words


def games_to_words(games: Iterable[Game]) -> np.ndarray:
    parts = [game_to_words(g) for g in games]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def write_flat(games: Iterable[Game], path: str | os.PathLike) -> int:
    """Write games; returns the number of words. Streams game by game (no big buffer)."""
    n = 0
    with open(path, "wb") as f:
        for game in games:
            words = game_to_words(game)
            f.write(words.astype("<u4").tobytes())
            n += len(words)
    return n


def words_to_games(words: np.ndarray) -> Iterator[Game]:
    words = np.asarray(words, dtype=np.uint32)
    tokens = (words & TOKEN_MASK).astype(np.int64)
    ends = np.flatnonzero(tokens == vocab.EOS)
    start = 0
    for end in ends.tolist():
        yield _decode_game(words[start : end + 1], tokens[start : end + 1], start)
        start = end + 1
    if start != len(words):
        raise FlatFormatError(f"{len(words) - start} words after the last <EOS> (truncated file?)")


def _decode_game(words: np.ndarray, tokens: np.ndarray, offset: int) -> Game:
    if tokens[0] == vocab.BOS:
        white = black = None
        head = 2
    elif tokens[0] >= vocab.ELO_OFFSET and len(tokens) > 2 and tokens[1] >= vocab.ELO_OFFSET:
        white, black = int(tokens[0] - vocab.ELO_OFFSET), int(tokens[1] - vocab.ELO_OFFSET)
        head = 3
    else:
        raise FlatFormatError(f"word {offset}: a game must start with two Elos or <BOS>")
    tc_token = int(tokens[head - 1])
    if tc_token == vocab.UNK:
        tc = None
    elif vocab.TC_OFFSET <= tc_token < vocab.TERMINATION:
        tc = vocab.TIME_CONTROLS[tc_token - vocab.TC_OFFSET]
    else:
        raise FlatFormatError(f"word {offset + head - 1}: expected a time control token")
    body = tokens[head:-1]
    normal = len(body) > 0 and body[-1] == vocab.TERMINATION
    if normal:
        body = body[:-1]
    if len(body) and (body >= vocab.NUM_MOVES).any():
        raise FlatFormatError(f"game at word {offset}: non-move token among the moves")
    codes = set(((words >> 14) & 3).tolist())
    if len(codes) != 1 or (code := codes.pop()) not in _CODE_RESULT:
        raise FlatFormatError(f"game at word {offset}: inconsistent result bits")
    seconds = (words[head : head + len(body)] >> 16).astype(np.int64)
    think = [float(s - 1) if s > 0 else NO_TIME for s in seconds.tolist()]
    return Game(
        moves=[vocab.MOVES[t] for t in body.tolist()],
        white_elo=white,
        black_elo=black,
        time_control=tc,
        result=_CODE_RESULT[code],
        termination="Normal" if normal else "other",
        think_times=think if any(s > 0 for s in seconds.tolist()) else None,
    )


def read_flat(path: str | os.PathLike) -> Iterator[Game]:
    """Games of a released flat file (memory-mapped: works on files larger than memory)."""
    try:
        words = np.memmap(path, dtype="<u4", mode="r")
    except (OSError, ValueError) as e:
        raise FlatFormatError(f"cannot read flat uint32 file {os.fspath(path)!r}: {e}") from e
    yield from words_to_games(words)
