"""Game records survive serialization exactly; shards and per-game decisions are deterministic."""

from __future__ import annotations

import io

import numpy as np
import pytest

from allie_jax import pgn
from allie_jax.data import records, shards
from allie_jax.game import Game
from tests.test_pgn import CHESSCOM


def test_round_trip_sample(sample_pgn):
    games = list(pgn.read_games(sample_pgn))
    for g in games:
        assert records.deserialize_game(records.serialize_game(g)) == g


def test_round_trip_edge_cases():
    (chesscom,) = pgn.read_games(io.StringIO(CHESSCOM))
    back = records.deserialize_game(records.serialize_game(chesscom))
    np.testing.assert_allclose(back.think_times, chesscom.think_times, atol=1e-5)
    np.testing.assert_allclose(back.clocks, chesscom.clocks, atol=1e-5)
    bare = Game(moves=["e2e4", "e7e8q"], termination="other", white="名前")
    assert records.deserialize_game(records.serialize_game(bare)) == bare


def test_corrupt_records_rejected():
    data = records.serialize_game(Game(moves=["e2e4"], result=1.0))
    with pytest.raises(records.RecordError):
        records.deserialize_game(b"XXXX" + data[4:])
    with pytest.raises(records.RecordError):
        records.deserialize_game(data[:-1])
    with pytest.raises(records.RecordError):
        records.deserialize_game(data + b"\x00")


def test_shards_roll_over_and_read_back(tmp_path):
    with shards.ShardWriter(tmp_path, "train", records_per_shard=3) as w:
        for i in range(7):
            w.write(bytes([i]) * (i + 1))
    paths = shards.shard_paths(tmp_path, "train")
    assert len(paths) == 3
    got = [r for p in paths for r in shards.read_records(p)]
    assert got == [bytes([i]) * (i + 1) for i in range(7)]
    with pytest.raises(FileNotFoundError, match="prepare_data"):
        shards.shard_paths(tmp_path, "val")


def test_split_is_a_function_of_id_and_seed():
    ids = [f"game{i}" for i in range(20000)]
    a = [shards.assign_split(g, seed=0, val_frac=0.1, test_frac=0.2) for g in ids]
    assert a == [shards.assign_split(g, seed=0, val_frac=0.1, test_frac=0.2) for g in ids]
    frac = {s: a.count(s) / len(a) for s in shards.SPLITS}
    assert abs(frac["test"] - 0.2) < 0.02 and abs(frac["val"] - 0.1) < 0.02
    b = [shards.assign_split(g, seed=1, val_frac=0.1, test_frac=0.2) for g in ids]
    assert a != b


def test_elo_balance_flattens_bins():
    counts = {1000: 100, 1500: 1000, 2000: 10000}
    bal = shards.EloBalance.from_counts(counts)
    assert bal.keep_prob == {1000: 1.0, 1500: 1.0, 2000: 0.1}
    kept = sum(bal.keep(f"g{i}", 2000, 2050) for i in range(10000))
    assert 900 < kept < 1100
    assert bal.keep("x", None, 1500) and bal.keep("x", 700, 700)
