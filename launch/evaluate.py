"""Every offline result of the paper from one command (SPEC §5).

    python -m launch.evaluate --checkpoint DIR --games FILE.pgn[.zst] --output OUTDIR \\
        [--systems policy,greedy,search,adaptive] [--max_games N] [--stockfish PATH]

writes per-position records (OUTDIR/records, Parquet; docs/records.md), then OUTDIR/report.json,
OUTDIR/report.md and PNG plots computed from them. ``--checkpoint`` is a checkpoint directory or a
training workdir (its best checkpoint, else the latest).

At scale: ``--num_shards N --shard_index K`` runs one shard; in a SLURM array or a Kubernetes
Indexed Job the index comes from ``SLURM_ARRAY_TASK_ID`` / ``JOB_COMPLETION_INDEX``, under
``--distributed`` from the jax process (docs/cluster/); a killed run restarted with the same flags
skips its committed chunks. The first task indexes the games once for all (``--prepare_index``
does it as a step of its own). The report of a finished job (its records directory, or a parent of
per-task output folders), or of a slice of it:

    python -m launch.evaluate --report_only OUTDIR/records --output OUT2 [--filter "white_elo >= 2000"]
"""

from __future__ import annotations

import sys

from absl import app, flags

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Allie checkpoint dir or training workdir (not needed for Maia-only runs)."
)
_MAIA_DIR = flags.DEFINE_string(
    "maia_dir",
    None,
    "Directory of Maia-1 nets (maia-1100..1900.pb.gz); = --system_options maia_dir=",
)
_PIKL_LAMBDA = flags.DEFINE_float(
    "pikl_lambda",
    None,
    "piKL's KL weight for the search systems on Maia (maia+search, maia+gumbel); default: Grill's "
    "lambda_N / mctx's scale. A sweep is one run per value; = --system_options pikl_lambda=",
)
_GAMES = flags.DEFINE_string("games", None, "PGN of human games (.pgn, .pgn.zst, .pgn.bz2).")
_OUTPUT = flags.DEFINE_string("output", None, "Directory for report.json, report.md, plots.")
_SYSTEMS = flags.DEFINE_list(
    "systems",
    ["policy", "greedy", "search", "adaptive"],
    "Systems to score for move matching (allie_jax/eval/systems.py lists them).",
)
_MAX_GAMES = flags.DEFINE_integer("max_games", 1000, "Read at most this many games.")
_STOCKFISH = flags.DEFINE_string(
    "stockfish", None, "UCI Stockfish binary (e.g. /usr/games/stockfish) for the value oracle."
)
_SEARCH_POSITIONS = flags.DEFINE_string(
    "search_positions",
    "2000",
    "Move-matching positions scored by search systems: a count (a seeded subsample of the whole "
    "input) or 'all'.",
)
_RANDOM_GAMES = flags.DEFINE_integer(
    "random_games", 100, "Random legal games for the out-of-distribution legality check."
)
_STOCKFISH_POSITIONS = flags.DEFINE_integer(
    "stockfish_positions", 200, "Positions analysed by Stockfish."
)
_STOCKFISH_NODES = flags.DEFINE_integer("stockfish_nodes", 20_000, "Stockfish nodes per position.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 16, "Causal pass size: batch_size x 64 tokens of packed games per device call."
)
_SEARCH_BATCH_SIZE = flags.DEFINE_integer("search_batch_size", 64, "Positions per search batch.")
_CALIBRATION_PGN = flags.DEFINE_string(
    "calibration_pgn", None, "PGN of games played by systems (launch.match) for skill calibration."
)
_CALIBRATION_SYSTEMS = flags.DEFINE_list(
    "calibration_systems", [], "System names (PGN White/Black) to calibrate."
)
_SYSTEM_OPTIONS = flags.DEFINE_list(
    "system_options",
    [],
    "key=value options for system factories (see allie_jax/eval/systems.py), e.g. maia_dir=PATH.",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the subsamples and random games.")
_PLOTS = flags.DEFINE_boolean("plots", True, "Write PNG plots.")
_TOP_K = flags.DEFINE_integer("top_k", 5, "Moves kept per position and system in the records.")
_CHUNK_GAMES = flags.DEFINE_integer("chunk_games", 256, "Games per committed records chunk.")
_RECORDS = flags.DEFINE_string("records", None, "Records directory (default OUTPUT/records).")
_NUM_SHARDS = flags.DEFINE_integer(
    "num_shards",
    None,
    "Split the games into this many shards by game id (default: 1, or one "
    "per process under --distributed).",
)
_SHARD_INDEX = flags.DEFINE_integer("shard_index", None, "The shard this process scores.")
_INDEX_DIR = flags.DEFINE_string(
    "index_dir",
    None,
    "Where the job's byte-offset index of --games is built once and shared, with a seekable copy "
    "(one zstd frame per game) of a compressed input (default RECORDS/index; give one shared "
    "path when tasks write per-task folders); 'none': every task streams the whole input.",
)
_PREPARE_INDEX = flags.DEFINE_boolean(
    "prepare_index",
    False,
    "Only build the job's shared index of --games (and the seekable copy of a compressed input) "
    "at --index_dir (default RECORDS/index), then exit: a step before the array tasks, which "
    "otherwise build it on first use (the first one, while the others wait). Same flags as the "
    "tasks, without the shard.",
)
_DISTRIBUTED = flags.DEFINE_boolean(
    "distributed", False, "Call jax.distributed.initialize(): each process scores its own shard."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "With --distributed off TPU/Slurm/MPI: host:port of process 0."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "With --coordinator_address.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "With --coordinator_address.")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache",
    None,
    "JAX persistent compilation cache directory, so a second run skips compiling the model "
    "passes (default: $ALLIE_JAX_CACHE_DIR or ~/.cache/allie_jax/jax); 'none' turns it off.",
)
_REPORT_ONLY = flags.DEFINE_string(
    "report_only", None, "Build the report from this records directory (no model is run)."
)
_BASELINE = flags.DEFINE_string(
    "baseline",
    None,
    "Also pair every system with this one on the same positions (each search system is always "
    "paired with its own base: search -> policy, maia+search -> maia, board+search -> board).",
)
_CLUSTER = flags.DEFINE_enum(
    "cluster",
    "game",
    ["game", "player"],
    "The report's bootstrap unit: positions of one game (or of one player) move together.",
)
_FILTER = flags.DEFINE_string(
    "filter",
    None,
    "With --report_only: keep records matching this expression, e.g. "
    "\"white_elo >= 2000 and time_control == '180+0'\" (docs/records.md).",
)


def _parse_options(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--system_options entry {item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return out


def main(argv):
    del argv
    from allie_jax import cli

    cli.setup("launch.evaluate", "output")  # library INFO logs to OUT/logs/evaluate.log
    from allie_jax.pgn import PGNError

    # Missing or unreadable checkpoint (CheckpointError is a ValueError), missing / junk / empty
    # PGN (PGNError, OSError, the evaluator's "no usable game" ValueError), bad flag values,
    # records of another job (RecordsError is a ValueError).
    user_errors = (ValueError, PGNError, OSError)
    try:
        report = _run()
    except user_errors as err:  # a bad path or input: one line, not a traceback
        print(f"launch.evaluate: error: {err}", file=sys.stderr)
        sys.exit(1)
    if _PREPARE_INDEX.value:
        what = "built" if report["built"] else "found"
        copy = f", copy {report['copy_bytes']:,} bytes" if report.get("copy_bytes") else ""
        print(f"{what} the index of {report['games']:,} games at {report['index_dir']}{copy}")
        return
    if report is None:
        print(
            "shard done; the report is built by the task that completes the job (or run "
            f"python -m launch.evaluate --report_only {_records_dir()} --output OUT)"
        )
        return
    acc = report["move_accuracy"]
    summary = ", ".join(
        f"{k} {100 * v['overall']['value']:.1f}%"
        for k, v in acc.items()
        if v["overall"]["value"] is not None and v["overall"]["n"]
    )
    print(f"move matching: {summary or 'no position'}")
    print(f"wrote {_OUTPUT.value}/report.json and report.md")


def _records_dir() -> str:
    return _RECORDS.value or f"{_OUTPUT.value}/records"


def _run() -> dict | None:
    """The evaluation itself, from the flags."""
    from allie_jax.host_memory import keep_freed_host_memory

    keep_freed_host_memory()  # before JAX starts: XLA's temporaries stop faulting in each call
    from allie_jax.eval.evaluate import EvalConfig, evaluate, report_from_records

    if not _OUTPUT.value:
        raise ValueError("--output is required")
    if _REPORT_ONLY.value:
        return report_from_records(
            _REPORT_ONLY.value,
            _OUTPUT.value,
            filter=_FILTER.value,
            plots=_PLOTS.value,
            cluster=_CLUSTER.value,
            baseline=_BASELINE.value,
        )
    if _FILTER.value:
        raise ValueError("--filter applies to --report_only (records are always complete)")
    if not _GAMES.value:
        raise ValueError("--games is required (or --report_only RECORDS_DIR)")
    if _DISTRIBUTED.value:
        import jax

        # CPU processes meet through gloo (orbax syncs them on restore); GPU/TPU have their own
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=_COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
        )
    if (_COMPILE_CACHE.value or "").lower() != "none":
        from allie_jax.engine.compile_cache import enable_compilation_cache

        try:
            enable_compilation_cache(_COMPILE_CACHE.value)
        except OSError as exc:  # the run still works, it only compiles again next time
            print(f"warning: {exc}; compiling without a persistent cache", file=sys.stderr)
    sp = _SEARCH_POSITIONS.value.strip()
    if sp != "all" and not sp.isdigit():
        raise ValueError(f"--search_positions={sp!r} must be a count or 'all'")
    config = EvalConfig(
        systems=tuple(_SYSTEMS.value),
        max_games=_MAX_GAMES.value,
        search_positions="all" if sp == "all" else int(sp),
        search_batch_size=_SEARCH_BATCH_SIZE.value,
        random_games=_RANDOM_GAMES.value,
        batch_size=_BATCH_SIZE.value,
        stockfish=_STOCKFISH.value,
        stockfish_positions=_STOCKFISH_POSITIONS.value,
        stockfish_nodes=_STOCKFISH_NODES.value,
        calibration_pgn=_CALIBRATION_PGN.value,
        calibration_systems=tuple(_CALIBRATION_SYSTEMS.value),
        system_options=tuple(_parse_options(_SYSTEM_OPTIONS.value))
        + ((("maia_dir", _MAIA_DIR.value),) if _MAIA_DIR.value else ())
        + ((("pikl_lambda", repr(_PIKL_LAMBDA.value)),) if _PIKL_LAMBDA.value is not None else ()),
        top_k=_TOP_K.value,
        chunk_games=_CHUNK_GAMES.value,
        num_shards=_NUM_SHARDS.value,
        shard_index=_SHARD_INDEX.value,
        index_dir=_INDEX_DIR.value,
        records_dir=_RECORDS.value,
        seed=_SEED.value,
        plots=_PLOTS.value,
        baseline=_BASELINE.value,
        cluster=_CLUSTER.value,
    )
    return evaluate(
        _CHECKPOINT.value, _GAMES.value, _OUTPUT.value, config, prepare_only=_PREPARE_INDEX.value
    )


if __name__ == "__main__":
    app.run(main)
