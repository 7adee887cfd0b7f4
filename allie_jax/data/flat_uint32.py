"""The released Allie training file: a flat little-endian ``uint32`` stream, one word per token.

SPEC §3 bit layout of a word:
    bits  0–13  token id, or elo + 1997 for the two Elo slots of the header
    bits 14–15  game result: 0 white wins, 1 draw, 2 black wins (on every word of the game)
    bits 16–31  a think time in whole seconds + 1 (0 = no label)
Games are concatenated, each ``[elo_white, elo_black, TC, m1 .. mN, (termination), <EOS>]``.

Which word carries which time: the label sits on the word of the position that *predicts* the
move, one word before the move itself. The released tokenizer (y0mingzhang/allie @ 9fdc02d,
``src/modeling/data.py``, ``UCITokenizer.tokenize``) writes

    tokens = [time_control] + moves
    for move, time in zip(tokens, moves_seconds + [-1]):
        ...
        idx += (time + 1) << 16

so the time-control word carries ``moves_seconds[0]``, the word of move i carries
``moves_seconds[i + 1]`` (the *next* move's think time), and the last move's word carries 0
(``-1 + 1``); the Elo, termination and EOS words carry no time. The released collate then reads
``word >> 16`` at each position as that position's time label, which is exactly where
``game.encode_game`` puts ``time_targets``. ``game_to_words`` writes this layout and
``words_to_games`` reads it; a word stream with time bits after the last move (the layout of our
pre-fix writer, which put each time on the move's own word) is rejected as not released.

What the format cannot hold: fractional seconds (chess.com tenths are rounded to the nearest
second), Elo outside [500, 3000] (clamped, as the model does anyway), which non-Normal
termination a game had (read back as "other"), player names and game ids. A game without Elo
is written with a single ``<BOS>`` header slot, the same shape as the Elo-dropping augmentation.

Reading goes through ``np.memmap`` one window of ``chunk_words`` at a time (each window mapped,
decoded and unmapped in turn), so a file of any size is read in a few MB of memory.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np
from etils import epath

from allie_jax import vocab
from allie_jax.game import NO_TIME, Game, header_tokens

_RESULT_CODE = {1.0: 0, 0.0: 1, -1.0: 2}
_CODE_RESULT = {0: 1.0, 1: 0.0, 2: -1.0}
TOKEN_MASK = (1 << 14) - 1
MAX_SECONDS = (1 << 16) - 2
CHUNK_WORDS = 1 << 22  # 16 MB of words mapped at a time


class FlatFormatError(ValueError):
    """A word stream that does not follow the released layout."""


def game_to_words(game: Game) -> np.ndarray:
    """The released words of one game (see the module docstring for where the times go)."""
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
        # Move i's time on the word before it: the TC word for move 0 (released tokenize).
        words[n_head - 1 : n_head - 1 + len(t)] |= seconds << np.uint32(16)
    return words


def games_to_words(games: Iterable[Game]) -> np.ndarray:
    parts = [game_to_words(g) for g in games]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def write_flat(games: Iterable[Game], path: str | os.PathLike) -> int:
    """Write games; returns the number of words. Streams game by game (no big buffer)."""
    n = 0
    with epath.Path(path).open("wb") as f:
        for game in games:
            words = game_to_words(game)
            f.write(words.astype("<u4").tobytes())
            n += len(words)
    return n


def words_to_games(words: np.ndarray, *, offset: int = 0) -> Iterator[Game]:
    """Games of a complete word stream (``offset``: the stream's first word, for messages)."""
    words = np.asarray(words, dtype=np.uint32)
    tokens = words & np.uint32(TOKEN_MASK)
    ends = np.flatnonzero(tokens == vocab.EOS)
    start = 0
    for end in ends.tolist():
        yield _decode_game(words[start : end + 1], tokens[start : end + 1], offset + start)
        start = end + 1
    if start != len(words):
        raise FlatFormatError(
            f"{len(words) - start} words after the last <EOS> at word {offset + start} "
            "(truncated file?)"
        )


def flat_game_id(words: np.ndarray) -> str:
    """A stable id for a game read from a flat file (the format stores none): a digest of its
    words, so the train/val/test split of a game does not depend on file names or order."""
    return "flat:" + hashlib.blake2b(np.asarray(words, "<u4").tobytes(), digest_size=8).hexdigest()


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
    codes = np.unique((words >> np.uint32(14)) & np.uint32(3))
    if len(codes) != 1 or (code := int(codes[0])) not in _CODE_RESULT:
        raise FlatFormatError(f"game at word {offset}: inconsistent result bits")
    all_seconds = words >> np.uint32(16)
    # Labels live on the TC word .. the second-to-last move's word; nowhere else.
    if all_seconds[: head - 1].any() or all_seconds[head - 1 + len(body) :].any():
        raise FlatFormatError(
            f"game at word {offset}: time bits outside the TC .. second-to-last move words "
            "(not the released layout: a file from a writer that put each time on its own move?)"
        )
    seconds = all_seconds[head - 1 : head - 1 + len(body)].astype(np.int64).tolist()
    think = [float(s - 1) if s > 0 else NO_TIME for s in seconds]
    return Game(
        moves=[vocab.MOVES[t] for t in body.tolist()],
        white_elo=white,
        black_elo=black,
        time_control=tc,
        result=_CODE_RESULT[code],
        termination="Normal" if normal else "other",
        think_times=think if any(s > 0 for s in seconds) else None,
    )


def iter_flat_words(
    path: str | os.PathLike, *, chunk_words: int = CHUNK_WORDS
) -> Iterator[tuple[int, np.ndarray]]:
    """(first word index, words) of each game of a flat file, through a windowed memory map.

    Each window is a fresh ``np.memmap`` of ``chunk_words`` words dropped once decoded, so the
    resident memory stays near one window whatever the file size. A game cut by the end of the
    file raises ``FlatFormatError`` after every complete game before it was yielded.
    """
    name = os.fspath(path)
    local = _local_file(path)
    try:
        yield from _iter_local_words(local, name, chunk_words)
    finally:
        if local != name:
            os.unlink(local)


def _iter_local_words(local: str, name: str, chunk_words: int) -> Iterator[tuple[int, np.ndarray]]:
    try:
        size = os.path.getsize(local)
    except OSError as e:
        raise FlatFormatError(f"cannot read flat uint32 file {name!r}: {e.strerror or e}") from e
    total = size // 4  # a partial last word (size not a multiple of 4) is a cut file
    carry = np.zeros(0, np.uint32)  # the unfinished game at the end of the previous window
    start = 0  # word index of carry[0]
    pos = 0
    while pos < total:
        n = min(chunk_words, total - pos)
        window = np.memmap(local, dtype="<u4", mode="r", offset=4 * pos, shape=(n,))
        try:
            ends = np.flatnonzero((window & np.uint32(TOKEN_MASK)) == vocab.EOS)
            begin = 0
            for end in ends.tolist():
                piece = np.array(window[begin : end + 1], np.uint32)  # a copy: the window unmaps
                if len(carry):
                    piece = np.concatenate([carry, piece])
                    carry = np.zeros(0, np.uint32)
                yield start, piece
                start += len(piece)
                begin = end + 1
            if begin < n:
                carry = np.concatenate([carry, np.array(window[begin:], np.uint32)])
        finally:
            del window  # unmaps the window: its pages leave this process's resident set
        pos += n
    if len(carry) or size % 4:
        raise FlatFormatError(
            f"flat uint32 file {name!r}: {len(carry)} words after the last <EOS> at word "
            f"{start}"
            + (f", size {size} not a multiple of 4" if size % 4 else "")
            + " (truncated file?)"
        )


def read_flat(path: str | os.PathLike, *, chunk_words: int = CHUNK_WORDS) -> Iterator[Game]:
    """Games of a released flat file, read window by window (files larger than memory work)."""
    for start, words in iter_flat_words(path, chunk_words=chunk_words):
        yield from words_to_games(words, offset=start)


def _local_file(path: str | os.PathLike) -> str:
    """A local file to memory-map: the path itself, or a temporary copy of a remote one."""
    name = os.fspath(path)
    if "://" not in name:
        return name
    fd, local = tempfile.mkstemp(suffix=".bin", prefix="allie_flat_")
    try:
        with os.fdopen(fd, "wb") as out, epath.Path(path).open("rb") as src:
            while block := src.read(1 << 24):
                out.write(block)
    except OSError as e:
        os.unlink(local)
        raise FlatFormatError(f"cannot read flat uint32 file {name!r}: {e}") from e
    return local
