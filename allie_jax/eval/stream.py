"""Games in for an evaluation job: streamed, split into shards by game id, cut into chunks, and the
seeded position subsamples chosen so that they do not depend on the sharding.

- ``game_stream``: the first ``max_games`` games of a PGN (any ``etils.epath`` path), lazily.
- ``shard_of``: a game's shard is a hash of its id, so any number of processes (a Slurm array, a
  Kubernetes indexed job, ``jax.distributed`` processes) split the same input the same way.
- ``chunks``: a shard's games in consecutive chunks of ``chunk_games``; chunk k of a shard is the
  same games on every run, which is what makes a restart resume exactly.
- ``Selection``: a subsample of N positions is the N eligible positions with the smallest hash of
  (seed, subsample name, game id, ply) over the whole input; its threshold comes from one cheap
  parse-only pass, so every shard picks its share of the same global subsample.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import io
import os
import pathlib
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
from etils import epath

from allie_jax.game import Game
from allie_jax.pgn import ParseStats, read_games


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def shard_of(game_id: str, num_shards: int) -> int:
    """The shard (0..num_shards−1) that scores a game: a hash of its id, not its file position."""
    return _digest("shard:" + game_id) % num_shards


def position_hash(seed: int, salt: str, game_id: str, ply: int) -> int:
    """A uniform 64-bit number per (seed, subsample, game, ply): the order subsamples take."""
    return _digest(f"{seed}:{salt}:{game_id}:{ply}")


SCHEDULER_VARIABLES = (
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "JOB_COMPLETION_INDEX",
)


def scheduler_shard(env: Mapping[str, str] | None = None) -> tuple[int | None, int, str] | None:
    """``(task count or None, task index, source)`` from a job scheduler's environment: a SLURM
    array (``SLURM_ARRAY_TASK_ID`` − ``SLURM_ARRAY_TASK_MIN``, ``SLURM_ARRAY_TASK_COUNT``) or a
    Kubernetes Indexed Job (``JOB_COMPLETION_INDEX``; its count is ``--num_shards``)."""
    env = os.environ if env is None else env
    if "SLURM_ARRAY_TASK_ID" in env:
        index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        count = env.get("SLURM_ARRAY_TASK_COUNT")
        return (int(count) if count else None), index, "SLURM_ARRAY_TASK_ID"
    if "JOB_COMPLETION_INDEX" in env:
        return None, int(env["JOB_COMPLETION_INDEX"]), "JOB_COMPLETION_INDEX"
    return None


def resolve_shard(
    num_shards: int | None, shard_index: int | None, env: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """``(num_shards, shard_index)``: the flags when both are given; else the scheduler's task
    index (``scheduler_shard``); else one shard per ``jax.distributed`` process; else 1 / 0.

    ``--num_shards N`` without an index from any of these is an error: every process would
    otherwise score shard 0."""
    if shard_index is not None and num_shards is None:
        raise ValueError("--shard_index needs --num_shards")
    if shard_index is None:
        sched = scheduler_shard(env)
        if sched is not None:
            count, index, source = sched
            if count is None and num_shards is None:
                raise ValueError(f"{source} is set: give the job's task count as --num_shards")
            if count is not None and num_shards is not None and count != num_shards:
                raise ValueError(
                    f"--num_shards={num_shards} but SLURM_ARRAY_TASK_COUNT={count}: they must agree"
                )
            num_shards = num_shards if num_shards is not None else count
            shard_index = index
        else:
            import jax

            processes = jax.process_count()
            if num_shards is None:
                return processes, jax.process_index()
            if num_shards == processes:
                shard_index = jax.process_index()
            elif num_shards == 1:
                shard_index = 0
            else:
                raise ValueError(
                    f"--num_shards={num_shards} without --shard_index: no scheduler index found "
                    "(SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX) and jax.distributed runs "
                    f"{processes} process(es); give --shard_index K"
                )
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(f"--shard_index={shard_index} must lie in [0, --num_shards={num_shards})")
    return num_shards, shard_index


def _open(path: str | pathlib.Path | epath.Path):
    """What ``read_games`` reads: a local path as is (its own error messages name it), a remote
    ``epath`` (gs://, s3://) as a decompressed text stream."""
    if str(path) == "-":
        return "-"
    p = epath.Path(path)
    if "://" not in str(p):
        return str(p)
    raw = p.open("rb")
    name = str(p)
    if name.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
    elif name.endswith(".bz2"):
        import bz2

        raw = bz2.BZ2File(raw)
    return _NamedText(raw, name)


class _NamedText(io.TextIOWrapper):
    """A decompressed text stream that carries its URL as ``name`` (``read_games`` names the
    input in its errors; ``TextIOWrapper.name`` itself is read-only)."""

    def __init__(self, raw, name: str):
        super().__init__(raw, encoding="utf-8", errors="replace", newline=None)
        self._url = name

    @property
    def name(self) -> str:
        return self._url


def game_stream(
    path: str | pathlib.Path | epath.Path, max_games: int, stats: ParseStats
) -> Iterator[Game]:
    """The first ``max_games`` usable games of the file (bad ones counted in ``stats``)."""
    if max_games <= 0:
        return
    n = 0
    source = _open(path)
    try:
        for game in read_games(source, stats=stats):
            yield game
            n += 1
            if n >= max_games:
                return
    finally:  # a remote stream is ours to close (its fetcher would outlive the run otherwise)
        if not isinstance(source, str):
            source.close()


def chunks(
    games: Iterable[Game], num_shards: int, shard_index: int, chunk_games: int
) -> Iterator[tuple[int, list[Game]]]:
    """``(chunk index, games)`` of one shard, ``chunk_games`` games per chunk (the last may be
    shorter). Only one chunk is held at a time: memory does not grow with the input."""
    chunk: list[Game] = []
    index = 0
    for game in games:
        if num_shards > 1 and shard_of(game.game_id, num_shards) != shard_index:
            continue
        chunk.append(game)
        if len(chunk) == chunk_games:
            yield index, chunk
            index, chunk = index + 1, []
    if chunk:
        yield index, chunk


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which eligible positions a subsample takes: all (``threshold`` None) or those whose
    ``position_hash`` is at most ``threshold``."""

    salt: str
    seed: int
    threshold: int | None  # None: every eligible position
    size: int  # positions taken over the whole input (before sharding)

    def picks(self, game_id: str, plies: np.ndarray) -> np.ndarray:
        """bool mask over ``plies`` (eligible positions of one game)."""
        if self.threshold is None:
            return np.ones(len(plies), bool)
        return np.array(
            [position_hash(self.seed, self.salt, game_id, int(i)) <= self.threshold for i in plies],
            bool,
        )


def choose(
    games: Iterable[Game],
    eligible: Callable[[Game], np.ndarray],
    count: int | None,
    *,
    salt: str,
    seed: int,
) -> Selection:
    """The subsample of ``count`` positions (None: all) among ``eligible(game)`` plies of every
    game: one pass keeping the ``count`` smallest hashes (memory O(count))."""
    if count is None:
        return Selection(salt, seed, None, -1)
    if count == 0:
        return Selection(salt, seed, -1, 0)
    heap: list[int] = []  # max-heap (negated) of the count smallest hashes
    total = 0
    for game in games:
        for i in eligible(game):
            total += 1
            h = position_hash(seed, salt, game.game_id, int(i))
            if len(heap) < count:
                heapq.heappush(heap, -h)
            elif h < -heap[0]:
                heapq.heapreplace(heap, -h)
    if total <= count:
        return Selection(salt, seed, None, total)
    return Selection(salt, seed, -heap[0], count)
