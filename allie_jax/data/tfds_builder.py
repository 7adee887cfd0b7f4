"""A TFDS dataset of game records built under Apache Beam (the scale path for monthly dumps).

``launch.prepare_data`` parses on one machine; this builder runs the very same per-game code
(``prepare.process_chunk``: ``pgn.parse_game``, the header filters, ``min_plies``, Elo
balancing and ``shards.assign_split`` on the game id) inside a Beam pipeline, so a Dataflow /
Flink / Spark run and a local ``prepare_data`` run put the same games, with byte-identical
records, in the same splits (tests/test_tfds_builder.py checks it with the DirectRunner).

Each input file is read and split into raw games by one worker (a .zst stream cannot be split);
chunks of raw games are then reshuffled over the workers for parsing, which is where the time
goes. Examples are ``{"record": bytes}`` (``allie_jax.data.records`` version 1) written as
ArrayRecord, so neither building nor reading needs TensorFlow. tensorflow-datasets and
apache-beam are optional dependencies, imported only inside ``make_builder``:

    builder = make_builder(["/data/lichess_db_standard_rated_2024-*.pgn.zst"], "/data/tfds")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        beam_runner=apache_beam.runners.DirectRunner()))  # or beam_options for a cluster
    source = builder.as_data_source()  # {"train": ..., "val": ..., "test": ...}

A data_dir holds one build: TFDS skips ``download_and_prepare`` when the version is already
there, so use a new data_dir for new inputs or a new config.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from allie_jax import pgn
from allie_jax.data import prepare as prepare_lib
from allie_jax.data import records, shards

DATASET_NAME = "allie_lichess"
COUNTER_NAMESPACE = "allie_jax"


def read_chunks(path: str, chunk_games: int = prepare_lib.CHUNK_GAMES) -> Iterator[tuple]:
    """(path, index of the chunk's first game in the file, raw games) for one PGN file."""
    chunk: list = []
    start = 0
    for index, raw in enumerate(pgn.split_games(pgn._lines(path))):
        if not chunk:
            start = index
        chunk.append((raw.header_lines, raw.move_lines, raw.complete))
        if len(chunk) >= chunk_games:
            yield path, start, chunk
            chunk = []
    if chunk:
        yield path, start, chunk


def parse_chunk(
    item: tuple,
    config: prepare_lib.PrepareConfig,
    balance: shards.EloBalance | None,
) -> Iterator[tuple[str, str, dict]]:
    """(split, key, example) for each kept game of a chunk; drop reasons go to Beam counters.

    Games go one at a time through ``prepare.process_chunk`` so that each kept game keeps its
    place in the file as its key (deterministic, as TFDS requires).
    """
    from apache_beam.metrics import Metrics

    path, start, raw_games = item
    for offset, raw in enumerate(raw_games):
        result = prepare_lib.process_chunk(([raw], config, balance))
        for reason, count in result.stats.dropped.items():
            Metrics.counter(COUNTER_NAMESPACE, f"dropped_{reason}").inc(count)
        Metrics.counter(COUNTER_NAMESPACE, "games_read").inc(result.stats.games_read)
        for split, record, _tokens, _bin in result.written:
            Metrics.counter(COUNTER_NAMESPACE, f"written_{split}").inc()
            yield split, f"{path}:{start + offset:012d}", {"record": record}


def _keep_split(item: tuple, split: str) -> bool:
    return item[0] == split


def _key_example(item: tuple) -> tuple[str, dict]:
    return item[1], item[2]


def elo_balance_for(files: Sequence[str], config: prepare_lib.PrepareConfig):
    """The Elo balancing ``prepare.prepare`` would use for these files (None when off)."""
    if not config.elo_balance:
        return None
    if config.elo_balance_file:
        return shards.EloBalance.from_file(config.elo_balance_file, seed=config.seed)
    counts = prepare_lib.elo_histogram_pass(files, config)  # headers only: one cheap pass
    return shards.EloBalance.from_counts(counts, seed=config.seed)


_BUILDER_CLASS = None


def _builder_class():
    """The builder class, defined once (TFDS registers dataset classes by name)."""
    global _BUILDER_CLASS
    if _BUILDER_CLASS is not None:
        return _BUILDER_CLASS
    import apache_beam as beam
    import numpy as np
    import tensorflow_datasets as tfds

    class AllieLichess(tfds.core.GeneratorBasedBuilder):
        """Lichess / chess.com games as allie-jax game records (allie_jax.data.records)."""

        VERSION = tfds.core.Version(f"{records.FORMAT_VERSION}.0.0")
        RELEASE_NOTES = {VERSION.__str__(): "Game records, format version 1."}

        def __init__(self, *, pgn_files, prepare_config, balance, **kwargs):
            self._pgn_files = list(pgn_files)
            self._prepare_config = prepare_config
            self._balance = balance
            super().__init__(**kwargs)

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                description=__doc__,
                features=tfds.features.FeaturesDict(
                    {"record": tfds.features.Scalar(dtype=np.object_)}
                ),
            )

        def _split_generators(self, dl_manager, pipeline):
            del dl_manager
            parsed = (
                pipeline
                | "files" >> beam.Create(self._pgn_files)
                | "split_games" >> beam.FlatMap(read_chunks)
                | "spread" >> beam.Reshuffle()
                | "parse"
                >> beam.FlatMap(parse_chunk, config=self._prepare_config, balance=self._balance)
            )
            # Parsed once, shared by the splits (TFDS passes ``pipeline`` for exactly this).
            generate = beam.ptransform_fn(self._generate_examples)
            return {split: parsed | split >> generate(split=split) for split in shards.SPLITS}

        def _generate_examples(self, pipeline, split):
            return pipeline | beam.Filter(_keep_split, split=split) | beam.Map(_key_example)

    _BUILDER_CLASS = AllieLichess
    return AllieLichess


def make_builder(
    pgn_files: Sequence[str],
    data_dir: str,
    config: prepare_lib.PrepareConfig | None = None,
    *,
    file_format: str = "array_record",
):
    """A TFDS builder over ``pgn_files`` (globs allowed) with ``launch.prepare_data``'s rules.

    ``config.records_per_shard`` does not apply (TFDS sizes its own shards).
    """
    config = config if config is not None else prepare_lib.PrepareConfig()
    files = prepare_lib.expand_inputs(pgn_files)
    if "-" in files:
        raise ValueError("the TFDS builder reads files, not stdin ('-')")
    balance = elo_balance_for(files, config)
    return _builder_class()(
        pgn_files=files,
        prepare_config=config,
        balance=balance,
        data_dir=data_dir,
        file_format=file_format,
    )
