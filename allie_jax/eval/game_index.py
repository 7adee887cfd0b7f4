"""A one-pass byte-offset index of a PGN file, shared by every task of an evaluation job.

The first task to arrive builds it under a lock (``RECORDS/index/``); the others wait for it and
read it. One pass over the input's bytes gives, for each of the first ``max_games`` usable games,
its byte offset, length and id; the sha256 of every byte read (the job's identity of the games);
the parse statistics; and the search / Stockfish subsamples (``stream.Selection``), chosen from
the same pass. A task then seeks to its own games and reads only their bytes (on an object store
as concurrent ranged requests, ``read_ranges``), so with N tasks each reads about 1/N of the
input instead of all of it (twice with a subsample).

A compressed input (.zst, .bz2, .gz, .xz) cannot be read at an offset, so the same pass also
prepares a seekable copy next to the index: each indexed game as its own zstd frame
(``games.pgn.zst``, itself a valid zstd file of the kept games), and the offsets point into it.
The job's identity stays the digest of the original compressed bytes (hashed in the same pass,
to the end of the file), so the copy is a cache of the input, not a new input. Only stdin is
streamed by every task (``stream.game_stream``).
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import heapq
import io
import json
import logging
import lzma
import os
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from etils import epath

from allie_jax.eval import stream
from allie_jax.game import Game
from allie_jax.pgn import ParseStats, read_games

FORMAT = 1
COMPRESSED = (".zst", ".bz2", ".gz", ".xz")
COPY = "games.pgn.zst"  # the seekable copy of a compressed input, one zstd frame per game
BATCH = 256  # games fetched per round of (concurrent, on an object store) ranged reads
HEARTBEAT_S = 60.0  # the builder refreshes its lock this often (a lock untouched is taken over)


def indexable(path) -> bool:
    """A file (local or remote, plain or compressed): anything but stdin can be indexed."""
    return str(path) != "-"


def compressed(path) -> bool:
    return str(path).endswith(COMPRESSED)


def _decompressed(raw, path) -> io.BufferedIOBase:
    """The decompressed bytes of ``raw`` (read through it, so its hash sees every byte)."""
    name = str(path)
    if name.endswith(".zst"):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(
            raw, read_across_frames=True, closefd=False
        )
        return io.BufferedReader(reader, 1 << 20)
    if name.endswith(".bz2"):
        return bz2.BZ2File(raw)
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    return lzma.LZMAFile(raw)


@dataclasses.dataclass
class SubsampleSpec:
    """A subsample to choose in the index pass: its salt, eligible plies, and size."""

    names: tuple[str, ...]
    salt: str
    eligible: Callable[[Game], np.ndarray]
    count: int | None


def _game_texts(f) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of each game in a binary PGN stream: a game starts at a header line
    (``[``) that follows movetext or the start of the file."""
    offset = 0
    start = None
    buf: list[bytes] = []
    in_headers = False
    for line in f:
        stripped = line.lstrip()
        is_header = stripped.startswith(b"[")
        if is_header and not in_headers:
            if start is not None and buf:
                yield start, b"".join(buf)
            start, buf = offset, []
            in_headers = True
        elif not is_header:  # movetext, or the blank line that ends a header block
            in_headers = False
        if start is not None:
            buf.append(line)
        offset += len(line)
    if start is not None and buf:
        yield start, b"".join(buf)


PROBE = 1 << 16  # bytes hashed at each end of the file to tell that an index is still its own


GAP = 512  # remote reads: ranges closer than this are fetched as one request


def _remote(path) -> bool:
    return "://" in str(path)


def _size(path) -> int:
    if _remote(path):
        import fsspec

        fs, name = fsspec.core.url_to_fs(str(path))
        return int(fs.size(name))
    return os.path.getsize(os.fspath(path))


def read_ranges(path, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
    """The bytes ``[start, end)`` of each range. On an object store (gs://, s3://) these are
    ranged requests, issued concurrently, nearby ones merged (``GAP``): an ordinary remote file
    object would fetch a whole read-ahead block (MiBs) around each small game."""
    if not len(starts):
        return []
    if _remote(path):
        import fsspec

        fs, name = fsspec.core.url_to_fs(str(path))
        spans: list[list[int]] = []  # merged [start, end) of ranges in increasing order
        where = []  # (span, offset in it) of each range
        for a, b in zip(starts, ends, strict=True):
            a, b = int(a), int(b)
            if spans and spans[-1][0] <= a and a - spans[-1][1] <= GAP:
                spans[-1][1] = max(spans[-1][1], b)
            else:
                spans.append([a, b])
            where.append((len(spans) - 1, a - spans[-1][0]))
        got = fs.cat_ranges(
            [name] * len(spans), [a for a, _ in spans], [b for _, b in spans], on_error="raise"
        )
        return [
            bytes(got[j][o : o + int(b) - int(a)])
            for (j, o), a, b in zip(where, starts, ends, strict=True)
        ]
    out = []
    with epath.Path(path).open("rb") as f:
        for a, b in zip(starts, ends, strict=True):
            f.seek(int(a))
            out.append(f.read(int(b) - int(a)))
    return out


def probe(path) -> dict:
    """The file's size and a hash of its first and last 64 KiB: cheap to recompute, so a task can
    tell that an existing index was built from this file without reading all of it."""
    size = _size(path)
    head, tail = read_ranges(path, [0, max(size - PROBE, 0)], [min(PROBE, size), size])
    return {"size": size, "ends": hashlib.sha256(head + b"\0" + tail).hexdigest()}


def _parse_one(data: bytes, stats: ParseStats) -> Game | None:
    games = list(read_games(io.StringIO(data.decode("utf-8", errors="replace")), stats=stats))
    return games[0] if len(games) == 1 else None


@dataclasses.dataclass
class GameIndex:
    """The index: where each usable game lies, and what the one pass learned."""

    offsets: np.ndarray  # int64 byte offsets (into the input, or into the copy: ``meta["copy"]``)
    lengths: np.ndarray  # int64 byte lengths
    game_ids: list[str]
    meta: dict  # digest, bytes, parse stats, selections, the copy's name
    where: epath.Path | None = None  # the index's directory (holds the copy of a compressed input)

    @property
    def digest(self) -> str:
        return self.meta["sha256"]

    def selections(self) -> dict[str, stream.Selection]:
        return {
            name: stream.Selection(**sel) for name, sel in self.meta.get("selections", {}).items()
        }

    def parse_stats(self) -> dict:
        return self.meta["parse"]

    def source(self, path) -> epath.Path:
        """The file the offsets point into: the input itself, or the prepared copy."""
        if self.meta.get("copy"):
            if self.where is None:
                raise ValueError("an index with a prepared copy needs its directory")
            return epath.Path(self.where) / self.meta["copy"]
        return epath.Path(path)


def build(
    path,
    max_games: int,
    specs: Sequence[SubsampleSpec],
    seed: int,
    *,
    where: epath.Path | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> GameIndex:
    """One pass over the file's bytes: offsets, ids, digest, parse statistics, subsamples.

    A compressed input is decompressed in the pass and its indexed games written, one zstd frame
    each, to ``where/games.pgn.zst`` (``where`` is then required); the digest is of the
    compressed bytes, the file's own identity. ``heartbeat`` is called now and then (the builder
    refreshes its lock with it: a pass over a large file outlasts a lock's staleness window)."""
    sha = hashlib.sha256()
    stats = ParseStats()
    offsets, lengths, ids = [], [], []
    heaps: list[list[int]] = [[] for _ in specs]
    totals = [0 for _ in specs]
    packed = compressed(path)
    if packed and where is None:
        raise ValueError(f"{path}: indexing a compressed input needs a directory for its copy")
    copy = cctx = None
    copy_bytes = 0
    beat = time.monotonic()
    with epath.Path(path).open("rb") as raw:
        f = _Hashing(raw, sha)
        if packed:
            import zstandard

            cctx = zstandard.ZstdCompressor(level=3)
            epath.Path(where).mkdir(parents=True, exist_ok=True)
            copy = (epath.Path(where) / f".{COPY}.tmp").open("wb")
        try:
            texts = _game_texts(_decompressed(f, path) if packed else f)
            for offset, data in _truncation_tolerant(texts, path, stats):
                if len(ids) >= max_games:
                    break
                if heartbeat is not None and time.monotonic() - beat > HEARTBEAT_S:
                    heartbeat()
                    beat = time.monotonic()
                game = _parse_one(data, stats)
                if game is None:
                    continue
                if copy is not None:
                    frame = cctx.compress(data)
                    copy.write(frame)
                    offset, size = copy_bytes, len(frame)
                    copy_bytes += size
                else:
                    size = len(data)
                offsets.append(offset)
                lengths.append(size)
                ids.append(game.game_id)
                for j, spec in enumerate(specs):
                    if spec.count is None or spec.count == 0:
                        continue
                    for i in spec.eligible(game):
                        totals[j] += 1
                        h = stream.position_hash(seed, spec.salt, game.game_id, int(i))
                        if len(heaps[j]) < spec.count:
                            heapq.heappush(heaps[j], -h)
                        elif h < -heaps[j][0]:
                            heapq.heapreplace(heaps[j], -h)
            for piece in iter(lambda: f.read(8 << 20), b""):  # the rest, for the digest
                del piece
                if heartbeat is not None and time.monotonic() - beat > HEARTBEAT_S:
                    heartbeat()
                    beat = time.monotonic()
        finally:
            if copy is not None:
                copy.close()
        total_bytes = f.count
    if copy is not None:
        (epath.Path(where) / f".{COPY}.tmp").replace(epath.Path(where) / COPY)
    selections = {}
    for j, spec in enumerate(specs):
        if spec.count is None:
            sel = stream.Selection(spec.salt, seed, None, -1)
        elif spec.count == 0:
            sel = stream.Selection(spec.salt, seed, -1, 0)
        elif totals[j] <= spec.count:
            sel = stream.Selection(spec.salt, seed, None, totals[j])
        else:
            sel = stream.Selection(spec.salt, seed, -heaps[j][0], spec.count)
        for name in spec.names:
            selections[name] = dataclasses.asdict(sel)
    meta = {
        "format": FORMAT,
        "sha256": "sha256:" + sha.hexdigest(),
        "bytes": total_bytes,
        "max_games": max_games,
        "seed": seed,
        "parse": {"games_read": stats.games_read, "dropped": dict(stats.dropped)},
        "selections": selections,
        "probe": probe(path),
    }
    if copy is not None:
        meta.update(copy=COPY, copy_bytes=copy_bytes)
    index = GameIndex(np.array(offsets, np.int64), np.array(lengths, np.int64), ids, meta)
    index.where = epath.Path(where) if where is not None else None
    return index


def _truncation_tolerant(texts: Iterator[tuple[int, bytes]], path, stats: ParseStats):
    """The games of a decompressed stream up to a cut (a truncated download): the games before
    the cut are indexed, the cut one is counted as ``truncated``, as the streaming reader does."""
    import zstandard

    try:
        yield from texts
    except zstandard.ZstdError as e:  # not zstd at all, or a corrupt frame
        raise ValueError(f"cannot read PGN input {str(path)!r}: {e}") from e
    except (EOFError, OSError) as e:
        logging.getLogger(__name__).warning(
            "%s: the compressed stream is cut short (%s); the games before the cut are indexed",
            path,
            e,
        )
        stats.dropped["truncated"] = stats.dropped.get("truncated", 0) + 1


class _Hashing:
    """A binary stream that hashes and counts what is read through it (line iteration too)."""

    def __init__(self, raw, sha):
        self.raw, self.sha, self.count = raw, sha, 0

    def __iter__(self):
        for line in self.raw:
            self.sha.update(line)
            self.count += len(line)
            yield line

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.count += len(data)
        return data

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


def save(index: GameIndex, where: epath.Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "offset": pa.array(index.offsets),
            "length": pa.array(index.lengths),
            "game_id": pa.array(index.game_ids, pa.string()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    tmp = where / ".index.parquet.tmp"
    tmp.write_bytes(buf.getvalue())
    tmp.replace(where / "index.parquet")
    tmp = where / ".index.json.tmp"
    tmp.write_text(json.dumps(index.meta, sort_keys=True))
    tmp.replace(where / "index.json")  # last: its presence says the index is whole
    index.where = where


def load(where: epath.Path) -> tuple[GameIndex, int]:
    """The index and the bytes read to load it."""
    data = (where / "index.parquet").read_bytes()
    meta_text = (where / "index.json").read_text()
    t = pq.read_table(io.BytesIO(data))
    index = GameIndex(
        t.column("offset").to_numpy().astype(np.int64),
        t.column("length").to_numpy().astype(np.int64),
        t.column("game_id").to_pylist(),
        json.loads(meta_text),
        where=where,
    )
    return index, len(data) + len(meta_text)


def shared_index(
    path,
    where: epath.Path,
    max_games: int,
    specs: Sequence[SubsampleSpec],
    seed: int,
    settings: dict | None = None,
) -> tuple[GameIndex, int, bool]:
    """The job's index at ``where``: built by the first task (under a lock), read by the rest.
    ``settings``: what else decides the subsamples (their sizes, the eligible plies' rules); an
    index built under others is refused. Returns the index, the input bytes this task read for
    it, and whether it built it."""
    settings = json.loads(json.dumps(settings or {}, sort_keys=True))
    from allie_jax.eval.records import Lock, RecordsError

    where = epath.Path(where)
    if not (where / "index.json").exists():
        lock = Lock(where.parent / f"{where.name}.lock", "index")
        lock.acquire(wait=True)
        try:
            if not (where / "index.json").exists():
                index = build(path, max_games, specs, seed, where=where, heartbeat=lock.touch)
                index.meta["settings"] = settings
                if index.game_ids:  # an input without a usable game leaves no index behind
                    save(index, where)
                return index, int(index.meta["bytes"]), True
        finally:
            lock.release()
    index, n = load(where)
    m = index.meta
    here = probe(path)
    n += min(here["size"], 2 * PROBE)  # the probe's reads count as this task's input bytes
    if m.get("probe") != here:
        raise RecordsError(
            f"{where} indexes another games_file than {path} (its size or content differs); "
            "use a new --records directory (or --index_dir)"
        )
    if m.get("max_games") != max_games or m.get("seed") != seed:
        raise RecordsError(
            f"{where} indexes another job (max_games {m.get('max_games')}, seed {m.get('seed')}); "
            "use a new --records directory"
        )
    if "settings" in m and m["settings"] != settings:  # (an index from before they were kept)
        old = m.get("settings", {})
        keys = sorted(k for k in {*old, *settings} if old.get(k) != settings.get(k))
        raise RecordsError(
            f"{where} indexes the games for other subsample settings (differing: "
            f"{', '.join(keys)}); use the same flags as the index's job, or a new --index_dir"
        )
    return index, n, False


def shard_games(
    path, index: GameIndex, num_shards: int, shard_index: int, stats: ParseStats
) -> tuple[Iterator[Game], Callable[[], int]]:
    """This shard's games, in input order, read at their offsets (in the input, or in the
    prepared copy of a compressed input); and a counter of the bytes read so far."""
    mine = [
        i for i, gid in enumerate(index.game_ids) if stream.shard_of(gid, num_shards) == shard_index
    ] if num_shards > 1 else list(range(len(index.game_ids)))  # fmt: skip
    count = [0]
    source = index.source(path)
    framed = bool(index.meta.get("copy"))

    def games() -> Iterator[Game]:
        dctx = None
        if framed:
            import zstandard

            dctx = zstandard.ZstdDecompressor()
        for lo in range(0, len(mine), BATCH):
            batch = mine[lo : lo + BATCH]
            starts = index.offsets[batch]
            pieces = read_ranges(source, starts, starts + index.lengths[batch])
            for i, data in zip(batch, pieces, strict=True):
                count[0] += len(data)
                if dctx is not None:
                    data = dctx.decompress(data)
                game = _parse_one(data, stats)
                if game is None or game.game_id != index.game_ids[i]:
                    raise ValueError(
                        f"{source}: the game at byte {index.offsets[i]} is not the indexed "
                        f"{index.game_ids[i]!r}; the file changed since it was indexed"
                    )
                yield game

    return games(), lambda: count[0]
