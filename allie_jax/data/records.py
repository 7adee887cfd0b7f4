"""The on-disk record of one game (one ArrayRecord record per game), format version 1.

We store the game, not its token sequence: augmentation (dropping Elo / time control) and packing
re-encode it with ``game.encode_game`` at read time, so the layout of SPEC §1 lives in one place
and the records stay usable if the augmentation rates change. Tokens, think-time labels and value
labels are all derived from the fields below.

Layout (little-endian):

    magic   4 bytes  b"AJG1"  (the trailing digit is the format version)
    header  struct "<HhhbB"  num_moves, white_elo (-1 none), black_elo (-1 none),
                             result (+1 / 0 / -1, -128 none), flags (bit 0 think times,
                             bit 1 clocks)
    strings 5 × (uint16 length + UTF-8): time_control ("" none), termination, game_id,
                             white, black
    moves   uint16[num_moves]   move ids (``vocab.encode_move``)
    times   float32[num_moves]  think seconds, -1 unlabelled   (only if flags bit 0)
    clocks  float32[num_moves]  clock after the move, -1 none  (only if flags bit 1)

The TFDS/Beam builder (``data.tfds_builder``) stores the same bytes as the ``record`` feature of a
``tf.train.Example``; ``game_record`` takes either form, so one reader serves both layouts.
"""

from __future__ import annotations

import struct

import numpy as np

from allie_jax import vocab
from allie_jax.game import Game

MAGIC = b"AJG1"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<HhhbB")
_NO_RESULT = -128
_HAS_TIMES, _HAS_CLOCKS = 1, 2


class RecordError(ValueError):
    """A record that is not a version-1 game record."""


def _put_str(parts: list[bytes], text: str) -> None:
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise RecordError(f"string too long for a record: {text[:40]!r}...")
    parts.append(struct.pack("<H", len(data)))
    parts.append(data)


def serialize_game(game: Game) -> bytes:
    n = len(game.moves)
    if n > 0xFFFF:
        raise RecordError(f"game {game.game_id!r} has too many moves ({n})")
    flags = (_HAS_TIMES if game.think_times is not None else 0) | (
        _HAS_CLOCKS if game.clocks is not None else 0
    )
    result = _NO_RESULT if game.result is None else int(round(game.result))
    parts = [
        MAGIC,
        _HEADER.pack(
            n,
            -1 if game.white_elo is None else game.white_elo,
            -1 if game.black_elo is None else game.black_elo,
            result,
            flags,
        ),
    ]
    for text in (game.time_control or "", game.termination, game.game_id, game.white, game.black):
        _put_str(parts, text)
    parts.append(np.asarray([vocab.encode_move(m) for m in game.moves], "<u2").tobytes())
    if game.think_times is not None:
        parts.append(np.asarray(game.think_times, "<f4").tobytes())
    if game.clocks is not None:
        parts.append(np.asarray(game.clocks, "<f4").tobytes())
    return b"".join(parts)


def deserialize_game(data: bytes) -> Game:
    if data[:4] != MAGIC:
        raise RecordError(f"not an allie-jax game record (magic {data[:4]!r}, want {MAGIC!r})")
    try:
        n, white_elo, black_elo, result, flags = _HEADER.unpack_from(data, 4)
        offset = 4 + _HEADER.size
        strings = []
        for _ in range(5):
            (length,) = struct.unpack_from("<H", data, offset)
            offset += 2
            strings.append(bytes(data[offset : offset + length]).decode("utf-8"))
            offset += length
        move_ids = np.frombuffer(data, "<u2", n, offset)
        offset += 2 * n
        times = clocks = None
        if flags & _HAS_TIMES:
            times = np.frombuffer(data, "<f4", n, offset).tolist()
            offset += 4 * n
        if flags & _HAS_CLOCKS:
            clocks = np.frombuffer(data, "<f4", n, offset).tolist()
            offset += 4 * n
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"corrupt game record: {e}") from e
    if offset != len(data):
        raise RecordError(f"corrupt game record: {len(data) - offset} trailing bytes")
    tc, termination, game_id, white, black = strings
    return Game(
        moves=[vocab.MOVES[i] for i in move_ids.tolist()],
        white_elo=None if white_elo < 0 else white_elo,
        black_elo=None if black_elo < 0 else black_elo,
        time_control=tc or None,
        result=None if result == _NO_RESULT else float(result),
        termination=termination,
        think_times=times,
        clocks=clocks,
        game_id=game_id,
        white=white,
        black=black,
    )


# --------------------------------------------------------------------------- TFDS examples
# A TFDS record is a serialized tf.train.Example: Example.features (field 1) → Features.feature
# (field 1, map entries: key = 1, value = 2) → Feature.bytes_list (field 1) → BytesList.value
# (field 1). Read with a few lines of protobuf wire format, so reading needs no TensorFlow.
TFDS_FEATURE = "record"


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise RecordError("corrupt TFDS example: varint runs past the end")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """(field number, payload) of the length-delimited fields; other wire types skipped."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise RecordError("corrupt TFDS example: field runs past the end")
            yield field, buf[i : i + n]
            i += n
        elif wire == 0:
            _, i = _varint(buf, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise RecordError(f"corrupt TFDS example: wire type {wire}")


def example_bytes_feature(example: bytes, name: str = TFDS_FEATURE) -> bytes:
    """The single bytes value of feature ``name`` in a serialized tf.train.Example."""
    example = bytes(example)
    for f, features in _fields(example):
        if f != 1:
            continue
        for g, entry in _fields(features):
            if g != 1:
                continue
            parts = dict(_fields(entry))
            if parts.get(1) != name.encode():
                continue
            for h, bytes_list in _fields(parts.get(2, b"")):
                if h == 1:
                    values = [v for k, v in _fields(bytes_list) if k == 1]
                    if len(values) == 1:
                        return values[0]
            raise RecordError(f"TFDS example: feature {name!r} is not one bytes value")
    raise RecordError(f"TFDS example without a {name!r} feature")


def game_record(data: bytes) -> bytes:
    """The version-1 game record in ``data``: itself, or unwrapped from a TFDS example."""
    if bytes(data[:4]) == MAGIC:
        return data
    return example_bytes_feature(data)
