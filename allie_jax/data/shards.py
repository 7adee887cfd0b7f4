"""Writing game records into ArrayRecord shards, and the per-game decisions made on the way.

Every decision about a game (its split, whether Elo balancing keeps it) is a pure function of
the game id and the seed, never of file order or worker count, so re-running, re-sharding the
input or adding workers never moves a game between splits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping

from array_record.python import array_record_module

from allie_jax.data import paths

SPLITS = ("train", "val", "test")
ELO_BIN = 100  # SPEC §3: 100-Elo bins


def _unit_hash(*parts: object) -> float:
    """A uniform number in [0, 1) from the parts (stable across runs, platforms and Pythons)."""
    key = "\x00".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2.0**64


def split_hash(game_id: str, *, seed: int = 0) -> float:
    """The game's place on the split line in [0, 1): test below test_frac, then val, then train."""
    return _unit_hash("split", seed, game_id)


def assign_split(game_id: str, *, seed: int = 0, val_frac: float = 1e-4, test_frac: float = 2e-4):
    """'train' / 'val' / 'test' from a hash of (seed, game id)."""
    u = split_hash(game_id, seed=seed)
    if u < test_frac:
        return "test"
    if u < test_frac + val_frac:
        return "val"
    return "train"


def elo_bin(white_elo: int | None, black_elo: int | None) -> int | None:
    """Lower edge of the 100-Elo bin of the players' mean rating (None when an Elo is missing)."""
    if white_elo is None or black_elo is None:
        return None
    return int((white_elo + black_elo) / 2 // ELO_BIN * ELO_BIN)


@dataclasses.dataclass(frozen=True)
class EloBalance:
    """SPEC §3 downsampling: keep a game with the probability of its mean-Elo bin.

    ``keep_prob`` maps bin lower edges to probabilities; bins not listed (and games without Elo)
    are kept. ``from_counts`` caps every bin at ``target`` games, by default the median count of
    the non-empty bins: bins above it are thinned to about the median, the sparse extreme bins
    are kept whole (capping at the minimum would throw away nearly everything).
    """

    keep_prob: Mapping[int, float]
    seed: int = 0

    @classmethod
    def from_counts(
        cls, counts: Mapping[int, int], *, target: float | None = None, seed: int = 0
    ) -> EloBalance:
        nonzero = sorted(c for c in counts.values() if c > 0)
        if not nonzero:
            return cls({}, seed)
        if target is None:
            target = float(nonzero[len(nonzero) // 2])
        return cls({b: min(1.0, target / c) for b, c in counts.items() if c > 0}, seed)

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, seed: int = 0) -> EloBalance:
        """A JSON file with {"keep_prob": {bin: p}} or a histogram {"counts": {bin: n}} (or a
        prepare stats.json, whose "elo_histogram" is used as the counts)."""
        try:
            data = json.loads(paths.as_path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read Elo balance file {os.fspath(path)!r}: {e}") from e
        if "keep_prob" in data:
            return cls({int(k): float(v) for k, v in data["keep_prob"].items()}, seed)
        counts = data.get("counts", data.get("elo_histogram"))
        if not isinstance(counts, dict):
            raise ValueError(
                f"Elo balance file {os.fspath(path)!r} has none of keep_prob / counts / "
                "elo_histogram"
            )
        return cls.from_counts({int(k): int(v) for k, v in counts.items()}, seed=seed)

    def keep(self, game_id: str, white_elo: int | None, black_elo: int | None) -> bool:
        b = elo_bin(white_elo, black_elo)
        if b is None or b not in self.keep_prob:
            return True
        p = self.keep_prob[b]
        return p >= 1.0 or _unit_hash("elo", self.seed, game_id) < p

    def to_json(self) -> dict:
        return {"keep_prob": {str(k): v for k, v in sorted(self.keep_prob.items())}}


class ShardWriter:
    """Writes records of one split into ``dir/split/NAME-00000.array_record`` and onwards.

    ``out_dir`` is local (ArrayRecord's writer only does local files; ``prepare`` stages remote
    outputs). ``name`` defaults to the split.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        split: str,
        records_per_shard: int = 100_000,
        *,
        name: str | None = None,
    ):
        self.dir = pathlib.Path(out_dir) / split
        self.dir.mkdir(parents=True, exist_ok=True)
        self.split = split
        self.name = name or split
        self.records_per_shard = records_per_shard
        self.paths: list[pathlib.Path] = []
        self._writer = None
        self._in_shard = 0

    def write(self, record: bytes) -> None:
        if self._writer is None or self._in_shard >= self.records_per_shard:
            self._roll()
        self._writer.write(record)
        self._in_shard += 1

    def _roll(self) -> None:
        self._close_current()
        path = self.dir / f"{self.name}-{len(self.paths):05d}.array_record"
        # group_size:1 makes every record individually addressable (grain reads at random).
        self._writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
        self.paths.append(path)
        self._in_shard = 0

    def _close_current(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self._close_current()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


TFDS_DATASET_NAME = "allie_lichess"  # the TFDS builder's dataset (data.tfds_builder)


def find_shards(data_dir: str | os.PathLike, split: str) -> list[str]:
    """The shard files of a split, in order, where they are (local or remote: etils.epath).

    Two layouts are found: ``prepare_data``'s ``DATA_DIR/split/*.array_record``, and the TFDS
    builder's ``allie_lichess-split.array_record-*`` files, in ``data_dir`` itself (a version
    folder) or under ``data_dir/allie_lichess/VERSION/`` (the TFDS data_dir; newest version).
    Records of the second layout are tf.train.Examples: read them with ``records.game_record``.
    Raises ``FileNotFoundError`` saying what to run when there are none.
    """
    root = paths.as_path(data_dir)
    found = _glob(root / split, "*.array_record")
    if not found:
        pattern = f"{TFDS_DATASET_NAME}-{split}.array_record-*"
        found = _glob(root, pattern)
        versions = _glob(root / TFDS_DATASET_NAME, "*") if not found else []
        for version in sorted(versions, key=_version_key, reverse=True):
            if found := _glob(paths.as_path(version), pattern):
                break
    if not found:
        raise FileNotFoundError(
            f"no *.array_record files in {os.fspath(root / split)} (nor a TFDS "
            f"{TFDS_DATASET_NAME} build in {os.fspath(root)}): run `python -m "
            "launch.prepare_data` first"
        )
    return found


def shard_paths(data_dir: str | os.PathLike, split: str) -> list[str]:
    """``find_shards`` as local paths, for ArrayRecord's reader (which only does local files).

    Remote shards (``gs://...``) are copied once into the cache (``paths.local_copy``): all of
    them. Training reads through ``host_shards.open_records``, which fetches only the files of
    its own process.
    """
    return [paths.local_copy(p) for p in find_shards(data_dir, split)]


def _glob(folder, pattern: str) -> list[str]:
    return sorted(os.fspath(p) for p in folder.glob(pattern)) if folder.is_dir() else []


def _version_key(path: str) -> tuple:
    name = os.path.basename(path.rstrip("/"))
    return tuple(int(x) if x.isdigit() else -1 for x in name.split("."))


def write_shard(path: str | os.PathLike, recs) -> None:
    """One shard file holding ``recs`` (local path)."""
    writer = array_record_module.ArrayRecordWriter(os.fspath(path), "group_size:1")
    try:
        for r in recs:
            writer.write(r)
    finally:
        writer.close()


def read_records(path: str | os.PathLike) -> list[bytes]:
    reader = array_record_module.ArrayRecordReader(paths.local_copy(path))
    try:
        return reader.read_all()
    finally:
        reader.close()
