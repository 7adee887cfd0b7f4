"""Each process opens only its own shard files (file-level split) when there are enough of them;
with fewer files than processes it keeps the record-level split. The two-process gs:// run is in
tests/test_train_distributed.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from allie_jax.data import host_shards, pipeline, shards
from allie_jax.data.prepare import PrepareConfig, prepare


@pytest.fixture(scope="module")
def five_files(tmp_path_factory, sample_pgn):
    """The bundled games with 200 records per shard: 5 train files (the last one partial), 1 val."""
    out = tmp_path_factory.mktemp("five")
    prepare(
        [str(sample_pgn)],
        out,
        PrepareConfig(events="all", val_frac=0.05, test_frac=0.05, records_per_shard=200),
    )
    assert len(shards.find_shards(out, "train")) == 5
    assert len(shards.find_shards(out, "val")) == 1
    return out


def test_split_files_assignment():
    files = [f"f{i}" for i in range(5)]
    assert host_shards.split_files(files, 0, 2).files == ("f0", "f2", "f4")
    one = host_shards.split_files(files, 1, 2)
    assert (one.files, one.record_index, one.record_count, one.file_level) == (
        ("f1", "f3"),
        0,
        1,
        True,
    )
    assert host_shards.split_files(files, 4, 5).files == ("f4",)  # as many files as processes
    assert host_shards.split_files(files, 0, 1).files == tuple(files)  # one process: everything
    few = host_shards.split_files(files[:3], 2, 4)  # fewer files than processes
    assert (few.files, few.record_index, few.record_count, few.file_level) == (
        ("f0", "f1", "f2"),
        2,
        4,
        False,
    )
    assert "record-level split" in few.describe(2, 4)
    with pytest.raises(ValueError, match=r"shard_index 2 not in \[0, 2\)"):
        host_shards.split_files(files, 2, 2)


def test_processes_read_their_own_files(five_files, caplog):
    files = shards.find_shards(five_files, "train")
    everything = [r for f in files for r in shards.read_records(f)]
    seen = []
    with caplog.at_level(logging.INFO, logger=host_shards.__name__):
        for i in range(2):
            mine = host_shards.open_records(five_files, "train", i, 2)
            want = [r for f in files[i::2] for r in shards.read_records(f)]
            assert mine.files == tuple(files[i::2])  # only its files are opened
            assert [mine[k] for k in range(len(mine))] == want
            seen += want
    assert sorted(seen) == sorted(everything)  # together all records, each once
    assert "process 1/2 reads 2 of 5 shard files (file-level split)" in caplog.text


def test_fewer_files_than_processes_split_records(five_files, caplog):
    (file,) = shards.find_shards(five_files, "val")
    everything = shards.read_records(file)
    with caplog.at_level(logging.INFO, logger=host_shards.__name__):
        parts = [host_shards.open_records(five_files, "val", i, 2) for i in range(2)]
    assert [p[k] for p in parts for k in range(len(p))] == everything[0::2] + everything[1::2]
    assert "record-level split" in caplog.text


def test_file_level_split_resumes_and_is_deterministic(five_files):
    def make():
        return pipeline.make_iterator(
            five_files, "train", batch_size=3, seq_len=128, seed=5, shard_index=1, shard_count=2
        )

    it = make()
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    fresh = make()
    fresh.set_state(state)
    again = make()  # the same seed and process: the same batches from the start
    first = next(make())
    np.testing.assert_array_equal(next(again)["inputs"], first["inputs"])
    for want in expected:
        got = next(fresh)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
