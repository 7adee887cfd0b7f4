"""Training batches for the board-state transformer: one example per position of the game records.

The same ArrayRecord game shards the decoder trains on (``launch.prepare_data``) → this process's
records (``host_shards``: its own files, or every file's records ``[i::n]``) → a record order (a
fresh permutation every epoch; or the rating curriculum) → each game replayed with python-chess
into one example per position (``board_features.game_examples``) → a window shuffle, so a batch
mixes positions of many games → batches of ``board_features.FIELDS``.

Rating curriculum (seed 001, ``curriculum=True``): games are bucketed by the players' mean rating
(``RATING_BUCKETS``: 1000–1500, 1500–2000, 2000–2500, 2500+); training sees one epoch of each
bucket in turn, then the last bucket for the rest of the run. Games without ratings or below
the first bucket are not used under the curriculum. Bucketing reads every record's header once
when the iterator is built.

Everything random is a function of (seed, epoch) and every stage is a grain dataset with
checkpointable state, so ``get_state`` / ``set_state`` resume with the same batches.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import grain
import numpy as np

from allie_jax.data import board_features, host_shards, records

RATING_BUCKETS: tuple[tuple[int, int | None], ...] = (
    (1000, 1500),
    (1500, 2000),
    (2000, 2500),
    (2500, None),
)
MAX_POSITIONS_PER_GAME = 1024  # grain's flat-map fan-out; later positions of longer games are cut
_ENDLESS = 1 << 40  # "forever" as a MapDataset length


def mean_rating_bucket(
    white_elo: int | None,
    black_elo: int | None,
    buckets: Sequence[tuple[int, int | None]] = RATING_BUCKETS,
) -> int | None:
    """Index of the bucket holding the players' mean rating (None: no rating or outside all)."""
    if white_elo is None or black_elo is None:
        return None
    mean = (white_elo + black_elo) / 2
    for i, (lo, hi) in enumerate(buckets):
        if mean >= lo and (hi is None or mean < hi):
            return i
    return None


class RecordSchedule:
    """Global step index → record index: per-epoch permutations, optionally a curriculum.

    ``segments`` are (record indices, epochs) pairs played in order; ``None`` epochs on the last
    segment repeats it forever.
    """

    def __init__(self, segments: Sequence[tuple[np.ndarray, int | None]], seed: int):
        self.segments = [(np.asarray(idx, np.int64), ep) for idx, ep in segments if len(idx)]
        if not self.segments:
            raise ValueError("the record schedule is empty (no games in any bucket)")
        self.seed = seed
        self.length = 0
        for i, (idx, ep) in enumerate(self.segments):
            if ep is None:
                if i != len(self.segments) - 1:
                    raise ValueError("only the last segment may repeat forever")
                self.length = _ENDLESS
                break
            self.length += len(idx) * ep

    @functools.lru_cache(maxsize=8)  # noqa: B019 - a handful of (segment, epoch) permutations
    def _perm(self, segment: int, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, segment, epoch])
        return self.segments[segment][0][rng.permutation(len(self.segments[segment][0]))]

    def __call__(self, index: int) -> int:
        for s, (idx, ep) in enumerate(self.segments):
            span = len(idx) * ep if ep is not None else None
            if span is None or index < span:
                epoch, pos = divmod(index, len(idx))
                return int(self._perm(s, epoch)[pos])
            index -= span
        raise IndexError("index past the end of the record schedule")


def _bucket_indices(source, buckets: Sequence[tuple[int, int | None]]) -> list[np.ndarray]:
    members: list[list[int]] = [[] for _ in buckets]
    for i in range(len(source)):
        game = records.deserialize_game(source[i])
        b = mean_rating_bucket(game.white_elo, game.black_elo, buckets)
        if b is not None:
            members[b].append(i)
    return [np.asarray(m, np.int64) for m in members]


class _Positions(grain.experimental.FlatMapTransform):
    max_fan_out = MAX_POSITIONS_PER_GAME

    def flat_map(self, record: bytes):
        game = records.deserialize_game(record)
        game.moves = game.moves[:MAX_POSITIONS_PER_GAME]
        return list(board_features.game_examples(game))


def make_board_dataset(
    data_dir: str | os.PathLike,
    split: str,
    *,
    batch_size: int,
    seed: int = 0,
    shard_index: int = 0,
    shard_count: int = 1,
    num_epochs: int | None = None,
    curriculum: bool = False,
    buckets: Sequence[tuple[int, int | None]] = RATING_BUCKETS,
    shuffle_window: int = 2048,
) -> grain.IterDataset:
    """The grain dataset behind ``make_board_iterator`` (``shuffle_window=0``: no shuffling)."""
    source = host_shards.open_records(data_dir, split, shard_index, shard_count)
    if curriculum:
        per_bucket = _bucket_indices(source, buckets)
        epochs: list[int | None] = [1] * (len(per_bucket) - 1) + [num_epochs]
        segments = list(zip(per_bucket, epochs, strict=True))
    else:
        segments = [(np.arange(len(source)), num_epochs)]
    schedule = RecordSchedule(segments, seed)
    ds = grain.MapDataset.range(schedule.length).map(lambda i: source[schedule(i)])
    it = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), _Positions())
    if shuffle_window > 1:
        it = grain.experimental.WindowShuffleIterDataset(it, window_size=shuffle_window, seed=seed)
    return it.batch(batch_size, drop_remainder=num_epochs is None)


def make_board_iterator(data_dir: str | os.PathLike, split: str, **kwargs):
    """An iterator of dict batches (``board_features.FIELDS``) with ``get_state`` / ``set_state``."""
    return iter(make_board_dataset(data_dir, split, **kwargs))
