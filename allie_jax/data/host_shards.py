"""The records one process reads, opening only the shard files that hold them.

On ``gs://`` every host used to copy the whole split to local disk before step 1 (~55 GB per host
for the paper's data). Now, when a split has at least as many files as processes, process ``i``
of ``n`` takes the files ``files[i::n]`` (a file-level split) and fetches and opens those only;
with fewer files than processes every process needs every file and keeps the record-level split
``records[i::n]`` (it says so in the log). With one process both are the whole split, in order.

The rule is the same for local and remote data, so a run gives the same batches from a bucket
and from a copy of it. Remote files are fetched through ``etils.epath`` into the cache
(``paths.local_copy``), several at a time, before the first batch: ArrayRecord's C++ reader only
reads local files, and a lazy per-file fetch would not start sooner, because the shuffle's first
batch already touches nearly every file this process owns.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grain

from allie_jax.data import paths, shards

log = logging.getLogger(__name__)

FETCH_THREADS = 8  # remote files fetched at once


@dataclasses.dataclass(frozen=True)
class HostShard:
    """This process's part of a split: records ``[record_index::record_count]`` of ``files``."""

    files: tuple[str, ...]
    record_index: int
    record_count: int
    total_files: int

    @property
    def file_level(self) -> bool:
        return self.record_count == 1

    def describe(self, index: int, count: int) -> str:
        if self.file_level:
            return (
                f"process {index}/{count} reads {len(self.files)} of {self.total_files} shard "
                "files (file-level split)"
            )
        return (
            f"{self.total_files} shard file(s) for {count} processes: every process opens all of "
            f"them and process {index} reads records [{index}::{count}] (record-level split)"
        )


def split_files(files: Sequence[str], shard_index: int, shard_count: int) -> HostShard:
    """Process ``shard_index``'s files and records: ``files[i::n]`` when there are at least as
    many files as processes, else every file and ``records[i::n]``."""
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
    if len(files) >= shard_count:
        return HostShard(tuple(files[shard_index::shard_count]), 0, 1, len(files))
    return HostShard(tuple(files), shard_index, shard_count, len(files))


class HostRecords:
    """A picklable random-access view of one process's records (grain workers unpickle it):
    records ``[start::step]`` of the local ``files``."""

    def __init__(self, files: Sequence[str], start: int = 0, step: int = 1):
        self.files, self.start, self.step = tuple(files), start, step
        self.source = grain.sources.ArrayRecordDataSource(list(self.files))
        self._indices = range(start, len(self.source), step)

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, i: int) -> bytes:
        return self.source[self._indices[i]]

    def __repr__(self) -> str:
        return f"HostRecords({len(self.files)} files, start={self.start}, step={self.step})"


def fetch(files: Sequence[str]) -> list[str]:
    """Local paths for ``files``: local ones as they are, remote ones fetched into the cache."""
    if not any(paths.is_remote(f) for f in files):
        return list(files)
    with ThreadPoolExecutor(min(FETCH_THREADS, len(files))) as pool:
        return list(pool.map(paths.local_copy, files))


def open_records(
    data_dir: str | os.PathLike, split: str, shard_index: int, shard_count: int
) -> HostRecords:
    """This process's records of ``split``; only the files that hold them are fetched and opened."""
    shard = split_files(shards.find_shards(data_dir, split), shard_index, shard_count)
    log.info("%s/%s: %s", os.fspath(data_dir), split, shard.describe(shard_index, shard_count))
    records = HostRecords(fetch(shard.files), shard.record_index, shard.record_count)
    if len(records) == 0:
        raise ValueError(f"shard {shard_index}/{shard_count} of {data_dir}/{split} holds no games")
    return records
