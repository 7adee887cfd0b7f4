"""PGN (or released flat uint32) files in, ArrayRecord shards and stats.json out.

``python -m launch.prepare_data`` calls ``prepare``. The work is split so that nothing serial
caps the run:

- the main process only decompresses each input and cuts the byte stream into blocks of whole
  games (``pgn_blocks``: cuts at a header line that follows a blank line, a point where the
  sequential splitter starts a new game too); a released ``.bin`` file is cut at ``<EOS>`` words
  from a windowed memory map (``flat_blocks``);
- ``workers`` processes each take every N-th block, split it into games, parse, filter,
  serialize and write their own shards (``{split}-wKKofNN-00000.array_record``; one worker
  writes ``{split}-00000.array_record``). Block i always goes to worker i mod N, so the output
  is deterministic for a given N, and every split holds the same set of records for any N
  (a game's split is a hash of its id, never of file order).

Every game read ends up either written or counted in ``dropped`` under one reason:
``games_read == games_written + sum(dropped)``. A compressed input cut short is read up to the
cut, reported (warning, ``stats["inputs_truncated"]``) and its cut game counted as
``truncated``; an input with no readable game, a missing file or junk raises ``PrepareError`` (or
``PGNError`` / ``FileNotFoundError``) naming it. Output is all or nothing: everything is written
into a staging folder and published at the end (``paths.staged_output``), ``stats.json`` last.

Small inputs: the validation and test splits each get at least
``min(min_split_games, 5% of the games written)`` games when their fraction is non-zero; the
missing ones are the train games with the lowest split hash (as if the fraction had been larger
for this run), so the choice is still a function of the game set alone.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
import logging
import multiprocessing
import os
import queue
import re
import time
import traceback
from collections.abc import Iterator, Sequence

import numpy as np

from allie_jax import pgn
from allie_jax.data import flat_uint32, paths, records, shards
from allie_jax.game import Game, encode_game

log = logging.getLogger(__name__)

# Lichess speed classes use the estimated duration base + 40 × increment; blitz is [179, 479) s
# (lila's Speed: UltraBullet < 29 s, Bullet < 179 s, Blitz < 479 s, Rapid < 1499 s).
BLITZ_RANGE = (179, 479)
EVENTS = ("blitz", "all")
INPUT_FORMATS = ("pgn", "released_bin")
CHUNK_GAMES = 256  # raw games per Beam element (tfds_builder)
BLOCK_BYTES = 2 << 20  # decompressed PGN bytes per block handed to a worker
BLOCK_WORDS = 1 << 20  # flat words per block
MIN_SPLIT_SHARE = 0.05  # a minimum-count split never takes more than this share of the games
STATS_FILE = "stats.json"


class PrepareError(ValueError):
    """An input or setting that makes the whole run unusable (the message names it)."""


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    min_plies: int = 9  # the released filter keeps games with > 8 plies
    events: str = "blitz"  # "blitz" (rated blitz, by time control) or "all"
    require_clocks: bool = False
    drop_bots: bool = True
    elo_balance: bool = False
    elo_balance_file: str | None = None  # keep-probabilities or a histogram; else a header pass
    val_frac: float = 1e-4
    test_frac: float = 2e-4
    seed: int = 0
    records_per_shard: int = 100_000
    min_split_games: int = 100  # val / test get at least min(this, 5% of the games) each
    input_format: str = "pgn"  # "pgn" or "released_bin" (flat uint32 files)

    def __post_init__(self) -> None:
        if self.events not in EVENTS:
            raise ValueError(f"events must be one of {EVENTS}, got {self.events!r}")
        if not 0 <= self.val_frac + self.test_frac <= 1 or min(self.val_frac, self.test_frac) < 0:
            raise ValueError("val_frac and test_frac must be >= 0 with a sum in [0, 1]")
        if self.min_split_games < 0:
            raise ValueError(f"min_split_games must be >= 0, got {self.min_split_games}")
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(
                f"input_format must be one of {INPUT_FORMATS}, got {self.input_format!r}"
            )


def estimated_duration(time_control: str | None) -> int | None:
    base_inc = pgn.parse_time_control(time_control) if time_control else None
    return None if base_inc is None else base_inc[0] + 40 * base_inc[1]


def header_filter(headers: dict[str, str], config: PrepareConfig) -> str | None:
    """Drop reason decided from the headers alone (shared by the histogram pass and parsing)."""
    if config.drop_bots and "BOT" in (headers.get("WhiteTitle"), headers.get("BlackTitle")):
        return "bot"
    if config.events == "blitz":
        duration = estimated_duration(headers.get("TimeControl"))
        if duration is None or not BLITZ_RANGE[0] <= duration < BLITZ_RANGE[1]:
            return "not_blitz"
        if headers.get("Event", "").lower().startswith("casual"):
            return "not_rated"
    return None


def _game_filter(game: Game, headers: dict[str, str], config, balance) -> str | None:
    reason = header_filter(headers, config)
    if reason is None and len(game.moves) < config.min_plies:
        reason = "too_short"
    if reason is None and balance is not None:
        if not balance.keep(game.game_id, game.white_elo, game.black_elo):
            reason = "elo_balance"
    return reason


def keep_raw_game(raw: pgn.RawGame, config, balance, stats: pgn.ParseStats):
    """(split, record, tokens, Elo bin, split hash) of a kept game, else None (counted).

    The per-game rule shared by ``prepare`` and the TFDS builder: parse, filter, split."""
    stats.games_read += 1
    try:
        parsed = pgn.parse_game(raw, require_clocks=config.require_clocks)
    except pgn.GameRejected as e:
        stats.drop(e.reason)
        return None
    stats.games_ok += 1
    return _keep_game(parsed.game, parsed.headers, config, balance, stats)


def _keep_game(game: Game, headers, config, balance, stats: pgn.ParseStats):
    reason = _game_filter(game, headers, config, balance)
    if reason is not None:
        stats.drop(reason)
        return None
    split = shards.assign_split(
        game.game_id, seed=config.seed, val_frac=config.val_frac, test_frac=config.test_frac
    )
    return (
        split,
        records.serialize_game(game),
        _num_tokens(game),
        shards.elo_bin(game.white_elo, game.black_elo),
        shards.split_hash(game.game_id, seed=config.seed),
    )


def _num_tokens(game: Game) -> int:
    return len(encode_game(game).tokens)


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Files matching the patterns (local or remote), in a stable order; "-" is stdin."""
    return paths.expand_inputs(patterns)


# ---------------------------------------------------------------------------------------------
# Reading: inputs cut into blocks of whole games (main process)


@dataclasses.dataclass
class Block:
    """Whole games of one input: PGN bytes or flat words. ``cut_tail``: the input was cut short
    inside this block's last game (count it as truncated)."""

    file_index: int
    kind: str  # "pgn" or "flat"
    payload: bytes | np.ndarray
    cut_tail: bool = False


_CUT_RE = re.compile(rb"\n\r?\n(?=\[)")


def _cut_point(buf: bytes | bytearray, start: int) -> int:
    """Offset of the first header line after a blank line at or after ``start`` whose line is
    complete in ``buf`` and well formed (-1: none yet). The sequential splitter starts a new
    game at such a line whatever came before, so cutting there changes no game."""
    for m in _CUT_RE.finditer(buf, max(0, start - 3)):
        pos = m.end()
        if pos < start:
            continue
        eol = buf.find(b"\n", pos)
        if eol < 0:
            return -1
        line = bytes(buf[pos:eol]).decode("utf-8", "replace").strip()
        if pgn.HEADER_RE.match(line):
            return pos
    return -1


def pgn_blocks(
    path: str, file_index: int, status: pgn.InputStatus, block_bytes: int | None = None
) -> Iterator[Block]:
    """Blocks of whole games of one PGN input (decompressed; local, remote or "-")."""
    block_bytes = block_bytes or BLOCK_BYTES
    if path == "-":
        import sys

        stream = sys.stdin.buffer
        source: Iterator[bytes] = iter(lambda: stream.read(1 << 20), b"")
    else:
        source = pgn.iter_bytes(path, status)
    buf = bytearray()
    for data in source:
        buf += data
        while len(buf) >= block_bytes and (cut := _cut_point(buf, block_bytes)) > 0:
            yield Block(file_index, "pgn", bytes(buf[:cut]))
            del buf[:cut]
    if buf:
        yield Block(file_index, "pgn", bytes(buf), cut_tail=status.truncated)
    elif status.truncated:
        yield Block(file_index, "pgn", b"", cut_tail=True)


def flat_blocks(
    path: str, file_index: int, status: pgn.InputStatus, block_words: int | None = None
) -> Iterator[Block]:
    """Blocks of whole games of a released flat file (windowed memory map); a file cut inside a
    game yields its complete games, then a block whose ``cut_tail`` marks the cut one."""
    block_words = block_words or BLOCK_WORDS
    if path == "-":
        raise PrepareError("--input_format released_bin reads files, not stdin ('-')")
    parts: list[np.ndarray] = []
    n = 0
    try:
        for _, words in flat_uint32.iter_flat_words(path, chunk_words=block_words):
            parts.append(words)
            n += len(words)
            if n >= block_words:
                yield Block(file_index, "flat", np.concatenate(parts))
                parts, n = [], 0
    except flat_uint32.FlatFormatError as e:
        if "truncated" not in str(e):
            raise PrepareError(str(e)) from e
        status.truncated = True
        log.warning("%s (the complete games before the cut are kept)", e)
    if parts or status.truncated:
        payload = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
        yield Block(file_index, "flat", payload, cut_tail=status.truncated)


def _input_blocks(files: Sequence[str], config: PrepareConfig, statuses) -> Iterator[Block]:
    reader = flat_blocks if config.input_format == "released_bin" else pgn_blocks
    for i, path in enumerate(files):
        yield from reader(path, i, statuses[i])


# ---------------------------------------------------------------------------------------------
# Workers: blocks → games → records → shards


def _block_games(block: Block, config, balance, stats: pgn.ParseStats):
    """Kept games of a block as (split, record, tokens, bin, hash); counts the rest."""
    if block.kind == "flat":
        yield from _flat_block_games(block, config, balance, stats)
        return
    text = pgn.text_from_bytes([block.payload])
    previous = None
    for raw in pgn.split_games(iter(text.readline, "")):
        if previous is not None:
            kept = keep_raw_game(previous, config, balance, stats)
            if kept is not None:
                yield kept
        previous = raw
    if block.cut_tail:
        stats.games_read += 1
        stats.drop("truncated")
    elif previous is not None:
        kept = keep_raw_game(previous, config, balance, stats)
        if kept is not None:
            yield kept


def _flat_block_games(block: Block, config, balance, stats: pgn.ParseStats):
    words = np.asarray(block.payload, np.uint32)
    tokens = words & np.uint32(flat_uint32.TOKEN_MASK)
    ends = np.flatnonzero(tokens == flat_uint32.vocab.EOS).tolist()
    start = 0
    for end in ends:
        game_words = words[start : end + 1]
        start = end + 1
        stats.games_read += 1
        try:
            (game,) = flat_uint32.words_to_games(game_words)
        except flat_uint32.FlatFormatError:
            stats.drop("bad_flat_game")
            continue
        stats.games_ok += 1
        game.game_id = flat_uint32.flat_game_id(game_words)
        headers = {"TimeControl": game.time_control or "-"}
        kept = _keep_game(game, headers, config, balance, stats)
        if kept is not None:
            yield kept
    if block.cut_tail:
        stats.games_read += 1
        stats.drop("truncated")


@dataclasses.dataclass
class WorkerResult:
    """What one worker wrote, for the final stats (small: no records except the candidates)."""

    per_split: dict
    elo_hist: collections.Counter
    shard_paths: dict  # split -> [file names]
    candidates: list  # the lowest-hash train games: (hash, record, tokens, bin)


class _BlockWriter:
    """One worker's state: its shard writers, counts, and the lowest-hash train games."""

    def __init__(self, stage: str, config: PrepareConfig, balance, tag: str, keep: int):
        self.config, self.balance, self.keep = config, balance, keep
        self.writers = {
            s: shards.ShardWriter(
                stage, s, records_per_shard=config.records_per_shard, name=f"{s}{tag}"
            )
            for s in shards.SPLITS
        }
        self.per_split = {s: {"games": 0, "tokens": 0} for s in shards.SPLITS}
        self.elo_hist: collections.Counter = collections.Counter()
        self.heap: list = []  # max-heap on the hash (negated) of at most ``keep`` train games

    def process(self, block: Block) -> tuple[pgn.ParseStats, int]:
        stats = pgn.ParseStats()
        for split, record, n_tokens, bin_, u in _block_games(
            block, self.config, self.balance, stats
        ):
            self.writers[split].write(record)
            self.per_split[split]["games"] += 1
            self.per_split[split]["tokens"] += n_tokens
            self.elo_hist["none" if bin_ is None else str(bin_)] += 1
            if split == "train" and self.keep:
                item = (-u, record, n_tokens, bin_)
                if len(self.heap) < self.keep:
                    heapq.heappush(self.heap, item)
                elif item > self.heap[0]:
                    heapq.heapreplace(self.heap, item)
        return stats, block.file_index

    def finish(self) -> WorkerResult:
        for w in self.writers.values():
            w.close()
        return WorkerResult(
            self.per_split,
            self.elo_hist,
            {s: [p.name for p in w.paths] for s, w in self.writers.items()},
            [(-neg, rec, n, b) for neg, rec, n, b in self.heap],
        )


def _worker_main(index: int, count: int, stage, config, balance, keep, inbox, outbox) -> None:
    try:
        writer = _BlockWriter(stage, config, balance, f"-w{index:02d}of{count:02d}", keep)
        while (block := inbox.get()) is not None:
            outbox.put(("block", writer.process(block)))
        outbox.put(("done", writer.finish()))
    except BaseException:  # the main process reports it and stops the run
        outbox.put(("error", f"worker {index}: {traceback.format_exc()}"))


def _run_blocks(blocks: Iterator[Block], workers: int, stage, config, balance, keep, on_block):
    """Feed blocks to the workers (block i to worker i mod N); returns their results."""
    if workers <= 1:
        writer = _BlockWriter(stage, config, balance, "", keep)
        for block in blocks:
            on_block(*writer.process(block))
        return [writer.finish()]
    ctx = multiprocessing.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue(maxsize=2) for _ in range(workers)]
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(i, workers, stage, config, balance, keep, inboxes[i], outbox),
            daemon=True,
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    results = []

    def drain(block_wait: float | None) -> None:
        while True:
            try:
                kind, payload = (
                    outbox.get(timeout=block_wait) if block_wait else outbox.get_nowait()
                )
            except queue.Empty:
                return
            if kind == "error":
                raise RuntimeError(payload)
            if kind == "block":
                on_block(*payload)
            else:
                results.append(payload)
            block_wait = None

    def check_alive() -> None:
        dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead:
            drain(1.0)  # an error message a worker sent before dying says more
            raise RuntimeError(f"prepare worker {dead[0]} died (exit {procs[dead[0]].exitcode})")

    try:
        for i, block in enumerate(blocks):
            inbox = inboxes[i % workers]
            while True:
                try:
                    inbox.put(block, timeout=0.5)
                    break
                except queue.Full:
                    drain(None)
                    check_alive()
            drain(None)
        for inbox in inboxes:
            inbox.put(None)
        idle_since = time.time()
        while len(results) < workers:
            before = len(results)
            drain(1.0)
            check_alive()
            if len(results) > before:
                idle_since = time.time()
            elif all(p.exitcode == 0 for p in procs) and time.time() - idle_since > 60:
                raise RuntimeError("prepare workers exited without their results")
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results


# ---------------------------------------------------------------------------------------------
# Elo histogram (headers only) for balancing


def _header_bins(block: Block, config: PrepareConfig) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    if block.kind == "flat":
        for game in _flat_games_only(block):
            if header_filter({"TimeControl": game.time_control or "-"}, config) is None:
                if (b := shards.elo_bin(game.white_elo, game.black_elo)) is not None:
                    counts[b] += 1
        return counts
    text = pgn.text_from_bytes([block.payload])
    for raw in pgn.split_games(iter(text.readline, "")):
        if (b := header_elo_bin(raw.header_lines, config)) is not None:
            counts[b] += 1
    return counts


def _flat_games_only(block: Block) -> Iterator[Game]:
    words = np.asarray(block.payload, np.uint32)
    try:
        yield from flat_uint32.words_to_games(words)
    except flat_uint32.FlatFormatError:
        return


def header_elo_bin(header_lines: Sequence[str], config: PrepareConfig) -> int | None:
    """Mean-Elo bin of a game that passes the header filters, from its header lines alone."""
    headers = {}
    for line in header_lines:
        m = pgn.HEADER_RE.match(line.strip())
        if m is not None:
            headers[m.group(1)] = m.group(2)
    if header_filter(headers, config) is not None:
        return None
    try:
        w = pgn.parse_elo(headers.get("WhiteElo"))
        b = pgn.parse_elo(headers.get("BlackElo"))
    except pgn.GameRejected:
        return None
    return shards.elo_bin(w, b)


def _hist_job(args) -> collections.Counter:
    block, config = args
    return _header_bins(block, config)


def elo_histogram_pass(
    paths_: Sequence[str], config: PrepareConfig, *, workers: int = 1
) -> dict[int, int]:
    """Mean-Elo bin counts of the games that pass the header filters (headers only), with the
    blocks spread over ``workers`` processes."""
    statuses = [pgn.InputStatus(p) for p in paths_]
    jobs = ((block, config) for block in _input_blocks(paths_, config, statuses))
    counts: collections.Counter = collections.Counter()
    if workers <= 1:
        for job in jobs:
            counts.update(_hist_job(job))
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for c in pool.imap(_hist_job, jobs):
                counts.update(c)
    return dict(counts)


# ---------------------------------------------------------------------------------------------
# The run


def split_minimums(games_written: int, config: PrepareConfig) -> dict[str, int]:
    """The least number of games each of val and test must hold for this many games."""
    cap = min(config.min_split_games, int(MIN_SPLIT_SHARE * games_written))
    return {
        "test": cap if config.test_frac > 0 else 0,
        "val": cap if config.val_frac > 0 else 0,
    }


def _top_up_small_splits(stage: str, results, per_split, config) -> dict[str, int]:
    """Move the lowest-hash train games into val / test until each has its minimum."""
    games_written = sum(v["games"] for v in per_split.values())
    want = split_minimums(games_written, config)
    need = {s: max(0, want[s] - per_split[s]["games"]) for s in ("test", "val")}
    if not any(need.values()):
        return {}
    candidates = sorted(c for r in results for c in r.candidates)  # by split hash
    moved: dict[str, list] = {"test": [], "val": []}
    i = 0
    for split in ("test", "val"):  # test sits below val on the hash line, as in assign_split
        take = candidates[i : i + need[split]]
        i += len(take)
        moved[split] = take
    gone = collections.Counter(rec for items in moved.values() for _, rec, _, _ in items)
    for name in [n for r in results for n in r.shard_paths["train"]]:
        path = os.path.join(stage, "train", name)
        recs = shards.read_records(path)
        if not any(r in gone for r in recs):
            continue
        kept = []
        for r in recs:
            if gone[r] > 0:
                gone[r] -= 1
            else:
                kept.append(r)
        os.unlink(path)
        if kept:
            shards.write_shard(path, kept)
    for split, items in moved.items():
        if items:
            with shards.ShardWriter(stage, split, name=f"{split}-min") as w:
                for _, rec, _, _ in items:
                    w.write(rec)
        for _, _, n_tokens, _ in items:
            per_split[split]["games"] += 1
            per_split[split]["tokens"] += n_tokens
            per_split["train"]["games"] -= 1
            per_split["train"]["tokens"] -= n_tokens
    return {s: len(v) for s, v in moved.items() if v}


def prepare(
    inputs: Sequence[str],
    output: str | os.PathLike,
    config: PrepareConfig = PrepareConfig(),
    *,
    workers: int = 1,
    progress: bool | None = None,
) -> dict:
    """Parse, filter, split and write; returns the stats also written to ``output/stats.json``.

    ``inputs`` and ``output`` may be local or remote (etils.epath). ``progress=None`` shows a
    bar only on a terminal. Raises ``PrepareError`` / ``pgn.PGNError`` / ``FileNotFoundError``
    naming the input when the run cannot be done; then ``output`` is left as it was.
    """
    from tqdm import tqdm

    start = time.time()
    files = expand_inputs(inputs)
    balance = None
    if config.elo_balance:
        if config.elo_balance_file:
            balance = shards.EloBalance.from_file(config.elo_balance_file, seed=config.seed)
        else:
            if "-" in files:
                raise PrepareError("Elo balancing from stdin needs --elo_balance_file")
            counts = elo_histogram_pass(files, config, workers=workers)
            balance = shards.EloBalance.from_counts(counts, seed=config.seed)

    stats = pgn.ParseStats()
    ok_per_file = [0] * len(files)
    statuses = [pgn.InputStatus(p) for p in files]
    bar = tqdm(unit="game", disable=None if progress is None else not progress, smoothing=0.1)

    def on_block(block_stats: pgn.ParseStats, file_index: int) -> None:
        stats.merge(block_stats)
        ok_per_file[file_index] += block_stats.games_ok
        bar.update(block_stats.games_read)

    keep = 2 * config.min_split_games if config.val_frac + config.test_frac > 0 else 0
    entries = [*shards.SPLITS, STATS_FILE]
    with paths.staged_output(output, entries) as stage:
        try:
            blocks = _input_blocks(files, config, statuses)
            results = _run_blocks(blocks, workers, stage, config, balance, keep, on_block)
        finally:
            bar.close()
        unreadable = [f for f, n in zip(files, ok_per_file, strict=True) if n == 0]
        if unreadable:
            raise PrepareError(
                f"no readable game in {unreadable[0]!r}"
                + (f" (and {len(unreadable) - 1} more inputs)" if len(unreadable) > 1 else "")
                + (
                    ": not a released flat uint32 file?"
                    if config.input_format == "released_bin"
                    else ": not a PGN file of finished games?"
                )
                + " Nothing was written."
            )
        per_split = {s: {"games": 0, "tokens": 0} for s in shards.SPLITS}
        elo_hist: collections.Counter = collections.Counter()
        for r in results:
            for s in shards.SPLITS:
                per_split[s]["games"] += r.per_split[s]["games"]
                per_split[s]["tokens"] += r.per_split[s]["tokens"]
            elo_hist.update(r.elo_hist)
        moved = _top_up_small_splits(stage, results, per_split, config)

        games_written = sum(v["games"] for v in per_split.values())
        dropped = dict(sorted(stats.dropped.items()))
        if stats.games_read != games_written + sum(dropped.values()):
            raise RuntimeError("a game went missing")  # a bug, not a user error
        truncated = [s.name for s in statuses if s.truncated]
        result = {
            "record_format": records.FORMAT_VERSION,
            "inputs": files,
            "config": dataclasses.asdict(config),
            "games_read": stats.games_read,
            "games_written": games_written,
            "dropped": dropped,
            "tokens": sum(v["tokens"] for v in per_split.values()),
            "per_split": per_split,
            "elo_histogram": dict(
                sorted(elo_hist.items(), key=lambda kv: (kv[0] == "none", kv[0]))
            ),
            "elo_balance": balance.to_json() if balance is not None else None,
            "split_minimums_moved": moved,
            "inputs_truncated": truncated,
            "workers": workers,
            "seconds": round(time.time() - start, 2),
        }
        with open(os.path.join(stage, STATS_FILE), "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    return result
