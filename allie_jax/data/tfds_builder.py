"""A TFDS dataset of game records built under Apache Beam (the scale path for monthly dumps).

``launch.prepare_data`` parses on one machine; this builder runs the very same per-game code
(``prepare.keep_raw_game``: ``pgn.parse_game``, the header filters, ``min_plies``, Elo
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

The Elo histogram for balancing (without ``elo_balance_file``) and the top-up of small val / test
splits (``PrepareConfig.min_split_games``) are Beam passes too: combiners over the reshuffled
chunks, fed back as side inputs. ``launch.train --config.data_dir`` accepts the build directly
(``shards.shard_paths`` finds the TFDS files; ``records.game_record`` unwraps the examples).

A data_dir holds one build: TFDS skips ``download_and_prepare`` when the version is already
there, so use a new data_dir for new inputs or a new config.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from allie_jax import pgn
from allie_jax.data import prepare as prepare_lib
from allie_jax.data import records, shards

DATASET_NAME = shards.TFDS_DATASET_NAME  # the class name below, snake-cased by TFDS
COUNTER_NAMESPACE = "allie_jax"


def read_chunks(path: str, chunk_games: int = prepare_lib.CHUNK_GAMES) -> Iterator[tuple]:
    """(path, index of the chunk's first game in the file, raw games) for one PGN file.

    A compressed file cut short (``pgn.InputStatus.truncated``) has its last game replaced by
    ``CUT_GAME``, which ``parse_chunk`` counts as ``truncated``, as ``prepare`` does.
    """
    chunk: list = []
    start = 0
    status = pgn.InputStatus(path)
    previous = None
    index = -1
    for index, raw in enumerate(pgn.split_games(pgn.lines(path, status))):
        if previous is not None:
            if not chunk:
                start = index - 1
            chunk.append(previous)
            if len(chunk) >= chunk_games:
                yield path, start, chunk
                chunk = []
        previous = (raw.header_lines, raw.move_lines, raw.complete)
    if previous is not None:
        if not chunk:
            start = index
        chunk.append(CUT_GAME if status.truncated else previous)
    if chunk:
        yield path, start, chunk


CUT_GAME = (None, None, False)


def parse_chunk(
    item: tuple,
    config: prepare_lib.PrepareConfig,
    balance: shards.EloBalance | None,
) -> Iterator[tuple[str, str, dict, float]]:
    """(split, key, example, split hash) for each kept game of a chunk; drop reasons go to Beam
    counters. Each kept game's place in its file is its key (deterministic, as TFDS requires).
    """
    from apache_beam.metrics import Metrics

    path, start, raw_games = item
    for offset, (header_lines, move_lines, complete) in enumerate(raw_games):
        stats = pgn.ParseStats()
        if header_lines is None:  # CUT_GAME
            stats.games_read += 1
            stats.drop("truncated")
            kept = None
        else:
            raw = pgn.RawGame()
            raw.header_lines, raw.move_lines, raw.complete = header_lines, move_lines, complete
            kept = prepare_lib.keep_raw_game(raw, config, balance, stats)
        for reason, count in stats.dropped.items():
            Metrics.counter(COUNTER_NAMESPACE, f"dropped_{reason}").inc(count)
        Metrics.counter(COUNTER_NAMESPACE, "games_read").inc(stats.games_read)
        if kept is not None:
            split, record, _tokens, _bin, u = kept
            yield split, f"{path}:{start + offset:012d}", {"record": record}, u


def chunk_elo_bins(item: tuple, config: prepare_lib.PrepareConfig) -> Iterator[int]:
    """Mean-Elo bins of a chunk's games that pass the header filters (the Beam histogram pass)."""
    for header_lines, _moves, _complete in item[2]:
        if header_lines is not None:
            b = prepare_lib.header_elo_bin(header_lines, config)
            if b is not None:
                yield b


def balance_from_counts(counts: dict, seed: int) -> shards.EloBalance:
    return shards.EloBalance.from_counts(dict(counts), seed=seed)


def split_moves(lowest: list, counts: dict, config: prepare_lib.PrepareConfig) -> dict[str, str]:
    """{key: new split} for the train games that top up small val / test splits: the rule of
    ``prepare`` (``split_minimums``, lowest split hash first, test before val)."""
    counts = dict(counts)
    want = prepare_lib.split_minimums(sum(counts.values()), config)
    moves: dict[str, str] = {}
    candidates = sorted(lowest)  # (hash, key)
    i = 0
    for split in ("test", "val"):
        need = max(0, want[split] - counts.get(split, 0))
        for _, key in candidates[i : i + need]:
            moves[key] = split
        i += need
    return moves


def _apply_moves(item: tuple, moves: dict) -> tuple:
    split, key, example, u = item
    return moves.get(key, split), key, example, u


def _keep_split(item: tuple, split: str) -> bool:
    return item[0] == split


def _key_example(item: tuple) -> tuple[str, dict]:
    return item[1], item[2]


def _split_of(item: tuple) -> str:
    return item[0]


def _is_train(item: tuple) -> bool:
    return item[0] == "train"


def _hash_key(item: tuple) -> tuple[float, str]:
    return item[3], item[1]


def elo_balance_for(files: Sequence[str], config: prepare_lib.PrepareConfig):
    """The Elo balancing ``prepare.prepare`` would use for these files (None when off), when it
    does not need a histogram (a file); else None and the builder computes it in Beam."""
    if not config.elo_balance or not config.elo_balance_file:
        return None
    return shards.EloBalance.from_file(config.elo_balance_file, seed=config.seed)


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
            config = self._prepare_config
            chunks = (
                pipeline
                | "files" >> beam.Create(self._pgn_files)
                | "split_games" >> beam.FlatMap(read_chunks)
                | "spread" >> beam.Reshuffle()
            )
            balance = self._balance
            if config.elo_balance and balance is None:
                # The Elo histogram as a Beam pass over the headers, spread like the parsing.
                counts = (
                    chunks
                    | "elo_bins" >> beam.FlatMap(chunk_elo_bins, config=config)
                    | "count_bins" >> beam.combiners.Count.PerElement()
                    | "bins_dict" >> beam.combiners.ToDict()
                )
                balance = beam.pvalue.AsSingleton(
                    counts | "balance" >> beam.Map(balance_from_counts, seed=config.seed)
                )
            parsed = chunks | "parse" >> beam.FlatMap(parse_chunk, config=config, balance=balance)
            if config.min_split_games > 0 and config.val_frac + config.test_frac > 0:
                split_counts = (
                    parsed
                    | "splits" >> beam.Map(_split_of)
                    | "count_splits" >> beam.combiners.Count.PerElement()
                    | "splits_dict" >> beam.combiners.ToDict()
                )
                lowest = (
                    parsed
                    | "train_only" >> beam.Filter(_is_train)
                    | "hash_key" >> beam.Map(_hash_key)
                    | "lowest" >> beam.combiners.Top.Smallest(2 * config.min_split_games)
                )
                moves = lowest | "moves" >> beam.Map(
                    split_moves, counts=beam.pvalue.AsSingleton(split_counts), config=config
                )
                parsed = parsed | "top_up" >> beam.Map(
                    _apply_moves, moves=beam.pvalue.AsSingleton(moves)
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

    ``config.records_per_shard`` does not apply (TFDS sizes its own shards). Elo balancing
    from a histogram and the small-split top-up run as Beam passes (no serial pre-pass here).
    """
    config = config if config is not None else prepare_lib.PrepareConfig()
    files = prepare_lib.expand_inputs(pgn_files)
    if "-" in files:
        raise ValueError("the TFDS builder reads files, not stdin ('-')")
    if config.input_format != "pgn":
        raise ValueError(
            f"the TFDS builder reads PGN; convert {config.input_format} files with "
            "`python -m launch.prepare_data --input_format released_bin`"
        )
    balance = elo_balance_for(files, config)
    return _builder_class()(
        pgn_files=files,
        prepare_config=config,
        balance=balance,
        data_dir=data_dir,
        file_format=file_format,
    )
