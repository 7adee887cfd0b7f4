"""The TFDS/Beam builder against ``launch.prepare_data`` on the bundled games (DirectRunner).

Both must keep the same games, with byte-identical records, in the same splits. Needs the
optional ``scale`` dependencies (tensorflow-datasets, apache-beam; no TensorFlow).
"""

from __future__ import annotations

import collections

import pytest

tfds = pytest.importorskip(
    "tensorflow_datasets",
    reason="tensorflow-datasets not installed (optional 'scale' dependencies)",
)
beam = pytest.importorskip(
    "apache_beam", reason="apache-beam not installed (optional 'scale' dependencies)"
)

from allie_jax.data import prepare, records, shards, tfds_builder  # noqa: E402

# The settings of the conftest ``prepared_sample`` fixture (launch.prepare_data's flags).
CONFIG = prepare.PrepareConfig(events="all", val_frac=0.05, test_frac=0.05)


@pytest.fixture(scope="module")
def built(tmp_path_factory, sample_pgn):
    builder = tfds_builder.make_builder(
        [str(sample_pgn)], str(tmp_path_factory.mktemp("tfds")), CONFIG
    )
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(beam_runner=beam.runners.DirectRunner())
    )
    return builder


def _tfds_records(builder, split: str) -> list[bytes]:
    source = builder.as_data_source()[split]
    return [source[i]["record"] for i in range(len(source))]


def _prepared_records(data_dir, split: str) -> list[bytes]:
    return [r for path in shards.shard_paths(data_dir, split) for r in shards.read_records(path)]


def test_same_games_per_split_as_prepare_data(built, prepared_sample):
    total = 0
    for split in shards.SPLITS:
        ours = _tfds_records(built, split)
        reference = _prepared_records(prepared_sample, split)
        assert collections.Counter(ours) == collections.Counter(reference), split
        assert len(ours) > 0
        total += len(ours)
    # Every record decodes, and ids are unique across splits.
    ids = [
        records.deserialize_game(r).game_id
        for split in shards.SPLITS
        for r in _tfds_records(built, split)
    ]
    assert len(ids) == len(set(ids)) == total
    assert built.info.splits["train"].num_examples == len(_tfds_records(built, "train"))


def test_split_of_each_game_is_its_id_hash(built):
    for split in shards.SPLITS:
        for record in _tfds_records(built, split):
            game_id = records.deserialize_game(record).game_id
            assert shards.assign_split(game_id, seed=0, val_frac=0.05, test_frac=0.05) == split


def test_stdin_rejected(tmp_path):
    with pytest.raises(ValueError, match="stdin"):
        tfds_builder.make_builder(["-"], str(tmp_path), CONFIG)


def test_filters_and_elo_balance_match_prepare(tmp_path, sample_pgn):
    """Default filters (rated blitz, no bots) plus Elo balancing: still the same games."""
    config = prepare.PrepareConfig(elo_balance=True, val_frac=0.1, test_frac=0.1)
    stats = prepare.prepare([str(sample_pgn)], tmp_path / "prepared", config, progress=False)
    builder = tfds_builder.make_builder([str(sample_pgn)], str(tmp_path / "tfds"), config)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(beam_runner=beam.runners.DirectRunner())
    )
    assert stats["dropped"].get("elo_balance", 0) > 0  # the balancing really dropped games
    for split in shards.SPLITS:
        ours = collections.Counter(_tfds_records(builder, split))
        assert ours == collections.Counter(_prepared_records(tmp_path / "prepared", split))
        assert sum(ours.values()) == stats["per_split"][split]["games"]


def test_beam_histogram_top_up_and_training_reader(tmp_path, sample_pgn):
    """Elo balancing from a Beam histogram pass, small val / test topped up in Beam: the same
    games as prepare_data; and the pipeline reads the TFDS build directly."""
    from allie_jax.data import pipeline

    config = prepare.PrepareConfig(elo_balance=True)  # default fractions: tiny splits here
    stats = prepare.prepare([str(sample_pgn)], tmp_path / "prepared", config, progress=False)
    assert stats["split_minimums_moved"]  # the top-up really happened
    assert stats["dropped"].get("elo_balance", 0) > 0
    builder = tfds_builder.make_builder([str(sample_pgn)], str(tmp_path / "tfds"), config)
    assert builder._balance is None  # no serial pre-pass: the histogram is computed in Beam
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(beam_runner=beam.runners.DirectRunner())
    )
    for split in shards.SPLITS:
        ours = collections.Counter(_tfds_records(builder, split))
        assert ours == collections.Counter(_prepared_records(tmp_path / "prepared", split))
    # One reader for both layouts: the TFDS data_dir, and its version folder.
    raw = shards.read_records(shards.shard_paths(tmp_path / "tfds", "val")[0])
    assert [records.game_record(r) for r in raw] == _tfds_records(builder, "val")
    for data_dir in (tmp_path / "tfds", builder.data_dir):
        a = pipeline.make_iterator(data_dir, "val", batch_size=4, seq_len=128, num_epochs=1)
        b = pipeline.make_iterator(
            tmp_path / "prepared", "val", batch_size=4, seq_len=128, num_epochs=1
        )
        total_a = sum(int(x["policy_mask"].sum()) for x in a)
        total_b = sum(int(x["policy_mask"].sum()) for x in b)
        assert total_a == total_b > 0


@pytest.mark.slow
def test_train_reads_a_tfds_build_directly(built, tmp_path):
    """launch.train's library entry on the TFDS data_dir: no conversion step in between."""
    from allie_jax.train import train_and_evaluate
    from configs.tiny import get_config

    config = get_config()
    config.data.data_dir = str(built.data_dir)  # the version folder; its parent works too
    config.data.seq_len = 128
    config.train.steps = 4
    config.train.batch_size = 4
    config.train.log_every = 2
    config.train.eval_every = 4
    config.train.eval_batches = 1
    config.train.checkpoint_every = 4
    config.train.async_checkpoints = False
    result = train_and_evaluate(config, str(tmp_path / "work"))
    assert result.final_step == 4 and result.val_metrics
