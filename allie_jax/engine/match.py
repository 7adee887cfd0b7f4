"""Engine-vs-engine matches with simulated clocks, Allie's moves batched across games.

Several games run at once; at every step the games where an Allie configuration is to move are
answered by ONE ``Allie.play`` call per (checkpoint, preset), and the games where a UCI engine is
to move run in parallel threads (one engine process per game slot). Clocks are simulated, and
both sides are charged by the same measure, the wall time that would pass: a UCI engine's is
the time it took; Allie's is the larger of its batched call's time and its human-paced think
time (the prediction bounded by the clock as the UCI engine's HumanPacing is; with
``raw_think_times`` the raw prediction). Allie's search gets the clock's deadline as in the UCI
engine. Every game has an id, so Allie's search keeps each game's KV cache between its moves.
With a preset whose budgets vary per game (``adaptive``, ``gumbel-adaptive``), Allie runs the UCI
engine's closed set of shapes (``Allie.fix_shapes``): with shapes that follow each batch, a
game's growing prefix compiled the row-bucketed search again at every cache width (8, 16, 32,
64 over 40 plies) and tree size, and each compile took longer than the moves. Equal-budget
presets keep shapes that follow the batch (their compiles are cheap, and their tree of
next_pow2(budget) + 1 nodes runs about twice as fast as the fixed max_sims + 1).
Each searched Allie move's comment carries ``[%lambda L]``, the effective KL weight of its
policy (``Decision.effective_lambda``). Games end by the rules (python-chess, draws claimed at once), by Allie's resignation, on time,
or at ``max_plies``.

Player specs are parsed by a small registry (``register_player_kind``): ``allie:`` and ``uci:``
are built in; another model family registers its prefix with a parser and a loader of an object
with Allie's batched ``play`` (e.g. ``maia:DIR[:preset[:elo]]``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import math
import pathlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import chess
import chess.engine
import chess.pgn
import jax

from allie_jax import vocab
from allie_jax.engine.api import PRESETS, Allie
from allie_jax.engine.pacing import Clock, paced_time, time_budget
from allie_jax.game import Game

_COMPILE_S = [0.0]  # seconds JAX spent tracing and compiling in this process so far


def _count_compile(event: str, seconds: float, **_: Any) -> None:
    if event.startswith("/jax/core/compile/"):
        _COMPILE_S[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_compile)


@dataclasses.dataclass(frozen=True)
class PlayerSpec:
    """One side of a match: an Allie checkpoint with a preset, or a UCI engine command."""

    kind: str  # "allie" | "uci" | a registered kind (``register_player_kind``)
    name: str  # the PGN name (and the calibration table's system name)
    elo: int | None  # the rating written to the PGN; for Allie also its own rating token
    checkpoint: str = ""
    preset: str = ""
    command: str = ""
    options: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class PlayerKind:
    """How a spec prefix becomes a player: ``parse(spec)`` and, for batched players (played in
    one ``play(games, preset, rng)`` call per step, like ``Allie``), ``load(checkpoint)``."""

    parse: Callable[[str], PlayerSpec]
    load: Callable[[str], Any] | None = None  # None: a UCI engine process per game slot


PLAYER_KINDS: dict[str, PlayerKind] = {}


def register_player_kind(
    kind: str, parse: Callable[[str], PlayerSpec], load: Callable[[str], Any] | None = None
) -> None:
    """Make ``KIND:...`` specs parse with ``parse(spec)`` (returning ``PlayerSpec(kind=KIND)``)
    and load their checkpoint with ``load(checkpoint)`` (an object with Allie's batched
    ``play``; None for UCI-like players)."""
    PLAYER_KINDS[kind] = PlayerKind(parse, load)


def parse_spec(spec: str) -> PlayerSpec:
    """``allie:CKPT:PRESET:ELO``, ``uci:COMMAND[:Opt=val,Opt=val]``, or a registered kind.

    ELO may be ``auto`` (Allie plays at its opponent's rating, the paper's Allie-Policy setting).
    UCI options are sent with ``configure``; the lowercase keys ``name`` and ``elo`` are metadata
    for the PGN only. A UCI engine's PGN rating is ``elo`` or else its ``UCI_Elo``.
    """
    kind = spec.partition(":")[0]
    entry = PLAYER_KINDS.get(kind)
    if entry is None:
        known = " or ".join(f"{k}:..." for k in PLAYER_KINDS)
        raise ValueError(f"player spec {spec!r}: expected {known}")
    return entry.parse(spec)


def _parse_allie(spec: str) -> PlayerSpec:
    rest = spec.partition(":")[2]
    parts = rest.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"allie spec {spec!r}: expected allie:CKPT_DIR:PRESET:ELO")
    ckpt, preset, elo_text = parts
    if preset not in PRESETS:
        raise ValueError(f"allie spec {spec!r}: preset {preset!r} not in {PRESETS}")
    if elo_text == "auto":
        elo = None
    else:
        try:
            elo = int(elo_text)
        except ValueError:
            raise ValueError(f"allie spec {spec!r}: Elo {elo_text!r} is not a number") from None
        if not vocab.MIN_ELO <= elo <= vocab.MAX_ELO:
            raise ValueError(f"allie spec {spec!r}: Elo {elo} outside [500, 3000]")
    name = f"allie-{pathlib.Path(ckpt).name}-{preset}-{elo_text}"
    return PlayerSpec("allie", name, elo, checkpoint=ckpt, preset=preset)


def _parse_uci(spec: str) -> PlayerSpec:
    rest = spec.partition(":")[2]
    if not rest:
        raise ValueError(f"uci spec {spec!r}: expected uci:COMMAND[:Opt=val,...]")
    command, _, opt_text = rest.partition(":")
    options: list[tuple[str, str]] = []
    meta: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in opt_text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"uci spec {spec!r}: option {item!r} is not Name=value")
        (meta.__setitem__(key, value) if key in ("name", "elo") else options.append((key, value)))
    elo_text = meta.get("elo") or dict(options).get("UCI_Elo")
    elo = int(elo_text) if elo_text else None
    name = meta.get("name") or pathlib.Path(command.split()[0]).name + (f"-{elo}" if elo else "")
    return PlayerSpec("uci", name, elo, command=command, options=tuple(options))


def _parse_maia(spec: str) -> PlayerSpec:
    """``maia:DIR[:PRESET[:ELO]]`` (``allie_jax.baselines.maia_player``)."""
    from allie_jax.baselines.maia_player import parse_maia_spec

    m = parse_maia_spec(spec)
    return PlayerSpec("maia", m.name, m.elo, checkpoint=m.maia_dir, preset=m.preset)


def _load_maia(maia_dir: str) -> Any:
    from allie_jax.baselines.maia_player import MaiaEngine  # the same batched play() shape

    return MaiaEngine(maia_dir)


register_player_kind("allie", _parse_allie, Allie.load)
register_player_kind("maia", _parse_maia, _load_maia)
register_player_kind("uci", _parse_uci)


def is_batched(spec: PlayerSpec) -> bool:
    """True for players answered in batches (Allie and registered model families)."""
    entry = PLAYER_KINDS.get(spec.kind)
    return entry is not None and entry.load is not None


@dataclasses.dataclass(frozen=True)
class MatchConfig:
    white: PlayerSpec
    black: PlayerSpec
    games: int = 2
    time_control: str = "180+2"
    concurrency: int = 8
    alternate: bool = True
    seed: int = 0
    max_plies: int = 600
    allow_resign: bool = True
    raw_think_times: bool = False  # True: Allie spends its raw prediction and may lose on time
    uci_movetime: float | None = None  # cap a UCI engine's time per move (fast test matches)
    # Allie on the engine's closed set of shapes (``Allie.fix_shapes``): None = when a side's
    # preset has per-game budgets (adaptive modes); True/False = always/never
    fixed_shapes: bool | None = None
    # SearchConfig fields for Allie's presets (``launch.match --system_options``, the spelling
    # of ``launch.evaluate``: ``lambda``, ``lambda_schedule``, ``c_puct``, ``selection``, ...)
    search_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for spec in (self.white, self.black):
            if spec.kind == "allie":
                self.allie_preset(spec.preset)  # checks the options before any game starts
        base, _, inc = vocab.normalize_time_control(self.time_control).partition("+")
        if not (base.isdigit() and inc.isdigit() and int(base) > 0):
            raise ValueError(f"time control {self.time_control!r}: expected BASE+INC seconds")
        if self.games < 1 or self.concurrency < 1:
            raise ValueError("games and concurrency must be at least 1")

    @property
    def base_s(self) -> float:
        return float(vocab.normalize_time_control(self.time_control).split("+")[0])

    def allie_preset(self, preset: str) -> Any:
        """What Allie's ``play`` gets for ``preset``: the name, or with ``search_options`` its
        SearchConfig (a misspelt key or value is one ValueError line)."""
        if not self.search_options:
            return preset
        from allie_jax.search.config import from_options

        return from_options(preset, dict(self.search_options), strict=True)

    @property
    def inc_s(self) -> float:
        return float(vocab.normalize_time_control(self.time_control).split("+")[1])


@dataclasses.dataclass
class _LiveGame:
    index: int
    white: PlayerSpec
    black: PlayerSpec
    board: chess.Board = dataclasses.field(default_factory=chess.Board)
    clocks: list[float] = dataclasses.field(default_factory=list)  # [white, black] seconds
    clock_after: list[float] = dataclasses.field(default_factory=list)
    result: str = "*"
    termination: str = ""
    game_id: str = ""  # Allie's search keeps this game's KV cache under it
    lambdas: dict[int, float] = dataclasses.field(default_factory=dict)  # ply -> Allie's λ

    def mover(self) -> PlayerSpec:
        return self.white if self.board.turn == chess.WHITE else self.black

    def opponent(self) -> PlayerSpec:
        return self.black if self.board.turn == chess.WHITE else self.white


@dataclasses.dataclass
class MatchResult:
    games: list[_LiveGame]
    plies: int
    wall_s: float
    allie_calls: int
    terminations: Counter

    @property
    def plies_per_s(self) -> float:
        return self.plies / self.wall_s if self.wall_s > 0 else 0.0

    def score(self, name: str) -> tuple[float, int, int, int]:
        """(points, wins, draws, losses) of the player called ``name``."""
        w = d = lo = 0
        for g in self.games:
            if name not in (g.white.name, g.black.name) or g.result == "*":
                continue
            if g.result == "1/2-1/2":
                d += 1
            elif (g.result == "1-0") == (g.white.name == name):
                w += 1
            else:
                lo += 1
        return w + 0.5 * d, w, d, lo


class _UciPool:
    """One engine process per (spec, slot): concurrent games never share an engine."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, int], chess.engine.SimpleEngine] = {}

    def get(self, spec: PlayerSpec, slot: int) -> chess.engine.SimpleEngine:
        key = (spec.command + repr(spec.options), slot)
        if key not in self._engines:
            engine = chess.engine.SimpleEngine.popen_uci(spec.command.split())
            options = {}
            for k, v in spec.options:
                low = v.lower()
                options[k] = True if low == "true" else False if low == "false" else v
            if options:
                engine.configure(options)
            self._engines[key] = engine
        return self._engines[key]

    def close(self) -> None:
        for engine in self._engines.values():
            try:
                engine.quit()
            except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError):
                engine.close()
        self._engines.clear()


def _header_elos(g: _LiveGame) -> tuple[int | None, int | None]:
    """Rating tokens for Allie's game header: its own (or the opponent's, if auto) and the other."""
    we, be = g.white.elo, g.black.elo
    if is_batched(g.white) and we is None:
        we = be
    if is_batched(g.black) and be is None:
        be = we
    return we, be


def _fixes_shapes(cfg: MatchConfig, spec: PlayerSpec) -> bool:
    """Whether this player's Allie runs fixed shapes (see ``MatchConfig.fixed_shapes``)."""
    if cfg.fixed_shapes is not None:
        return cfg.fixed_shapes
    from allie_jax.search.config import ADAPTIVE_MODES

    same = [
        s for s in (cfg.white, cfg.black) if (s.kind, s.checkpoint) == (spec.kind, spec.checkpoint)
    ]
    return any(s.preset in ADAPTIVE_MODES for s in same)


def run_match(
    cfg: MatchConfig,
    *,
    output: str | pathlib.Path | None = None,
    allie_loader: Callable[[str], Allie] = Allie.load,
    log: Callable[[str], None] | None = None,
) -> MatchResult:
    """Play ``cfg.games`` games; write each finished game to ``output`` (PGN) as it ends.

    ``log`` hears one line per finished game with the progress (games done, each side's score,
    moves per second so far).
    """
    allies: dict[tuple[str, str], Any] = {}  # (kind, checkpoint) -> a batched player
    for spec in (cfg.white, cfg.black):
        if is_batched(spec) and (spec.kind, spec.checkpoint) not in allies:
            load = allie_loader if spec.kind == "allie" else PLAYER_KINDS[spec.kind].load
            player = load(spec.checkpoint)
            if _fixes_shapes(cfg, spec):
                player.fix_shapes()
            allies[(spec.kind, spec.checkpoint)] = player
    run_id = uuid.uuid4().hex[:8]
    pool = _UciPool()
    out_file = open(output, "w", encoding="utf-8") if output else None  # noqa: SIM115
    pending = list(range(cfg.games))
    live: dict[int, _LiveGame] = {}  # slot -> game
    finished: list[_LiveGame] = []
    calls = 0
    t0 = time.monotonic()
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=cfg.concurrency)

    def start(slot: int) -> None:
        i = pending.pop(0)
        w, b = (cfg.black, cfg.white) if cfg.alternate and i % 2 else (cfg.white, cfg.black)
        live[slot] = _LiveGame(i, w, b, clocks=[cfg.base_s, cfg.base_s], game_id=f"{run_id}-{i}")

    def finish(slot: int) -> None:
        g = live.pop(slot)
        finished.append(g)
        if out_file is not None:
            print(_to_pgn(g, cfg), file=out_file, end="\n\n")
            out_file.flush()
        if log:
            log(
                f"game {g.index + 1}: {g.white.name} - {g.black.name} {g.result} "
                f"({g.termination}, {len(g.board.move_stack)} plies)"
            )
            log(progress_line(finished, cfg, time.monotonic() - t0))
        if pending:
            start(slot)

    try:
        for slot in range(min(cfg.concurrency, cfg.games)):
            start(slot)
        step = 0
        while live:
            step += 1
            # Allie: one batched call per (checkpoint, preset)
            groups: dict[tuple[str, str, str], list[int]] = {}
            for slot, g in live.items():
                spec = g.mover()
                if is_batched(spec):
                    groups.setdefault((spec.kind, spec.checkpoint, spec.preset), []).append(slot)
            for (kind, ckpt, preset), slots in groups.items():
                games = []
                for slot in slots:
                    g = live[slot]
                    we, be = _header_elos(g)
                    games.append(
                        Game(
                            moves=[m.uci() for m in g.board.move_stack],
                            white_elo=we,
                            black_elo=be,
                            time_control=cfg.time_control,
                            game_id=g.game_id,
                        )
                    )
                # the batch answers by the tightest of its games' move limits (pacing rule)
                budgets = [
                    time_budget(Clock(live[s].clocks[_side(live[s])], cfg.inc_s)) for s in slots
                ]
                t_call, compile_s = time.monotonic(), _COMPILE_S[0]
                decisions = allies[(kind, ckpt)].play(
                    games,
                    cfg.allie_preset(preset) if kind == "allie" else preset,
                    cfg.seed * 1_000_003 + step,
                    deadline=t_call + min(b for b in budgets if b is not None),
                )
                # compiling is not thinking: an engine compiles before its game (UCI isready)
                call_s = time.monotonic() - t_call - (_COMPILE_S[0] - compile_s)
                calls += 1
                for slot, d in zip(slots, decisions, strict=True):
                    g = live[slot]
                    side = 0 if g.board.turn == chess.WHITE else 1
                    if d.resigned and cfg.allow_resign and len(g.board.move_stack) >= 2:
                        g.result = "0-1" if side == 0 else "1-0"
                        g.termination = "resignation"
                        continue
                    spent = d.think_time_s
                    if not cfg.raw_think_times:
                        spent = paced_time(spent, Clock(g.clocks[side], cfg.inc_s))
                    # the same measure as a UCI engine's: the wall time that passes
                    ply = len(g.board.move_stack)
                    _apply(g, chess.Move.from_uci(d.move), max(spent, call_s), cfg)
                    lam = d.effective_lambda
                    if len(g.board.move_stack) > ply and math.isfinite(lam):
                        g.lambdas[ply] = lam
            # UCI engines: in parallel, one process per game slot
            uci_slots = [s for s, g in live.items() if g.result == "*" and g.mover().kind == "uci"]
            futures = {s: threads.submit(_uci_move, pool, live[s], s, cfg) for s in uci_slots}
            for s, fut in futures.items():
                move, spent = fut.result()
                _apply(live[s], move, spent, cfg)
            for slot in [s for s, g in live.items() if g.result != "*"]:
                finish(slot)
    finally:
        threads.shutdown(wait=True)
        pool.close()
        if out_file is not None:
            out_file.close()
    finished.sort(key=lambda g: g.index)
    terms = Counter(g.termination for g in finished)
    plies = sum(len(g.board.move_stack) for g in finished)
    return MatchResult(finished, plies, time.monotonic() - t0, calls, terms)


def _side(g: _LiveGame) -> int:
    return 0 if g.board.turn == chess.WHITE else 1


def progress_line(finished: Sequence[_LiveGame], cfg: MatchConfig, wall_s: float) -> str:
    """``[done/total] <white spec> a - b <black spec>, N plies, X moves/s`` (scores so far)."""
    names = [cfg.white.name] + ([cfg.black.name] if cfg.black.name != cfg.white.name else [])
    points = {n: 0.0 for n in names}
    for g in finished:
        if g.result == "1/2-1/2":
            for n in {g.white.name, g.black.name}:
                points[n] = points.get(n, 0.0) + 0.5
        elif g.result in ("1-0", "0-1"):
            winner = g.white.name if g.result == "1-0" else g.black.name
            points[winner] = points.get(winner, 0.0) + 1.0
    plies = sum(len(g.board.move_stack) for g in finished)
    score = " - ".join(f"{n} {points[n]:g}" for n in names)
    rate = plies / wall_s if wall_s > 0 else 0.0
    return f"[{len(finished)}/{cfg.games}] {score}; {plies} plies, {rate:.1f} moves/s"


def _uci_move(
    pool: _UciPool, g: _LiveGame, slot: int, cfg: MatchConfig
) -> tuple[chess.Move, float]:
    engine = pool.get(g.mover(), slot)
    if cfg.uci_movetime is not None:
        limit = chess.engine.Limit(time=cfg.uci_movetime)
    else:
        limit = chess.engine.Limit(
            white_clock=max(g.clocks[0], 0.01),
            black_clock=max(g.clocks[1], 0.01),
            white_inc=cfg.inc_s,
            black_inc=cfg.inc_s,
        )
    t = time.monotonic()
    result = engine.play(g.board, limit, game=(id(g), g.index))
    spent = time.monotonic() - t
    if result.move is None or result.move not in g.board.legal_moves:
        raise RuntimeError(f"{g.mover().name} answered {result.move} in {g.board.fen()}")
    return result.move, spent


def _apply(g: _LiveGame, move: chess.Move, spent: float, cfg: MatchConfig) -> None:
    """Play a move on the simulated clock and adjudicate the game."""
    if g.result != "*":
        return
    side = 0 if g.board.turn == chess.WHITE else 1
    if move not in g.board.legal_moves:
        raise RuntimeError(f"{g.mover().name} chose illegal {move.uci()} in {g.board.fen()}")
    g.clocks[side] -= max(0.0, spent)
    if g.clocks[side] < 0:  # the move is never played: the flag fell while thinking
        color = chess.WHITE if side == 0 else chess.BLACK
        if g.board.has_insufficient_material(not color):
            g.result, g.termination = "1/2-1/2", "time forfeit, insufficient material"
        else:
            g.result, g.termination = ("0-1" if side == 0 else "1-0"), "time forfeit"
        return
    g.clocks[side] += cfg.inc_s
    g.board.push(move)
    g.clock_after.append(g.clocks[side])
    outcome = g.board.outcome(claim_draw=True)
    if outcome is not None:
        g.result = outcome.result()
        g.termination = outcome.termination.name.lower().replace("_", " ")
    elif len(g.board.move_stack) >= cfg.max_plies:
        g.result, g.termination = "1/2-1/2", "max plies"


_PGN_TERMINATION = {"time forfeit": "Time forfeit", "max plies": "Unterminated"}


def _to_pgn(g: _LiveGame, cfg: MatchConfig) -> str:
    game = chess.pgn.Game()
    h = game.headers
    h["Event"] = "allie-jax match"
    h["Site"] = "local"
    h["Date"] = datetime.date.today().strftime("%Y.%m.%d")
    h["Round"] = str(g.index + 1)
    h["White"], h["Black"] = g.white.name, g.black.name
    h["Result"] = g.result
    we, be = _header_elos(g)
    if we is not None:
        h["WhiteElo"] = str(we)
    if be is not None:
        h["BlackElo"] = str(be)
    h["TimeControl"] = vocab.normalize_time_control(cfg.time_control)
    h["Termination"] = _PGN_TERMINATION.get(g.termination, "Normal")
    h["TerminationDetail"] = g.termination
    node: Any = game
    for ply, (move, clk) in enumerate(zip(g.board.move_stack, g.clock_after, strict=True)):
        node = node.add_variation(move)
        node.set_clock(float(max(0, int(clk))))  # whole seconds, as Lichess writes them
        if ply in g.lambdas:  # Allie's searched move: the KL weight its policy is optimal for
            node.comment = f"{node.comment} [%lambda {g.lambdas[ply]:.6g}]".strip()
    return str(game)


def calibration_markdown(pgn_path: str | pathlib.Path, systems: Sequence[str]) -> str:
    """The evaluation module's calibration table (performance and SCE per opponent level)."""
    from allie_jax.eval.calibration import calibration_from_pgn

    try:
        return calibration_from_pgn(pgn_path, list(systems)).to_markdown()
    except ValueError as exc:
        return f"(no calibration table: {exc})"
