"""Training batches from ArrayRecord shards with grain (docs/INTERFACES.md, ``allie_jax.data``).

ArrayRecord source → this process's records (``host_shards``: its own files when there are at
least as many as processes, else ``[shard_index::shard_count]``) → shuffle (a fresh
permutation every epoch) → repeat → decode + augment + cut into pieces → first-fit packing into
``seq_len`` rows → batches. Everything random is a function of (seed, epoch, record index), and
every stage is a grain dataset with checkpointable state, so ``get_state``/``set_state`` resume
with exactly the same batches.
"""

from __future__ import annotations

import hashlib
import os

import grain
import numpy as np

from allie_jax.data import host_shards, packing, records
from allie_jax.game import encode_game

DROP_ELO_RATE = 0.05  # SPEC §1 augmentation: both Elos -> one <BOS>
DROP_TC_RATE = 0.05  # SPEC §1 augmentation: time control -> <UNK>


def augmentation_flags(seed: int, epoch: int, record_index: int) -> tuple[bool, bool]:
    """(drop_elo, drop_time_control), two independent 5% draws from a hash (deterministic)."""
    digest = hashlib.blake2b(f"aug\x00{seed}\x00{epoch}\x00{record_index}".encode(), digest_size=16)
    a, b = np.frombuffer(digest.digest(), "<u8")
    return bool(a / 2.0**64 < DROP_ELO_RATE), bool(b / 2.0**64 < DROP_TC_RATE)


class _ToPieces(grain.transforms.MapWithIndex):
    def __init__(self, *, seq_len, seed, epoch_len, augment, with_ids, shard_index):
        self.seq_len, self.seed, self.epoch_len = seq_len, seed, epoch_len
        self.augment, self.with_ids, self.shard_index = augment, with_ids, shard_index

    def map_with_index(self, index: int, record: bytes) -> list[dict[str, np.ndarray]]:
        epoch, position = divmod(index, self.epoch_len)
        game = records.deserialize_game(records.game_record(record))  # ours or a TFDS example
        drop_elo = drop_tc = False
        if self.augment:
            drop_elo, drop_tc = augmentation_flags(
                self.seed, epoch, position * 65_536 + self.shard_index
            )
        enc = encode_game(game, drop_elo=drop_elo, drop_time_control=drop_tc)
        pieces = packing.game_pieces(enc, self.seq_len)
        if self.with_ids:
            for i, piece in enumerate(pieces):
                n = len(piece["inputs"])
                piece["record_index"] = np.full(n, index, np.int32)
                piece["piece_index"] = np.full(n, i, np.int32)
        return pieces


class _Flatten(grain.experimental.FlatMapTransform):
    max_fan_out = 64

    def flat_map(self, pieces):
        return pieces


def _finish(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {k: row[k] for k in row if not k.endswith(("_segment_ids", "_positions"))}
    out["segment_ids"] = row["inputs_segment_ids"].astype(np.int32)
    out["positions"] = row["inputs_positions"].astype(np.int32)
    return out


def make_dataset(
    data_dir: str | os.PathLike,
    split: str,
    *,
    batch_size: int,
    seq_len: int = 512,
    seed: int = 0,
    shard_index: int = 0,
    shard_count: int = 1,
    augment: bool = True,
    num_epochs: int | None = None,
    num_packing_bins: int | None = None,
    max_games_per_row: int | None = None,
    with_ids: bool = False,
) -> grain.IterDataset:
    """The grain dataset behind ``make_iterator``; ``with_ids`` adds ``record_index`` (the
    global index: epoch × records + position) and ``piece_index`` features for debugging.
    ``max_games_per_row`` caps the game pieces packed into one row (None: as many as fit)."""
    source = host_shards.open_records(data_dir, split, shard_index, shard_count)
    ds = grain.MapDataset.source(source)
    epoch_len = len(ds)
    ds = ds.shuffle(seed=seed).repeat(num_epochs)
    ds = ds.map_with_index(
        _ToPieces(
            seq_len=seq_len,
            seed=seed,
            epoch_len=epoch_len,
            augment=augment,
            with_ids=with_ids,
            shard_index=shard_index,
        )
    )
    it = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), _Flatten())
    fields = packing.FIELDS + (("record_index", "piece_index") if with_ids else ())
    padding = dict(packing.PADDING, record_index=-1, piece_index=-1)
    it = grain.experimental.FirstFitPackIterDataset(
        it,
        length_struct={k: seq_len for k in fields},
        num_packing_bins=num_packing_bins or batch_size,
        shuffle_bins=False,
        # The cuDNN kernel's packed layout has a static number of segment slots per row.
        max_sequences_per_bin=max_games_per_row,
        padding_struct={k: padding[k] for k in fields},
    )
    return it.map(_finish).batch(batch_size, drop_remainder=num_epochs is None)


def make_iterator(
    data_dir: str | os.PathLike,
    split: str,
    *,
    batch_size: int,
    seq_len: int = 512,
    seed: int = 0,
    shard_index: int = 0,
    shard_count: int = 1,
    augment: bool = True,
    num_epochs: int | None = None,
    worker_count: int = 0,
    worker_buffer_size: int = 1,
    **kwargs,
):
    """An iterator of dict batches with ``get_state()`` / ``set_state()`` (docs/INTERFACES.md).

    ``worker_count > 0`` runs the pipeline in that many grain worker processes (each on a slice
    of the records, ``worker_buffer_size`` batches ahead). Deterministic and resumable for a given
    worker count, but packing happens per worker, so a different count gives different batches.
    """
    ds = make_dataset(
        data_dir,
        split,
        batch_size=batch_size,
        seq_len=seq_len,
        seed=seed,
        shard_index=shard_index,
        shard_count=shard_count,
        augment=augment,
        num_epochs=num_epochs,
        **kwargs,
    )
    if worker_count > 0:
        from absl import flags

        if not flags.FLAGS.is_parsed():  # grain's workers read absl flags (outside an absl app)
            flags.FLAGS.mark_as_parsed()
        ds = ds.mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=int(worker_count), per_worker_buffer_size=int(worker_buffer_size)
            )
        )
    return iter(ds)
