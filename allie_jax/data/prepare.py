"""PGN files in, ArrayRecord shards and stats.json out (``python -m launch.prepare_data``).

The reading process decompresses and splits the stream into raw games (cheap); worker
processes parse, filter and serialize them in chunks. ``imap`` keeps chunk order, so the shards
are byte-identical whatever the number of workers. Every game read ends up either written or
counted in ``dropped`` under one reason: ``games_read == games_written + sum(dropped)``.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import multiprocessing
import os
import pathlib
import time
from collections.abc import Iterator, Sequence

from allie_jax import pgn
from allie_jax.data import records, shards
from allie_jax.game import Game, encode_game

# Lichess speed classes use the estimated duration base + 40 × increment; blitz is [179, 479) s
# (lila's Speed: UltraBullet < 29 s, Bullet < 179 s, Blitz < 479 s, Rapid < 1499 s).
BLITZ_RANGE = (179, 479)
EVENTS = ("blitz", "all")
CHUNK_GAMES = 256


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

    def __post_init__(self) -> None:
        if self.events not in EVENTS:
            raise ValueError(f"events must be one of {EVENTS}, got {self.events!r}")
        if not 0 <= self.val_frac + self.test_frac <= 1:
            raise ValueError("val_frac + test_frac must lie in [0, 1]")


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


@dataclasses.dataclass
class ChunkResult:
    written: list[tuple[str, bytes, int, int | None]]  # split, record, tokens, Elo bin
    stats: pgn.ParseStats


def process_chunk(args) -> ChunkResult:
    raw_games, config, balance = args
    stats = pgn.ParseStats()
    written = []
    for header_lines, move_lines, complete in raw_games:
        raw = pgn.RawGame()
        raw.header_lines, raw.move_lines, raw.complete = header_lines, move_lines, complete
        stats.games_read += 1
        try:
            parsed = pgn.parse_game(raw, require_clocks=config.require_clocks)
        except pgn.GameRejected as e:
            stats.drop(e.reason)
            continue
        game = parsed.game
        reason = header_filter(parsed.headers, config)
        if reason is None and len(game.moves) < config.min_plies:
            reason = "too_short"
        if reason is None and balance is not None:
            if not balance.keep(game.game_id, game.white_elo, game.black_elo):
                reason = "elo_balance"
        if reason is not None:
            stats.drop(reason)
            continue
        stats.games_ok += 1
        split = shards.assign_split(
            game.game_id, seed=config.seed, val_frac=config.val_frac, test_frac=config.test_frac
        )
        written.append(
            (
                split,
                records.serialize_game(game),
                _num_tokens(game),
                shards.elo_bin(game.white_elo, game.black_elo),
            )
        )
    return ChunkResult(written, stats)


def _num_tokens(game: Game) -> int:
    return len(encode_game(game).tokens)


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Files matching the patterns, in a stable order; "-" is stdin. Errors name the pattern."""
    paths: list[str] = []
    for pattern in patterns:
        if pattern == "-":
            paths.append(pattern)
            continue
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise FileNotFoundError(f"no input file matches {pattern!r}")
        paths.extend(matches)
    return paths


def _raw_chunks(paths: Sequence[str]) -> Iterator[list]:
    chunk = []
    for path in paths:
        for raw in pgn.split_games(pgn._lines(path)):
            chunk.append((raw.header_lines, raw.move_lines, raw.complete))
            if len(chunk) >= CHUNK_GAMES:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def elo_histogram_pass(paths: Sequence[str], config: PrepareConfig) -> dict[int, int]:
    """Mean-Elo bin counts of the games that pass the header filters (headers only: cheap)."""
    counts: collections.Counter = collections.Counter()
    for path in paths:
        for raw in pgn.split_games(pgn._lines(path)):
            headers = {}
            for line in raw.header_lines:
                m = pgn.HEADER_RE.match(line.strip())
                if m is not None:
                    headers[m.group(1)] = m.group(2)
            if header_filter(headers, config) is not None:
                continue
            try:
                w = pgn._parse_elo(headers.get("WhiteElo"))
                b = pgn._parse_elo(headers.get("BlackElo"))
            except pgn.GameRejected:
                continue
            if (bin_ := shards.elo_bin(w, b)) is not None:
                counts[bin_] += 1
    return dict(counts)


def prepare(
    inputs: Sequence[str],
    output: str | os.PathLike,
    config: PrepareConfig = PrepareConfig(),
    *,
    workers: int = 1,
    progress: bool | None = None,
) -> dict:
    """Parse, filter, split and write; returns the stats also written to ``output/stats.json``.

    ``progress=None`` shows a bar only on a terminal.
    """
    from tqdm import tqdm

    start = time.time()
    paths = expand_inputs(inputs)
    out = pathlib.Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for split in shards.SPLITS:
        for old in (out / split).glob("*.array_record"):
            old.unlink()  # a re-run must not leave shards of an earlier run behind

    balance = None
    if config.elo_balance:
        if config.elo_balance_file:
            balance = shards.EloBalance.from_file(config.elo_balance_file, seed=config.seed)
        else:
            if "-" in paths:
                raise ValueError("Elo balancing from stdin needs --elo_balance_file")
            counts = elo_histogram_pass(paths, config)
            balance = shards.EloBalance.from_counts(counts, seed=config.seed)

    stats = pgn.ParseStats()
    per_split = {s: {"games": 0, "tokens": 0} for s in shards.SPLITS}
    elo_hist: collections.Counter = collections.Counter()
    writers = {
        s: shards.ShardWriter(out, s, records_per_shard=config.records_per_shard)
        for s in shards.SPLITS
    }
    jobs = ((chunk, config, balance) for chunk in _raw_chunks(paths))
    bar = tqdm(unit="game", disable=None if progress is None else not progress, smoothing=0.1)
    pool = multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else None
    try:
        results = pool.imap(process_chunk, jobs, chunksize=1) if pool else map(process_chunk, jobs)
        for result in results:
            stats.merge(result.stats)
            for split, record, n_tokens, bin_ in result.written:
                writers[split].write(record)
                per_split[split]["games"] += 1
                per_split[split]["tokens"] += n_tokens
                elo_hist["none" if bin_ is None else str(bin_)] += 1
            bar.update(result.stats.games_read)
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
        for w in writers.values():
            w.close()

    games_written = sum(v["games"] for v in per_split.values())
    dropped = dict(sorted(stats.dropped.items()))
    assert stats.games_read == games_written + sum(dropped.values()), "a game went missing"
    result = {
        "record_format": records.FORMAT_VERSION,
        "inputs": paths,
        "config": dataclasses.asdict(config),
        "games_read": stats.games_read,
        "games_written": games_written,
        "dropped": dropped,
        "tokens": sum(v["tokens"] for v in per_split.values()),
        "per_split": per_split,
        "elo_histogram": dict(sorted(elo_hist.items(), key=lambda kv: (kv[0] == "none", kv[0]))),
        "elo_balance": balance.to_json() if balance is not None else None,
        "seconds": round(time.time() - start, 2),
    }
    (out / "stats.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
