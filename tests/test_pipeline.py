"""Batches decode back to exactly the games that went in; a saved state resumes identically."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.data import pipeline, prepare, records, shards


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, sample_pgn):
    out = tmp_path_factory.mktemp("prep")
    prepare.prepare(
        [str(sample_pgn)], out, prepare.PrepareConfig(events="all", val_frac=0.3, test_frac=0.0)
    )
    return out


def _split_games(data_dir, split):
    return [
        records.deserialize_game(r)
        for p in shards.shard_paths(data_dir, split)
        for r in shards.read_records(p)
    ]


def _decode(batches):
    """Group the rows' labelled positions by (record, piece) and rebuild each game."""
    pieces = collections.defaultdict(dict)
    for b in batches:
        for row in range(b["inputs"].shape[0]):
            seg = b["segment_ids"][row]
            for s in np.unique(seg[seg > 0]):
                m = seg == s
                rec, piece = b["record_index"][row][m][0], b["piece_index"][row][m][0]
                pos = b["positions"][row][m]
                np.testing.assert_array_equal(pos, np.arange(m.sum()))
                pieces[rec][piece] = {k: b[k][row][m] for k in b}
    games = []
    for parts in pieces.values():
        moves, times, values = [], [], []
        for i in sorted(parts):
            p = parts[i]
            pm = p["policy_mask"] > 0
            moves += [vocab.decode_move(t) for t in p["policy_targets"][pm] if t < vocab.NUM_MOVES]
            tm = p["time_mask"] > 0
            times += p["time_targets"][tm].tolist()
            values += p["value_targets"][p["value_mask"] > 0].tolist()
        games.append((tuple(moves), tuple(times), values[0]))
    return games


def test_batches_decode_to_the_games(data_dir):
    ds = pipeline.make_dataset(
        data_dir, "val", batch_size=4, seq_len=128, num_epochs=1, augment=False, with_ids=True
    )
    batches = list(ds)
    for b in batches:
        assert set(b) >= {
            "inputs",
            "segment_ids",
            "positions",
            "policy_targets",
            "time_targets",
            "value_targets",
            "policy_mask",
            "time_mask",
            "value_mask",
        }
        assert b["inputs"].dtype == np.int32 and b["time_targets"].dtype == np.float32
        assert (b["inputs"][b["segment_ids"] == 0] == vocab.PAD).all()
    want = sorted(
        (tuple(g.moves), tuple(t for t in g.think_times if t >= 0), g.result)
        for g in _split_games(data_dir, "val")
    )
    assert sorted(_decode(batches)) == want


def test_resume_gives_identical_batches(data_dir):
    it = pipeline.make_iterator(data_dir, "train", batch_size=3, seq_len=128, seed=3)
    for _ in range(4):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    fresh = pipeline.make_iterator(data_dir, "train", batch_size=3, seq_len=128, seed=3)
    fresh.set_state(state)
    for want in expected:
        got = next(fresh)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_sharding_partitions_records(data_dir):
    seen = []
    for shard in range(2):
        ds = pipeline.make_dataset(
            data_dir,
            "val",
            batch_size=2,
            seq_len=512,
            num_epochs=1,
            augment=False,
            shard_index=shard,
            shard_count=2,
        )
        seen.append(sum(int((b["inputs"] == vocab.EOS).sum()) for b in ds))
    assert sum(seen) == len(_split_games(data_dir, "val")) and min(seen) > 0


def test_augmentation_rates_and_determinism():
    flags = [pipeline.augmentation_flags(0, e, i) for e in range(2) for i in range(10000)]
    elo = np.mean([f[0] for f in flags])
    tc = np.mean([f[1] for f in flags])
    assert 0.04 < elo < 0.06 and 0.04 < tc < 0.06
    both = np.mean([f[0] and f[1] for f in flags])
    assert abs(both - elo * tc) < 0.003  # independent
    assert flags == [pipeline.augmentation_flags(0, e, i) for e in range(2) for i in range(10000)]


def test_augmented_headers_appear(data_dir):
    it = pipeline.make_iterator(data_dir, "train", batch_size=8, seq_len=512, seed=0)
    starts = []
    for _ in range(8):
        b = next(it)
        first = (b["positions"] == 0) & (b["segment_ids"] > 0)
        starts += b["inputs"][first].tolist()
    assert vocab.BOS in starts and all(t == vocab.BOS or t >= vocab.ELO_OFFSET for t in starts)


def test_games_per_row_capped_for_the_cudnn_layout(data_dir):
    """``max_games_per_row`` bounds the segments of every row (one slot stays for the padding
    run), so the cuDNN kernel's static layout holds every row; no game is lost on the way."""
    from allie_jax.model import attention

    def rows(cap):
        ds = pipeline.make_dataset(
            data_dir,
            "train",
            batch_size=4,
            seq_len=512,
            num_epochs=1,
            augment=False,
            with_ids=True,
            max_games_per_row=cap,
        )
        return list(ds)

    uncapped, capped = rows(None), rows(2)
    most = max(int(np.max(attention.segments_per_row(b["segment_ids"]))) for b in uncapped)
    assert most > 3  # the sample data does pack more than two games into a row
    for b in capped:
        assert int(np.max(attention.segments_per_row(b["segment_ids"]))) <= 3
    assert sorted(_decode(capped)) == sorted(_decode(uncapped))
