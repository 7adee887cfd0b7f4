"""A TFDS dataset builder for Lichess monthly dumps, parsed under Apache Beam (the scale path).

Each input file is split into raw games by the reading worker and parsed with the same
``allie_jax.pgn.parse_game`` and ``prepare.header_filter`` as ``launch.prepare_data``; the split of
a game is the same hash of its id, so the TFDS splits and the ArrayRecord splits agree game for
game. tensorflow-datasets and apache-beam are heavy optional dependencies, imported only when a
builder is created (``make_builder``), never by the rest of the library.

    builder = make_builder(pgn_files=[...], data_dir="/data/tfds", config=PrepareConfig())
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        beam_runner=apache_beam.runners.DirectRunner()))
"""

from __future__ import annotations

from collections.abc import Sequence

from allie_jax.data import prepare as prepare_lib
from allie_jax.data import records, shards


def _parse_file(path: str, config: prepare_lib.PrepareConfig):
    """(key, example) pairs of the games of one file that pass every filter."""
    from allie_jax import pgn

    for index, raw in enumerate(pgn.split_games(pgn._lines(path))):
        try:
            parsed = pgn.parse_game(raw, require_clocks=config.require_clocks)
        except pgn.GameRejected:
            continue
        game = parsed.game
        if prepare_lib.header_filter(parsed.headers, config) or len(game.moves) < config.min_plies:
            continue
        split = shards.assign_split(
            game.game_id, seed=config.seed, val_frac=config.val_frac, test_frac=config.test_frac
        )
        yield split, f"{path}:{index}", {"record": records.serialize_game(game)}


def make_builder(
    pgn_files: Sequence[str],
    data_dir: str,
    config: prepare_lib.PrepareConfig | None = None,
):
    """A ``tfds.core.GeneratorBasedBuilder`` whose examples are version-1 game records."""
    config = config if config is not None else prepare_lib.PrepareConfig()
    import apache_beam as beam
    import tensorflow_datasets as tfds

    files = list(prepare_lib.expand_inputs(pgn_files))

    class AllieLichess(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version(f"{records.FORMAT_VERSION}.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                description="Lichess games as allie-jax game records (allie_jax.data.records).",
                features=tfds.features.FeaturesDict({"record": tfds.features.Scalar(dtype=str)}),
            )

        def _split_generators(self, dl_manager):
            del dl_manager
            return {split: self._generate_examples(split) for split in shards.SPLITS}

        def _generate_examples(self, split):
            return (
                beam.Create(files)
                | f"parse_{split}" >> beam.FlatMap(lambda p: _parse_file(p, config))
                | f"keep_{split}" >> beam.Filter(lambda item: item[0] == split)
                | f"key_{split}" >> beam.Map(lambda item: (item[1], item[2]))
            )

    return AllieLichess(data_dir=data_dir)
