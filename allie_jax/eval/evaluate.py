"""``evaluate(...)``: every offline result of the paper (SPEC §5) from a checkpoint and a PGN, as a
streamed, sharded, resumable job that writes per-position records, then the report from them.

The job: games are read lazily (``stream.game_stream``), split into shards by game id
(``--num_shards`` / ``--shard_index``, or one per ``jax.distributed`` process), cut into chunks of
``chunk_games``; each chunk is replayed with python-chess, scored by every system
(``allie_jax.eval.systems``) and committed as one Parquet file (``allie_jax.eval.records``). A
restarted shard skips its committed chunks. When every shard is complete, the report
(``allie_jax.eval.summarize``) is computed from the records alone, exactly as
``launch.evaluate --report_only`` does.

What each system's "top move" is (the paper's move matching):
- ``policy``: argmax of the policy restricted to legal moves, conditioned on the game's true Elos
  (the paper's Allie-Policy accuracy uses the model's top-1 move; it samples only when playing).
- ``greedy``: the same argmax with both header Elos set to ``SearchConfig.greedy_elo`` (2500).
  Both come from one causal pass per game over all of its positions.
- ``search`` / ``adaptive`` (and any ``subsample`` system): argmax of the final search policy on
  the protocol's search positions: a seeded subsample of ``search_positions`` move-matching
  positions of the whole input (``stream.choose``; independent of the sharding), or every one of
  them with ``search_positions="all"``, batched across games. The policy's accuracy on the same
  positions is reported next to it for a paired comparison.

The other metrics (legality, think time, resignation, value) describe the Allie model itself and
come from the true-Elo causal pass (``policy``, always scored).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import pathlib
import resource
import tempfile
import time
from collections.abc import Sequence

import numpy as np
from etils import epath

from allie_jax import vocab
from allie_jax.eval import game_index, metrics, records, stream
from allie_jax.eval.positions import (
    GamePositions,
    clock_before_moves,
    context_positions,
    game_positions,
    protocol_mask,
    random_game,
)
from allie_jax.eval.scoring import PositionOutputs
from allie_jax.eval.systems import Positions, Scores, System, SystemContext, make_systems
from allie_jax.game import Game
from allie_jax.pgn import ParseStats

SYSTEMS = ("policy", "greedy", "search", "adaptive")
THINK_TIME_EDGES = (0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 45, 60)
# Settings that do not change a single record byte (so a restart may change them).
_RUN_ONLY = (
    "progress", "plots", "shard_index", "records_dir", "baseline", "cluster", "index_dir",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    systems: tuple[str, ...] = SYSTEMS
    max_games: int = 1000
    search_positions: int | str = 2000  # search subsample size over the input, or "all"
    search_batch_size: int = 64  # fewer, larger batches: fewer search programs to compile
    random_games: int = 100  # random legal games for the out-of-distribution legality check
    batch_size: int = 16  # causal pass: batch_size × 64 tokens (games packed) per device call
    min_ply: int = 10  # move matching skips the first 5 moves (10 plies) ...
    min_clock: float = 30.0  # ... and moves made with less than 30 s on the mover's clock
    resign_value: float = -0.9
    stockfish: str | None = None  # path of a UCI Stockfish for the oracle value comparison
    stockfish_positions: int = 200
    stockfish_nodes: int = 20_000
    calibration_pgn: str | None = None  # games played by systems (the match tool's PGN) ...
    calibration_systems: tuple[str, ...] = ()  # ... and the system names in its headers
    system_options: tuple[tuple[str, str], ...] = ()  # key=value pairs for system factories
    top_k: int = 5  # moves kept per position and system in the records
    chunk_games: int = 256  # games per committed chunk (memory is bounded by one chunk)
    num_shards: int | None = None  # None: one shard per jax.distributed process (1 without)
    shard_index: int | None = None
    records_dir: str | None = None  # default OUTPUT/records
    seed: int = 0
    progress: bool = True
    plots: bool = True
    baseline: str | None = None  # compare every system with this one too (paired, same positions)
    cluster: str = "game"  # the report's bootstrap unit: "game" or "player"
    # where the job's byte-offset index of the games lives (default RECORDS/index), with the
    # seekable copy of a compressed input; "none": every task streams the whole input
    index_dir: str | None = None

    def __post_init__(self) -> None:
        from allie_jax.eval.summarize import CLUSTERS
        from allie_jax.eval.systems import check_names

        check_names(self.systems)
        if self.baseline is not None:
            check_names([self.baseline])
        if self.cluster not in CLUSTERS:
            raise ValueError(f"cluster={self.cluster!r}: expected one of {list(CLUSTERS)}")
        for name in ("max_games", "batch_size", "search_batch_size", "chunk_games", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        for name in ("random_games", "stockfish_positions"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be non-negative")
        sp = self.search_positions
        if not (sp == "all" or (isinstance(sp, int) and sp >= 0)):
            raise ValueError(f"search_positions={sp!r} must be a non-negative count or 'all'")
        if bool(self.calibration_pgn) != bool(self.calibration_systems):
            raise ValueError("calibration needs both calibration_pgn and calibration_systems")
        if self.shard_index is not None and self.num_shards is None:
            raise ValueError("--shard_index needs --num_shards")

    @property
    def search_count(self) -> int | None:
        """Positions in the search subsample (None: every protocol position)."""
        return None if self.search_positions == "all" else int(self.search_positions)


# ---------------------------------------------------------------------------------------------
# The reference reduction of one game's causal pass (used by bench/evaluate.py and the tests)


@dataclasses.dataclass
class GameResult:
    """The per-position quantities of one game that the metrics need (logits are not kept)."""

    pred: np.ndarray  # int32 [K] argmax of the legal policy (−1 where no legal move)
    top_legal: np.ndarray  # bool [K] the top move token is legal
    invalid_mass: np.ndarray  # float64 [K]
    resign: np.ndarray  # bool [K] the resign rule fires
    value_white: np.ndarray  # float32 [K]
    time_s: np.ndarray  # float32 [K]


def reduce_outputs(
    out: PositionOutputs, gp: GamePositions, *, resign_value: float = -0.9
) -> GameResult:
    """Reduce one game's log-probabilities to the per-position facts the metrics use."""
    k = len(out.value_white)
    mask = gp.legal_mask()[:k]
    has_legal = mask.any(axis=1)
    moves = out.log_probs[:, : vocab.NUM_MOVES]
    legal_logp = np.where(mask, moves, -np.inf)
    pred = np.where(has_legal, legal_logp.argmax(axis=1), -1).astype(np.int32)
    top_legal, invalid = metrics.legal_move_stats(out.log_probs, mask)
    value_to_move = np.where(gp.white_to_move[:k], out.value_white, -out.value_white)
    resign = metrics.resign_decisions(
        out.log_probs[:, vocab.TERMINATION],
        legal_logp.max(axis=1),
        value_to_move,
        value_threshold=resign_value,
    )
    return GameResult(pred, top_legal, invalid, resign & has_legal, out.value_white, out.time_s)


# ---------------------------------------------------------------------------------------------
# Subsamples: which positions the expensive systems score


def search_eligible(cfg: EvalConfig, max_len: int):
    """Plies of a game the search systems may score: move-matching positions inside the model's
    context (computed from the game alone, so the whole input can be scanned cheaply)."""

    def plies(game: Game) -> np.ndarray:
        n = len(game.moves)
        ply = np.arange(n)
        mask = protocol_mask(ply, n, clock_before_moves(game), cfg.min_ply, cfg.min_clock)
        return ply[mask & (ply < context_positions(game, max_len))]

    return plies


def value_eligible(max_len: int):
    """Plies of a decided-or-drawn game whose value Stockfish may judge (a move was made there)."""

    def plies(game: Game) -> np.ndarray:
        if game.result is None:
            return np.zeros(0, np.int64)
        return np.arange(min(len(game.moves), context_positions(game, max_len)))

    return plies


# ---------------------------------------------------------------------------------------------
# One chunk


def _progress(total: int | None, desc: str, enabled: bool, unit: str = "game"):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False)


def _replay(games: Sequence[Game]) -> tuple[list[Game], list[GamePositions], int]:
    kept, gps, rejected = [], [], 0
    for g in games:
        try:
            gps.append(game_positions(g))
            kept.append(g)
        except ValueError as e:
            logging.warning("skipping game: %s", e)
            rejected += 1
    return kept, gps, rejected


def _all_positions(games: Sequence[Game], gps: Sequence[GamePositions], seed: int) -> Positions:
    """Every position (ply 0..N, the final board included) of every game."""
    sizes = [gp.num_moves + 1 for gp in gps]
    game = np.concatenate([np.full(s, j) for j, s in enumerate(sizes)]) if sizes else np.zeros(0)
    ply = np.concatenate([np.arange(s) for s in sizes]) if sizes else np.zeros(0)
    return Positions(games, gps, game.astype(np.int64), ply.astype(np.int64), seed=seed)


def _selected_rows(pos: Positions, eligible, selection: stream.Selection) -> np.ndarray:
    rows = []
    offset = 0
    for game, gp in zip(pos.games, pos.gps, strict=True):
        plies = eligible(game)
        plies = plies[selection.picks(game.game_id, plies)]
        rows.append(offset + plies)
        offset += gp.num_moves + 1
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)


def score_chunk(
    games: Sequence[Game],
    systems: Sequence[System],
    plan: dict[str, tuple],
    *,
    chunk_index: int,
    top_k: int,
    progress: bool = False,
):
    """Replay, score and tabulate one chunk; returns the records table and the chunk's facts.

    ``plan[name] = (eligible, selection)`` for each subsample system.
    """
    t = time.perf_counter()
    kept, gps, rejected = _replay(games)
    timings = {"rules_s": time.perf_counter() - t}
    pos = _all_positions(kept, gps, chunk_index)
    scores: dict[str, Scores] = {}
    for system in systems:
        rows = np.arange(len(pos))
        if system.subsample:
            eligible, selection = plan[system.name]
            rows = _selected_rows(pos, eligible, selection)
        asked = Positions(kept, gps, pos.game[rows], pos.ply[rows], seed=chunk_index)
        t = time.perf_counter()
        with _progress(len(asked), system.name, progress and system.subsample, unit="pos") as bar:
            if system.subsample:
                system.on_batch = bar.update
            got = system.score(asked) if len(asked) else Scores.empty(0, top_k)
        key = f"{system.name}_s" if system.subsample else f"{system.name}_pass_s"
        timings[key] = time.perf_counter() - t
        scores[system.name] = got.scatter(rows, len(pos), top_k)
    table = records.chunk_table(pos, scores)
    return table, {"games": len(kept), "games_rejected": rejected, "timings_s": timings}


# ---------------------------------------------------------------------------------------------
# The job


def file_digest(path) -> str:
    """sha256 of a file's bytes (any ``epath``), read in 8 MiB pieces."""
    h = hashlib.sha256()
    with epath.Path(path).open("rb") as f:
        while piece := f.read(8 << 20):
            h.update(piece)
    return "sha256:" + h.hexdigest()


def path_digest(path) -> str:
    """A file's digest, or a directory's: its files' relative names and digests, sorted."""
    p = epath.Path(path)
    if not p.is_dir():
        return file_digest(p)
    h = hashlib.sha256()

    def files(d: epath.Path):  # epath has no recursive glob on object stores: walk it
        for q in sorted(d.iterdir()):
            yield from files(q) if q.is_dir() else [q]

    for f in files(p):
        h.update(f"{f.relative_to(p)}\0{file_digest(f)}\n".encode())
    return "sha256:" + h.hexdigest()


def model_digest(model) -> str | None:
    """sha256 of the model's parameters (names, shapes, dtypes, bytes): the checkpoint's identity
    wherever it was staged, and whatever checkpoint layout held it."""
    if model is None:
        return None
    from flax import nnx

    h = hashlib.sha256()
    state = nnx.state(model, nnx.Param)
    for path, leaf in sorted(
        ((jax_path_str(k), v) for k, v in nnx.to_flat_state(state)), key=lambda kv: kv[0]
    ):
        arr = np.asarray(getattr(leaf, "value", leaf))
        h.update(f"{path}:{arr.dtype}:{arr.shape}\n".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return "sha256:" + h.hexdigest()


def jax_path_str(key) -> str:
    return "/".join(str(k) for k in key)


def _option_identity(value: str) -> str:
    """A --system_options value as the job's identity sees it: a path by its content."""
    try:
        if value and epath.Path(value).exists():
            return path_digest(value)
    except (OSError, ValueError):
        pass
    return value


def _job_settings(cfg: EvalConfig, model, games_digest: str, systems, num_shards):
    """What makes two runs (or two shards) one job: the settings and the *content* of the inputs
    (the games' bytes, the model's parameters, files named in options), never their paths, so
    shards staged at different paths merge."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _RUN_ONLY}
    config["num_shards"] = num_shards
    config["system_options"] = [[k, _option_identity(v)] for k, v in cfg.system_options]
    for key in ("stockfish", "calibration_pgn"):
        if config.get(key):
            config[key] = file_digest(config[key])
    info = {s.name: {"subsample": bool(s.subsample), **dict(s.info)} for s in systems}
    return records.jsonable(
        {
            "checkpoint": model_digest(model),
            "games_file": games_digest,
            "config": config,
            "model": dataclasses.asdict(model.config) if model is not None else None,
            "systems": list(cfg.systems),
            "record_systems": [s.name for s in systems],
            "system_info": info,
        }
    )


def _records_root(cfg: EvalConfig, output_dir) -> epath.Path:
    if cfg.records_dir:
        return epath.Path(cfg.records_dir)
    if output_dir is not None:
        return epath.Path(output_dir) / "records"
    return epath.Path(tempfile.mkdtemp(prefix="allie-eval-records-"))


def _rss_mib() -> int:
    """Resident memory now (Linux; 0 elsewhere): the manifest logs it per chunk."""
    try:
        pages = int(pathlib.Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * resource.getpagesize() // 2**20


def _load(checkpoint) -> tuple[object | None, str | None]:
    """The Allie model and the name the report shows for it (None: a run without Allie)."""
    if checkpoint is None:  # systems that need no Allie model (Maia): no policy pass
        return None, None
    if isinstance(checkpoint, str | pathlib.Path | epath.Path):
        from allie_jax.model.checkpoint import load_model

        return load_model(epath.Path(checkpoint)), str(checkpoint)
    return checkpoint, type(checkpoint).__name__


def subsample_specs(systems: Sequence[System], cfg: EvalConfig, max_len: int) -> list:
    """The subsamples the subsample systems need: the search positions (``search_positions``)
    and Stockfish's (``stockfish_positions``)."""
    from allie_jax.eval.game_index import SubsampleSpec

    wanted = {s.name for s in systems if s.subsample}
    specs = []
    for names, eligible, count, salt in (
        (wanted - {"stockfish"}, search_eligible(cfg, max_len), cfg.search_count, "search"),
        (wanted & {"stockfish"}, value_eligible(max_len), cfg.stockfish_positions, "stockfish"),
    ):
        if names:
            specs.append(SubsampleSpec(tuple(sorted(names)), salt, eligible, count))
    return specs


def plan_subsamples(
    systems: Sequence[System], games_path, cfg: EvalConfig, max_len: int
) -> dict[str, tuple]:
    """``{system name: (eligible, Selection)}`` for every subsample system, each chosen over the
    whole input by one parse-only pass, so every shard takes its share of the same set (the
    streaming path; an indexed job chooses them in the index pass)."""
    plan: dict[str, tuple] = {}
    for spec in subsample_specs(systems, cfg, max_len):
        games = stream.game_stream(games_path, cfg.max_games, ParseStats())
        sel = stream.choose(games, spec.eligible, spec.count, salt=spec.salt, seed=cfg.seed)
        plan.update({n: (spec.eligible, sel) for n in spec.names})
    return plan


def _commit_extras(store: records.ShardStore, systems, model, cfg: EvalConfig) -> dict:
    """Shard 0's once-per-job pieces: the random games of the legality check, the calibration."""
    timings = {}
    extras = store.manifest["extras"]
    if cfg.random_games and model is not None and "random" not in extras:
        t = time.perf_counter()
        rng = np.random.default_rng(cfg.seed)
        rgames = [random_game(rng) for _ in range(cfg.random_games)]
        rgps = [game_positions(g) for g in rgames]
        pos = _all_positions(rgames, rgps, 0)
        table = records.chunk_table(pos, {"policy": systems[0].score(pos)})
        store.commit_extra("random", records.RANDOM, records.table_bytes(table))
        timings["random_s"] = time.perf_counter() - t
    if cfg.calibration_pgn and "calibration" not in extras:
        from allie_jax.eval.calibration import calibration_from_pgn

        table = calibration_from_pgn(str(epath.Path(cfg.calibration_pgn)), cfg.calibration_systems)
        data = json.dumps(records.jsonable(table.to_dict()), sort_keys=True).encode()
        store.commit_extra("calibration", records.CALIBRATION, data)
    return timings


def with_bases(systems: Sequence[str], baseline: str | None, has_model: bool) -> list[str]:
    """The systems to score: those asked, each search system's own base before it (``maia``
    before ``maia+search``, ``board`` before ``board+search``: a comparison needs both on the
    same positions), and the ``baseline``; the Allie policy always comes first when there is an
    Allie model (legality, think time, value and resignation read it)."""
    from allie_jax.eval.summarize import own_base

    out: list[str] = ["policy"] if has_model else []
    for name in [*systems, *([baseline] if baseline else [])]:
        base = own_base(name)
        if "+" in name and base not in out:
            out.append(base)
        if name not in out:
            out.append(name)
    return out


def evaluate(
    checkpoint,
    games_path: str | pathlib.Path,
    output_dir: str | pathlib.Path | None = None,
    config: EvalConfig | None = None,
    *,
    prepare_only: bool = False,
) -> dict | None:
    """Run this process's shard of the evaluation job, then, if every shard is complete and no
    other task is building it, the report from the records (report.json, report.md and plots in
    ``output_dir``, written atomically under a lock).

    ``prepare_only``: only build the job's shared index of the games (with the seekable copy of a
    compressed input), which the first task would otherwise build on first use, and return what
    it holds; a job step before the tasks, so none of them waits on it.

    ``checkpoint`` is a checkpoint directory, a training workdir (``load_model`` picks its best,
    else latest, checkpoint), an already built ``AllieModel``, or None for systems that need no
    Allie model. Returns the report, or None while other shards are missing (run them, or
    ``--report_only`` later) or when another task builds it. ``config`` None: ``EvalConfig()``
    (built here, not at import: checking its system names loads the search package, which starts
    JAX's backend, and ``jax.distributed.initialize`` must come first).
    """
    cfg = config if config is not None else EvalConfig()
    t0 = time.perf_counter()
    if prepare_only:  # the index does not depend on the sharding
        num_shards, shard_index = 1, 0
        if (cfg.index_dir or "").lower() == "none" or not game_index.indexable(games_path):
            raise ValueError("preparing the index needs a games file (not stdin) and an index_dir")
    else:
        num_shards, shard_index = stream.resolve_shard(cfg.num_shards, cfg.shard_index)
    model, checkpoint_name = _load(checkpoint)
    games_file = str(epath.Path(games_path)) if str(games_path) != "-" else "-"
    max_len = vocab.MAX_SEQ_LEN
    if model is not None:
        max_len = min(int(model.config.max_len), vocab.MAX_SEQ_LEN)

    ctx = SystemContext(model=model, config=cfg, options=dict(cfg.system_options))
    if model is None and "policy" in cfg.systems:
        raise ValueError("system 'policy' needs an Allie checkpoint (--checkpoint)")
    names = with_bases(cfg.systems, cfg.baseline, model is not None)
    cfg = dataclasses.replace(cfg, systems=tuple(names))
    systems = make_systems(names, ctx)
    if cfg.stockfish:
        from allie_jax.eval.systems import StockfishSystem

        systems.append(StockfishSystem(cfg.stockfish, nodes=cfg.stockfish_nodes))

    root = _records_root(cfg, output_dir)
    stats = ParseStats()
    t = time.perf_counter()
    bytes_read = None
    if (cfg.index_dir or "").lower() != "none" and game_index.indexable(games_path):
        # one shared pass indexes the input; this task then reads only its own games
        specs = subsample_specs(systems, cfg, max_len)
        where = epath.Path(cfg.index_dir) if cfg.index_dir else root / "index"
        settings = {
            "subsamples": sorted(([list(sp.names), sp.salt, sp.count] for sp in specs), key=str),
            "min_ply": cfg.min_ply,
            "min_clock": cfg.min_clock,
            "max_len": max_len,
        }
        gindex, index_bytes, built = game_index.shared_index(
            games_path, where, cfg.max_games, specs, cfg.seed, settings
        )
        if not gindex.game_ids:
            raise ValueError(
                f"no usable game in {games_path} (parse stats: {gindex.parse_stats()})"
            )
        if prepare_only:
            return {
                "index_dir": str(where),
                "built": built,
                "games": len(gindex.game_ids),
                "games_file": gindex.digest,
                "input_bytes": gindex.meta["bytes"],
                "copy_bytes": gindex.meta.get("copy_bytes"),
            }
        eligible = {n: spec.eligible for spec in specs for n in spec.names}
        plan = {n: (eligible[n], sel) for n, sel in gindex.selections().items()}
        games_digest = gindex.digest
        games, shard_bytes = game_index.shard_games(
            games_path, gindex, num_shards, shard_index, ParseStats()
        )
        parse = gindex.parse_stats()
        timings = {"index_s": time.perf_counter() - t}
        split = (1, 0)  # the games are this shard's already

        def bytes_read():
            out = {"index": index_bytes, "index_built": built, "games": shard_bytes()}
            if gindex.meta.get("copy"):  # a compressed input: the games come from the copy
                out["copy_written"] = gindex.meta["copy_bytes"] if built else 0
            return out
    else:
        games = stream.game_stream(games_path, cfg.max_games, stats)
        first = next(games, None)  # an empty or unreadable input fails here, before any write
        if first is None:
            raise ValueError(f"no usable game in {games_path} (parse stats: {stats.to_dict()})")
        games = itertools.chain([first], games)
        plan = plan_subsamples(systems, games_path, cfg, max_len)
        timings = {"selection_s": time.perf_counter() - t}
        games_digest = file_digest(games_path) if games_file != "-" else "-"
        timings["digest_s"] = time.perf_counter() - t - timings["selection_s"]
        parse = None
        split = (num_shards, shard_index)

    job = _job_settings(cfg, model, games_digest, systems, num_shards)
    store = records.ShardStore(root, shard_index, num_shards, job)
    done = store.open()
    try:
        store.manifest["paths"] = {"checkpoint": checkpoint_name, "games_file": games_file}
        per_shard = -(-cfg.max_games // num_shards)
        with _progress(per_shard, f"shard {shard_index}/{num_shards}", cfg.progress) as bar:
            for index, chunk in stream.chunks(games, *split, cfg.chunk_games):
                span = {"first_game": chunk[0].game_id, "last_game": chunk[-1].game_id}
                if index < done:  # committed by an earlier run: the same games, or input changed
                    store.check_chunk(index, span)
                else:
                    table, info = score_chunk(
                        chunk, systems, plan, chunk_index=index, top_k=cfg.top_k,
                        progress=cfg.progress,
                    )  # fmt: skip
                    store.commit_chunk(index, table, {**span, **info, "rss_mib": _rss_mib()})
                    rate = table.num_rows / max(sum(info["timings_s"].values()), 1e-9)
                    logging.info("chunk %d: %d games, %.0f positions/s", index, len(chunk), rate)
                bar.update(len(chunk))
        if shard_index == 0:
            timings.update(_commit_extras(store, systems, model, cfg))
        if parse is None:
            parse = {"games_read": stats.games_read, "dropped": dict(stats.dropped)}
        if bytes_read is not None:
            store.manifest["input_bytes_read"] = bytes_read()
        store.finish(
            {
                "parse": parse,
                "timings_s": timings,
                # the process's peak so far: the scoring's, bounded by one chunk
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
        )
    finally:
        store.close()
    logging.info("shard %d/%d done in %.1f s", shard_index, num_shards, time.perf_counter() - t0)

    distributed = (
        num_shards > 1 and cfg.num_shards is None and stream.scheduler_shard() is None
    )  # jax.distributed processes: process 0 builds the report once the others are done
    if distributed:
        if shard_index != 0:
            return None
        while not records.shards_complete(root):  # wait on the manifests, not a collective
            time.sleep(2.0)
    if not records.shards_complete(root):
        return None
    return build_once(root, output_dir, cfg)


def build_once(root, output_dir, cfg: EvalConfig) -> dict | None:
    """The report, built by whichever finished task takes the job's report lock first (the
    others return None): one builder, and files that appear whole (written, then renamed)."""
    lock_dir = epath.Path(output_dir) if output_dir is not None else epath.Path(root)
    lock = records.Lock(lock_dir / ".report.lock", "report")
    if not lock.acquire():
        logging.info("the report is being built by %s", lock.holder())
        return None
    try:
        return report_from_records(
            root, output_dir, plots=cfg.plots, cluster=cfg.cluster, baseline=cfg.baseline
        )
    finally:
        lock.release()


def report_from_records(
    records_dir,
    output_dir=None,
    *,
    filter: str | None = None,
    plots: bool = True,
    cluster: str = "game",
    baseline: str | None = None,
    num_resamples: int | None = None,
) -> dict:
    """The report from a records directory alone (every shard complete), or from a parent folder
    of per-task records directories (merged), streamed chunk by chunk (``summarize.stream_report``);
    ``filter`` keeps the matching rows (``records.parse_filter``), ``cluster`` is the bootstrap
    unit, ``baseline`` a system every other is also paired with. Writes report.json / report.md /
    plots when ``output_dir`` is set."""
    from allie_jax.eval.summarize import stream_report

    report = stream_report(
        records_dir,
        filter=filter,
        cluster=cluster,
        baseline=baseline,
        num_resamples=num_resamples,
    )
    if output_dir is not None:
        write_outputs(report, output_dir, plots=plots)
    return report


def _replace_write(path: epath.Path, data: bytes) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    tmp.replace(path)


def write_outputs(report: dict, output_dir, *, plots: bool = True) -> None:
    """report.json, report.md and the plots, each written whole (temporary name, then rename)."""
    from allie_jax.eval.report import to_markdown

    out = epath.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        from allie_jax.eval.plots import write_plots

        with tempfile.TemporaryDirectory() as tmp:  # matplotlib writes local files
            names = write_plots(report, pathlib.Path(tmp))
            for name in names:
                _replace_write(out / name, (pathlib.Path(tmp) / name).read_bytes())
        report.setdefault("meta", {})["plots"] = names
    text = json.dumps(records.jsonable(report, nan_as_none=True), indent=2, allow_nan=False) + "\n"
    _replace_write(out / "report.json", text.encode())
    _replace_write(out / "report.md", to_markdown(report).encode())
