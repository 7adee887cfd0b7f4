"""A UCI engine around ``Allie``: the command handler, testable in-process, and a stdin loop.

Design choices that matter to GUIs and bots:

* ``uci`` is answered at once: this module imports no JAX, and the loader (which imports the
  model code and reads the checkpoint) runs in a background thread started by ``uci``;
  ``isready`` waits for it and then compiles every shape the engine can meet under the current
  options (``Allie.warmup``; again after options changed), so no move waits for the compiler.
* ``go`` thinks in a worker thread, so ``isready``, ``stop`` and ``ponderhit`` are answered while
  thinking. ``bestmove`` is sent exactly once per ``go``. The time manager
  (``engine.time_manager``: ``movestogo``, ``Move Overhead``) gives the whole move a limit; the
  search's own deadline keeps back the time its finish has been taking, and at the limit the
  engine answers itself if the worker has not.
* The move never comes from outside the model. The worker first computes the root prior (one
  forward, cached); an answer forced by the clock or ``stop`` plays the search's most visited
  move so far, else the prior's most likely move. An ``info string ... path P`` line names what
  decided every move: ``search`` (simulations ran), ``prior`` (the model's policy alone, as the
  preset asks or when no simulation ran) or ``fallback`` (the clock or ``stop`` forced the answer,
  or the position could not be read).
* The model reads the game, not a board: ``position startpos moves ...`` is the game so far.
  ``position fen F moves ...`` gets a history: a legal sequence from the standard start reaching
  ``F`` exactly (``engine.fen_history``, searched in the background from ``position`` on), and
  the game is played from it. Without one, the position goes to the board-reading model the user
  configured (``fen_model``), else the move is the fallback; an ``info string`` says which, once
  per game.
* Each game gets an id (a new one at ``ucinewgame`` or when ``position`` does not continue the
  last one), so the search keeps the game's KV cache between moves and a move costs only the
  plies added since the last one.
* Allie's own rating: ``SelfElo`` if set, else ``UCI_Elo`` when ``UCI_LimitStrength`` is on
  (the UCI convention: a GUI sending every default plays as Allie-Policy does, at the
  opponent's rating), else the opponent's rating (``UCI_Opponent`` or ``OppoElo``).
* Allie predicts a result (tanh), not draw odds: ``score cp`` maps the mover's searched value Q
  (the value head's where no simulation ran) with Lc0's curve, ``wdl`` reports
  w = (1+Q)/2, d = 0, l = (1−Q)/2 per mille, and a move that mates is ``score mate 1``.
  While searching, ``info`` lines report nodes, nps and the most visited move about twice a
  second. MultiPV lines are ranked by root visits (the policy's order when nothing was searched).
* ``Temperature`` applies to every move: to the prior of budget-0 moves (the preset's rule) and
  to the search's final policy (``api.temper``; 0 plays its most likely move).
* ``go ponder``: the engine searches the position (with the expected reply already on the
  board) without a clock; ``ponderhit`` starts the clock for that move (the search continues
  under its deadline), ``stop`` answers at once.
* Resignation is a decision, not a move: with ``AllowResign`` the engine sends
  ``info string resign`` before its ``bestmove`` (the Python API returns ``Decision.resigned``).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

# Only the standard library and light modules of this package at import: ``uciok`` goes out
# before python-chess, numpy or JAX load (each function imports python-chess where it needs it).
from allie_jax import vocab
from allie_jax.engine.pacing import remaining_wait
from allie_jax.engine.time_manager import MOVE_OVERHEAD_S, Clock, FinishReserve, MovePlan
from allie_jax.modes import MODES, SEARCH_MODES

if TYPE_CHECKING:
    import chess

    from allie_jax.game import Game
    from allie_jax.player import Decision, Player, Prediction

PRESETS = MODES  # the play modes (allie_jax.modes: standard library only, so uciok stays quick)
LAMBDA_SCHEDULES = ("constant", "paper", "released")
SELECTIONS = ("puct", "kl")  # SearchConfig.selection

ENGINE_NAME = "Allie (allie-jax)"
ENGINE_AUTHOR = "allie-jax authors (after Zhang et al., 2024)"
DEFAULT_ELO = 1500
STOP_ANSWER_S = 0.05  # after ``stop``, the engine answers itself if the search has not
INFO_EVERY_S = 0.5  # periodic info lines while searching
_GAME_IDS = itertools.count(1)
_BASES = (60, 120, 180, 240, 300, 360, 420)  # the initial times of the vocabulary's controls


@dataclasses.dataclass
class Options:
    """The engine's UCI options (mutable: ``setoption`` changes them between games)."""

    self_elo: int = 0  # 0: play at the opponent's rating (Allie-Policy's setting)
    uci_elo: int = DEFAULT_ELO  # Allie's rating when limit_strength is on
    limit_strength: bool = False  # UCI_LimitStrength: off = the opponent's rating
    oppo_elo: int = DEFAULT_ELO
    opponent_elo: int | None = None  # from UCI_Opponent, overrides oppo_elo when present
    mode: str = "adaptive"
    mean_sims: int = 50
    max_sims: int = 200
    gumbel_c_scale: float = 0.1  # the Gumbel modes' KL knob: λ ∝ 1 / c_scale
    temperature: float = 1.0
    human_pacing: bool = False
    allow_resign: bool = False
    show_wdl: bool = False
    multipv: int = 1
    seed: int = 0
    time_control: str = ""  # "" = infer from the first go of the game
    move_overhead_ms: int = int(MOVE_OVERHEAD_S * 1000)
    ponder: bool = False
    c_puct: float | None = None  # None: the preset's
    anchor_lambda: float | None = None
    lambda_schedule: str | None = None
    selection: str | None = None  # None: the preset's ("puct")
    leaf_batch: int | None = None


# name, UCI declaration, setter(options, raw value) — the single place an option is defined.
def _spin(lo: int, hi: int, field: str) -> Callable[[Options, str], None]:
    def set_(o: Options, raw: str) -> None:
        value = int(raw)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is outside [{lo}, {hi}]")
        setattr(o, field, value)

    return set_


def _check(field: str) -> Callable[[Options, str], None]:
    def set_(o: Options, raw: str) -> None:
        low = raw.strip().lower()
        if low not in ("true", "false"):
            raise ValueError(f"{raw!r} is not true/false")
        setattr(o, field, low == "true")

    return set_


def _set_uci_elo(o: Options, raw: str) -> None:
    _spin(vocab.MIN_ELO, vocab.MAX_ELO, "uci_elo")(o, raw)


def _set_mode(o: Options, raw: str) -> None:
    if raw.strip().lower() not in PRESETS:
        raise ValueError(f"{raw!r} is not one of {', '.join(PRESETS)}")
    o.mode = raw.strip().lower()


def _set_temperature(o: Options, raw: str) -> None:
    value = float(raw)
    if not (math.isfinite(value) and 0.0 <= value <= 10.0):
        raise ValueError(f"{raw!r} is not a temperature in [0, 10]")
    o.temperature = value


def _set_c_scale(o: Options, raw: str) -> None:
    value = float(raw)
    if not (math.isfinite(value) and 0.0 < value <= 1000.0):
        raise ValueError(f"{raw!r} is not a c_scale in (0, 1000]")
    o.gumbel_c_scale = value


def _positive_float(field: str, hi: float) -> Callable[[Options, str], None]:
    def set_(o: Options, raw: str) -> None:
        if raw.strip().lower() in ("", "<preset>", "<empty>"):
            setattr(o, field, None)  # back to the preset's value
            return
        value = float(raw)
        if not (math.isfinite(value) and 0.0 < value <= hi):
            raise ValueError(f"{raw!r} is not a number in (0, {hi:g}]")
        setattr(o, field, value)

    return set_


def _set_schedule(o: Options, raw: str) -> None:
    if raw.strip().lower() not in LAMBDA_SCHEDULES:
        raise ValueError(f"{raw!r} is not one of {', '.join(LAMBDA_SCHEDULES)}")
    o.lambda_schedule = raw.strip().lower()


def _set_selection(o: Options, raw: str) -> None:
    if raw.strip().lower() not in SELECTIONS:
        raise ValueError(f"{raw!r} is not one of {', '.join(SELECTIONS)}")
    o.selection = raw.strip().lower()


def _set_opponent(o: Options, raw: str) -> None:
    o.opponent_elo = parse_opponent(raw)


def _set_tc(o: Options, raw: str) -> None:
    raw = raw.strip()
    if raw and raw != "<empty>" and not _valid_tc(raw):
        raise ValueError(f"{raw!r} is not a time control like 180+2")
    o.time_control = "" if raw == "<empty>" else raw


def _valid_tc(tc: str) -> bool:
    base, _, inc = vocab.normalize_time_control(tc).partition("+")
    return base.isdigit() and inc.isdigit()


OPTIONS: dict[str, tuple[str, Callable[[Options, str], None]]] = {
    "UCI_LimitStrength": ("type check default false", _check("limit_strength")),
    "UCI_Elo": (
        f"type spin default {DEFAULT_ELO} min {vocab.MIN_ELO} max {vocab.MAX_ELO}",
        _set_uci_elo,
    ),
    "SelfElo": (
        f"type spin default 0 min 0 max {vocab.MAX_ELO}",
        _spin(0, vocab.MAX_ELO, "self_elo"),
    ),
    "OppoElo": (
        f"type spin default {DEFAULT_ELO} min {vocab.MIN_ELO} max {vocab.MAX_ELO}",
        _spin(vocab.MIN_ELO, vocab.MAX_ELO, "oppo_elo"),
    ),
    "UCI_Opponent": ("type string default <empty>", _set_opponent),
    "Mode": ("type combo default adaptive " + " ".join(f"var {p}" for p in PRESETS), _set_mode),
    "MeanSims": ("type spin default 50 min 0 max 2000", _spin(0, 2000, "mean_sims")),
    "MaxSims": ("type spin default 200 min 1 max 2000", _spin(1, 2000, "max_sims")),
    "Temperature": ("type string default 1.0", _set_temperature),
    "GumbelCScale": ("type string default 0.1", _set_c_scale),
    "HumanPacing": ("type check default false", _check("human_pacing")),
    "AllowResign": ("type check default false", _check("allow_resign")),
    "UCI_ShowWDL": ("type check default false", _check("show_wdl")),
    "MultiPV": ("type spin default 1 min 1 max 20", _spin(1, 20, "multipv")),
    "Seed": ("type spin default 0 min 0 max 2147483647", _spin(0, 2**31 - 1, "seed")),
    "TimeControl": ("type string default <empty>", _set_tc),
    "Move Overhead": (
        f"type spin default {int(MOVE_OVERHEAD_S * 1000)} min 0 max 10000",
        _spin(0, 10000, "move_overhead_ms"),
    ),
    "Ponder": ("type check default false", _check("ponder")),
    "CPuct": ("type string default 1.25", _positive_float("c_puct", 100.0)),
    "Lambda": ("type string default <preset>", _positive_float("anchor_lambda", 1000.0)),
    "LambdaSchedule": (
        "type combo default constant " + " ".join(f"var {v}" for v in LAMBDA_SCHEDULES),
        _set_schedule,
    ),
    "Selection": (
        "type combo default puct " + " ".join(f"var {v}" for v in SELECTIONS),
        _set_selection,
    ),
    # the engine's K when unset is the launcher's (launch.uci: api.PLAY_LEAF_BATCH = 16)
    "LeafBatch": ("type spin default 16 min 1 max 64", _spin(1, 64, "leaf_batch")),
}
_OPTION_KEYS = {k.lower(): k for k in OPTIONS}


def parse_opponent(raw: str) -> int | None:
    """The rating in lichess-bot's ``UCI_Opponent`` value ``title rating type name``.

    ``none 1500 human Bob`` -> 1500; a rating of ``none`` (or anything unparsable) -> None.
    """
    parts = raw.split()
    if len(parts) >= 2:
        try:
            return int(round(float(parts[1])))
        except ValueError:
            return None
    return None


def infer_time_control(time_s: float, increment_s: float) -> str:
    """A ``base+inc`` string from the first ``go`` of a game; the base snaps to the vocabulary's.

    The clock at the first move is the initial time (or a little less for Black), so the nearest
    vocabulary base within 10% is taken; anything else stays as measured (and encodes to <UNK>).
    """
    inc = max(0, int(round(increment_s)))
    nearest = min(_BASES, key=lambda b: abs(b - time_s))
    base = nearest if abs(nearest - time_s) <= 0.1 * nearest else max(0, int(round(time_s)))
    return f"{base}+{inc}"


def value_to_cp(value_stm: float) -> int:
    """Lc0's map from an expected result in [−1, 1] to centipawns (monotone, 0 -> 0)."""
    q = max(-0.99, min(0.99, value_stm))
    return int(round(111.714640912 * math.tan(1.5620688421 * q)))


def value_to_wdl(value_stm: float) -> tuple[int, int, int]:
    w = int(round(500 * (1.0 + max(-1.0, min(1.0, value_stm)))))
    return w, 0, 1000 - w


@dataclasses.dataclass
class _Position:
    start_fen: str | None  # None: the standard start
    moves: list[str]
    known_board: chess.Board | None = None  # None: replayed when first read

    @property
    def board(self) -> chess.Board:
        """The board after the moves (the handler's first position builds it on first use, so
        python-chess is not imported before ``uciok``)."""
        if self.known_board is None:
            import chess

            board = chess.Board(self.start_fen) if self.start_fen else chess.Board()
            for move in self.moves:
                board.push_uci(move)
            self.known_board = board
        return self.known_board


@dataclasses.dataclass(frozen=True)
class GoParams:
    wtime: float | None = None  # seconds
    btime: float | None = None
    winc: float = 0.0
    binc: float = 0.0
    movetime: float | None = None
    nodes: int | None = None
    infinite: bool = False
    movestogo: int | None = None
    ponder: bool = False

    @classmethod
    def parse(cls, tokens: list[str]) -> GoParams:
        """Parse ``go`` arguments; unknown or malformed ones are ignored (UCI asks for leniency)."""
        values: dict[str, Any] = {}
        ms_keys = {"wtime", "btime", "winc", "binc", "movetime"}
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in ("infinite", "ponder"):
                values[tok] = True
            elif tok in ms_keys or tok in ("nodes", "movestogo", "depth", "mate"):
                if i + 1 < len(tokens):
                    try:
                        number = int(float(tokens[i + 1]))
                    except (ValueError, OverflowError):
                        number = None
                    if number is not None:
                        if tok in ms_keys:
                            values[tok] = max(0, number) / 1000.0
                        elif tok == "nodes":
                            values["nodes"] = max(0, min(number, 2000))
                        elif tok == "movestogo" and number > 0:
                            values["movestogo"] = number
                    i += 1
            i += 1
        return cls(**values)

    def clock(self, white: bool, overhead_s: float = MOVE_OVERHEAD_S) -> Clock:
        return Clock(
            time_left_s=self.wtime if white else self.btime,
            increment_s=self.winc if white else self.binc,
            movetime_s=self.movetime,
            moves_to_go=self.movestogo,
            overhead_s=overhead_s,
        )


@dataclasses.dataclass
class _Go:
    """One ``go``: what it plays on, its clock, and what a forced answer can play."""

    index: int
    pos: _Position
    game: Game
    params: GoParams
    start: float
    clock: Clock
    plan: MovePlan
    pondering: bool = False
    prior: Prediction | None = None  # the root prior, once computed
    prior_ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    ponderhit: threading.Event = dataclasses.field(default_factory=threading.Event)
    interim: tuple[int, str] | None = None  # (simulations, most visited move) so far
    last_info: float = 0.0


class UciHandler:
    """Handles UCI command lines; ``handle`` returns False after ``quit``."""

    def __init__(
        self,
        loader: Callable[[], Player],
        write: Callable[[str], None],
        *,
        warmup: bool = True,
    ) -> None:
        self._loader = loader
        self._write_raw = write
        self._warmup = warmup
        self._out_lock = threading.Lock()
        self._allie: Player | None = None
        self._load_error: str | None = None
        self._load_thread: threading.Thread | None = None
        self._think_thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []  # every go's worker still running
        self._model_lock = threading.Lock()  # one model call at a time (workers, warm-up)
        self._warm: set[str] = set()  # the play settings compiled so far
        self._stop = threading.Event()
        self._answer_lock = threading.Lock()
        self._answered_go = 0  # the last go whose bestmove is out
        self.options = Options()
        self._position = _Position(None, [])
        self._tc: str | None = None  # inferred at the first go of a game
        self._game_id = self._new_game_id()
        self._go_count = 0
        self._go: _Go | None = None
        self._histories: dict[str, threading.Thread] = {}  # FEN -> its history search
        self._said: set[tuple[str, str]] = set()  # (game id, note) already sent
        self.reserve = FinishReserve()
        self.path_counts: collections.Counter = collections.Counter()
        self.last_decision: Decision | None = None
        self.warmup_s: float | None = None  # seconds the last warm-up took (None: none ran)

    # ------------------------------------------------------------ plumbing

    def send(self, line: str) -> None:
        with self._out_lock:
            self._write_raw(line)

    def _say_once(self, note: str) -> None:
        key = (self._game_id, note)
        if key not in self._said:
            self._said.add(key)
            self.send(f"info string {note}")

    @staticmethod
    def _new_game_id() -> str:
        return f"uci-{os.getpid()}-{next(_GAME_IDS)}"

    def _start_loading(self) -> None:
        if self._load_thread is None:
            self._load_thread = threading.Thread(target=self._load, name="allie-load", daemon=True)
            self._load_thread.start()

    def _load(self) -> None:
        try:
            self._allie = self._loader()
        except Exception as exc:  # the engine must keep answering; go reports the failure
            self._allie = None
            self._load_error = f"{type(exc).__name__}: {exc}"

    def _ensure_warm(self, allie: Player) -> None:
        """Compile every shape the current options can meet (once per distinct setting)."""
        preset, overrides = self._play_settings()
        key = repr((preset, sorted(overrides.items())))
        if key in self._warm:
            return
        t = time.monotonic()
        with self._model_lock:
            allie.warmup(preset, 1, **overrides)
        self._warm.add(key)
        self.warmup_s = time.monotonic() - t

    def _wait_model(self) -> Player | None:
        self._start_loading()
        assert self._load_thread is not None
        self._load_thread.join()
        return self._allie

    @property
    def thinking(self) -> bool:
        """True until this go's bestmove is sent (the worker may linger a moment after it)."""
        return self._answered_go < self._go_count

    def _answer(self, go: _Go, move: str, ponder: str | None = None) -> bool:
        """Send ``bestmove`` for ``go`` unless it was answered already."""
        with self._answer_lock:
            if self._answered_go >= go.index:
                return False
            # answered before the line goes out: a GUI's next go may arrive the instant it does
            self._answered_go = go.index
            self.send(f"bestmove {move}" + (f" ponder {ponder}" if ponder else ""))
            return True

    def _current(self, go: _Go) -> bool:
        return self._answered_go < go.index

    # ------------------------------------------------------------ commands

    def handle(self, line: str) -> bool:
        """Handle one command line. Never raises on bad input; False means quit."""
        tokens = line.strip().split()
        if not tokens:
            return True
        cmd, args = tokens[0], tokens[1:]
        try:
            if cmd == "quit":
                self._stop_thinking()
                return False
            handler = self._COMMANDS.get(cmd)
            if handler is not None:
                handler(self, args)
        except Exception as exc:  # a bug must not kill a running game
            self.send(f"info string error handling {cmd!r}: {type(exc).__name__}: {exc}")
        return True

    def _cmd_uci(self, args: list[str]) -> None:
        self.send(f"id name {ENGINE_NAME}")
        self.send(f"id author {ENGINE_AUTHOR}")
        for name, (decl, _) in OPTIONS.items():
            self.send(f"option name {name} {decl}")
        self.send("uciok")
        self._start_loading()

    def _cmd_isready(self, args: list[str]) -> None:
        allie = self._wait_model()
        if self._load_error:
            self.send(f"info string error loading the model: {self._load_error}")
        elif (
            allie is not None
            and self._warmup
            and not self.thinking
            and not self._model_lock.locked()
        ):
            try:  # options changed since the last compile: compile now, not during a move
                self._ensure_warm(allie)
            except Exception as exc:
                self.send(f"info string could not compile ahead: {type(exc).__name__}: {exc}")
        self.send("readyok")

    def _cmd_setoption(self, args: list[str]) -> None:
        # setoption name <name words> [value <value words>]
        if not args or args[0] != "name":
            self.send("info string setoption needs: name <id> [value <x>]")
            return
        if "value" in args:
            k = args.index("value")
            name, value = " ".join(args[1:k]), " ".join(args[k + 1 :])
        else:
            name, value = " ".join(args[1:]), ""
        key = _OPTION_KEYS.get(name.lower())
        if key is None:
            self.send(f"info string unknown option {name!r}")
            return
        try:
            OPTIONS[key][1](self.options, value)
        except (ValueError, OverflowError) as exc:
            self.send(f"info string bad value for {key}: {exc}")

    def _cmd_ucinewgame(self, args: list[str]) -> None:
        self._position = _Position(None, [])
        self._tc = None
        self._game_id = self._new_game_id()

    def _cmd_position(self, args: list[str]) -> None:
        import chess

        if not args:
            self.send("info string position needs startpos or fen")
            return
        if "moves" in args:
            k = args.index("moves")
            spec, moves = args[:k], args[k + 1 :]
        else:
            spec, moves = args, []
        if spec[0] == "startpos" and len(spec) == 1:
            fen, board = None, chess.Board()
        elif spec[0] == "fen" and len(spec) > 1:
            fen = " ".join(spec[1:])
            try:
                board = chess.Board(fen)
            except ValueError as exc:
                self.send(f"info string error: invalid fen {fen!r} ({exc}); position kept")
                return
            if board.is_valid() is False:
                self.send(f"info string error: impossible position {fen!r}; position kept")
                return
            if fen == chess.STARTING_FEN:
                fen = None
        else:
            self.send(f"info string error: cannot parse position {' '.join(args)!r}; position kept")
            return
        ucis = []
        for ply, text in enumerate(moves):
            try:
                move = chess.Move.from_uci(text)
            except ValueError:
                move = None
            if move is None or move not in board.legal_moves:
                self.send(
                    f"info string error: illegal move {ply + 1} {text!r} in {board.fen()}; "
                    "position kept"
                )
                return
            board.push(move)
            ucis.append(move.uci())
        old = self._position
        continues = old.start_fen == fen and ucis[: len(old.moves)] == old.moves
        if not continues:
            self._tc = None  # a different game: re-infer its time control at the next go
            self._game_id = self._new_game_id()
        if fen is not None:
            self._search_history(fen)
        self._position = _Position(fen, ucis, board)

    def _search_history(self, fen: str) -> None:
        """Look for the FEN's history in the background (pure Python; no model call)."""
        from allie_jax.engine import fen_history

        running = self._histories.get(fen)
        if (running is not None and running.is_alive()) or fen_history.cached(fen) is not None:
            return  # searching, or known (a search that timed out is tried again)
        thread = threading.Thread(
            target=fen_history.find_history, args=(fen,), name="allie-history", daemon=True
        )
        self._histories[fen] = thread
        thread.start()

    def _cmd_go(self, args: list[str]) -> None:
        import chess

        t0 = time.monotonic()
        if self.thinking:
            self.send("info string already thinking; go ignored")
            return
        pos = self._position
        snapshot = _Position(pos.start_fen, list(pos.moves), pos.board.copy(stack=False))
        self._stop.clear()
        self._go_count += 1
        params = GoParams.parse(args)
        overhead = self.options.move_overhead_ms / 1000.0
        clock = params.clock(snapshot.board.turn == chess.WHITE, overhead)
        game = self._game_for(snapshot, params)  # here, not in the worker: it sets self._tc
        unbounded = params.infinite or params.ponder
        plan = MovePlan.make(t0, None if unbounded else clock, self.reserve.seconds)
        go = _Go(self._go_count, snapshot, game, params, t0, clock, plan, params.ponder)
        self._go = go
        self._think_thread = threading.Thread(
            target=self._think, args=(go,), name="allie-go", daemon=True
        )
        self._think_thread.start()
        self._workers = [t for t in self._workers if t.is_alive()] + [self._think_thread]
        self._arm(go)

    def _arm(self, go: _Go) -> None:
        """At the move's limit, answer with the fallback if the worker has not."""
        if go.plan.hard_deadline is None:
            return
        timer = threading.Timer(
            max(0.0, go.plan.hard_deadline - time.monotonic()),
            self._fallback,
            args=(go, "the move's time limit"),
        )
        timer.daemon = True
        timer.start()

    def _cmd_ponderhit(self, args: list[str]) -> None:
        go = self._go
        if go is None or not go.pondering or not self._current(go):
            return
        now = time.monotonic()
        go.plan = MovePlan.make(now, go.clock, self.reserve.seconds)
        go.start = now
        go.pondering = False
        go.ponderhit.set()
        self._arm(go)

    def _fallback(self, go: _Go, why: str) -> None:
        """Answer now if the worker has not (after ``stop`` or at the limit): the search's most
        visited move so far, else the root prior's most likely move (waiting for that one
        forward if it is still running). Never a move the model did not choose."""
        import chess

        if not self._current(go):
            return
        move, what = None, ""
        if go.interim is not None:
            sims, searched = go.interim
            if sims > 0 and chess.Move.from_uci(searched) in go.pos.board.legal_moves:
                move, what = searched, f"the search's most visited move after {sims} simulations"
        if move is None:
            go.prior_ready.wait()
            if go.prior is None or not go.prior.move_probs or not self._current(go):
                return  # the worker failed or answered: its own answer stands
            move = max(go.prior.move_probs, key=go.prior.move_probs.__getitem__)
            what = "the root prior's most likely move"
        if self._current(go):
            self.send(f"info string answering at {why} with {what}")
            elapsed = time.monotonic() - go.start
            limit = f" limit {go.plan.limit_s:.3f}s" if go.plan.limit_s is not None else ""
            self.send(f"info string move {move} path fallback{limit} elapsed {elapsed:.3f}s")
            if self._answer(go, move):
                self.path_counts["fallback"] += 1

    def _cmd_stop(self, args: list[str]) -> None:
        self._stop_thinking()

    def _stop_thinking(self) -> None:
        """Stop the search: its bestmove comes within a chunk, else the fallback within 50 ms."""
        self._stop.set()
        thread, go = self._think_thread, self._go
        if go is not None:
            go.ponderhit.set()  # a pondering worker stops waiting too
        if thread is None or go is None or not self.thinking:
            return
        end = time.monotonic() + STOP_ANSWER_S
        while self.thinking and time.monotonic() < end:
            thread.join(timeout=0.005)
        if self.thinking:
            if go.prior_ready.is_set() or go.interim is not None:
                self._fallback(go, "stop")
            else:  # the prior is still on its way (a load, a compile): keep reading commands
                threading.Thread(target=self._fallback, args=(go, "stop"), daemon=True).start()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop thinking and wait up to ``timeout`` s for the worker threads; True if they ended."""
        self._stop_thinking()
        end = time.monotonic() + timeout
        threads = [t for t in [*self._workers, self._load_thread] if t is not None]
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    _COMMANDS: dict[str, Callable[[UciHandler, list[str]], None]] = {
        "uci": _cmd_uci,
        "isready": _cmd_isready,
        "setoption": _cmd_setoption,
        "ucinewgame": _cmd_ucinewgame,
        "position": _cmd_position,
        "go": _cmd_go,
        "stop": _cmd_stop,
        "ponderhit": _cmd_ponderhit,
    }

    # ------------------------------------------------------------ thinking

    def own_elo(self) -> tuple[int, str]:
        """Allie's rating token and where it comes from (see the module docstring)."""
        o = self.options
        if o.self_elo:
            return o.self_elo, "SelfElo"
        if o.limit_strength:
            return o.uci_elo, "UCI_Elo"
        return self._opponent_elo(), "the opponent's rating"

    def _opponent_elo(self) -> int:
        o = self.options
        oppo = o.opponent_elo if o.opponent_elo is not None else o.oppo_elo
        return min(max(oppo, vocab.MIN_ELO), vocab.MAX_ELO)

    def _elos(self, white_to_move: bool) -> tuple[int, int]:
        me, oppo = self.own_elo()[0], self._opponent_elo()
        return (me, oppo) if white_to_move else (oppo, me)

    def _game_for(self, pos: _Position, params: GoParams) -> Game:
        import chess

        from allie_jax.game import Game

        white = pos.board.turn == chess.WHITE
        if self.options.time_control:
            tc = vocab.normalize_time_control(self.options.time_control)
        else:
            if self._tc is None:
                clock = params.clock(white)
                if clock.time_left_s is not None:
                    other = params.btime if white else params.wtime
                    start = max(clock.time_left_s, other or 0.0)
                    self._tc = infer_time_control(start, clock.increment_s)
            tc = self._tc
        we, be = self._elos(white)
        return Game(
            moves=list(pos.moves),
            white_elo=we,
            black_elo=be,
            time_control=tc,
            game_id=self._game_id,
        )

    def _history(self, allie: Player, go: _Go) -> tuple[Game, str | None, str]:
        """The game to play from the standard start when the FEN's history is found (waiting
        for its search at most half the move's limit), else the game and its FEN unchanged,
        with the line to say about it."""
        from allie_jax.engine import fen_history

        fen = go.pos.start_fen
        if fen is None or allie.reads_boards:
            return go.game, fen, ""
        self._search_history(fen)
        thread = self._histories.get(fen)
        if thread is not None:
            limit = go.plan.limit_s
            thread.join(None if limit is None else 0.5 * limit)
        found = fen_history.cached(fen)
        if found is None or not found.found:
            why = found.why if found is not None else "its history search is still running"
            then = (
                "the board model (--fen_model) reads it"
                if allie.fen_model is not None
                else "no board model (--fen_model): playing the fallback, the model's prior "
                "from the moves after the FEN (a position it cannot read)"
            )
            return go.game, fen, f"no history for the FEN {fen!r}: {why}; {then}"
        moves = list(found.moves or ()) + list(go.game.moves)
        note = (
            f"playing from a history of {len(found.moves or ())} plies that reaches the FEN "
            f"exactly: {' '.join(found.moves or ())}"
        )
        return dataclasses.replace(go.game, moves=moves), None, note

    def _think(self, go: _Go) -> None:
        pos = go.pos
        bestmove, ponder = "0000", None
        try:
            if not any(True for _ in pos.board.legal_moves):
                outcome = pos.board.outcome()
                why = outcome.termination.name.lower() if outcome else "no legal moves"
                self.send(f"info string the game is over ({why}): no move to play")
                bestmove = "(none)"
                return
            allie = self._wait_model()
            if allie is None:
                self.send(f"info string model unavailable ({self._load_error}): no move to play")
                return
            game, fen, note = self._history(allie, go)
            if note:
                self._say_once(note)
            with self._model_lock:
                if not self._current(go):
                    return  # answered meanwhile (stop, time limit): nothing left to do
                try:
                    # an unread FEN with a board model: that model's prior is the fallback
                    reader = allie.fen_model if fen is not None else None
                    reads = allie.reads_boards
                    go.prior = root_prior(allie if reads or reader is None else reader, game, fen)
                finally:
                    go.prior_ready.set()
                decision, extra = self._decide(allie, go, game, fen)
            bestmove = decision.move
            if go.pondering:  # no bestmove before ponderhit or stop
                go.ponderhit.wait()
            if not self._current(go):
                return
            self._observe(go)
            self.last_decision = decision
            self.path_counts[decision.path] += 1
            self._report(go, decision, extra)
            if decision.resigned and self.options.allow_resign:
                self.send("info string resign")
            if self.options.ponder:
                ponder = self._expected_reply(allie, game, fen, decision.move)
            if self.options.human_pacing and go.params.ponder is False:
                elapsed = time.monotonic() - go.start
                self._stop.wait(remaining_wait(decision.think_time_s, go.clock, elapsed))
        except Exception as exc:
            go.prior_ready.set()
            if self._current(go):
                self.send(f"info string error while thinking: {type(exc).__name__}: {exc}")
                if go.prior is not None and go.prior.move_probs:
                    bestmove = max(go.prior.move_probs, key=go.prior.move_probs.__getitem__)
                    self.send(f"info string move {bestmove} path fallback")
                    self.path_counts["fallback"] += 1
        finally:
            go.prior_ready.set()  # a forced answer waiting for the prior stops waiting
            if go.params.infinite:
                self._stop.wait()  # UCI: no bestmove before stop in infinite mode
            self._answer(go, bestmove, ponder)

    def _observe(self, go: _Go) -> None:
        """Tell the finish reserve how far past the search's deadline this move ran."""
        deadline = go.plan.search_deadline
        if deadline is not None:
            self.reserve.observe(time.monotonic() - deadline)

    def _expected_reply(self, allie: Player, game: Game, fen: str | None, move: str) -> str | None:
        """The reply the model expects (its prior's most likely move), for ``bestmove ...
        ponder``; None when the move ends the game or the clock has no time for it."""
        board = replay_board_light(game, fen)
        board.push_uci(move)
        if board.is_game_over(claim_draw=False):
            return None
        with self._model_lock:
            child = dataclasses.replace(game, moves=[*game.moves, move])
            prior = root_prior(allie, child, fen)
        return max(prior.move_probs, key=prior.move_probs.__getitem__) if prior.move_probs else None

    def _play_settings(self) -> tuple[str, dict[str, Any]]:
        """The preset and SearchConfig overrides the options ask for (warm-up and play agree)."""
        o = self.options
        preset = o.mode
        overrides: dict[str, Any] = {"temperature": o.temperature}
        if o.temperature <= 0:  # temperature 0 means argmax (SearchConfig wants T > 0)
            overrides = {"temperature": 1.0, "sampling": "argmax"}
        if preset in SEARCH_MODES:
            overrides["mean_sims"] = o.mean_sims
            overrides["max_sims"] = max(o.max_sims, o.mean_sims)
            for field in ("c_puct", "anchor_lambda", "lambda_schedule", "leaf_batch"):
                if getattr(o, field) is not None:
                    overrides[field] = getattr(o, field)
            if o.selection is not None and not preset.startswith("gumbel"):
                overrides["selection"] = o.selection  # Gumbel modes select by halving
        if preset.startswith("gumbel"):
            overrides["gumbel_c_scale"] = o.gumbel_c_scale
        return preset, overrides

    def _progress(self, go: _Go, sims: int, moves: list[str]) -> None:
        """Each chunk's best move (for a forced answer) and, twice a second, an ``info`` line."""
        import chess

        go.interim = (sims, moves[0])
        now = time.monotonic()
        if now - go.last_info >= INFO_EVERY_S:
            go.last_info = now
            elapsed = max(now - go.start, 1e-3)
            parts = [f"info depth 1 nodes {sims} nps {int(sims / elapsed)}"]
            if go.prior is not None:
                v = go.prior.value_white * (1.0 if go.pos.board.turn == chess.WHITE else -1.0)
                parts.append(f"score cp {value_to_cp(v)}")
                if self.options.show_wdl:
                    parts.append("wdl {} {} {}".format(*value_to_wdl(v)))
            parts.append(f"time {int(elapsed * 1000)} pv {moves[0]}")
            self.send(" ".join(parts))

    def _decide(
        self, allie: Player, go: _Go, game: Game, fen: str | None
    ) -> tuple[Decision, list[tuple[str, float]]]:
        from allie_jax.engine.api import temper

        o = self.options
        preset, overrides = self._play_settings()
        stop = self._stop.is_set
        if go.pondering:  # no deadline yet: ponderhit gives one, polled between chunks

            def stop() -> bool:
                d = go.plan.search_deadline
                return self._stop.is_set() or (d is not None and time.monotonic() >= d)

        clock: dict[str, Any] = {
            "deadline": go.plan.search_deadline,
            "should_stop": stop,
            "progress": lambda sims, moves: self._progress(go, sims, moves),
        }
        params = go.params
        if params.nodes is not None and params.nodes > 0 and preset in SEARCH_MODES:
            clock["budgets"] = [min(params.nodes, overrides["max_sims"])]
        rng = (o.seed * 1_000_003 + go.index) % (2**31 - 1)
        if go.pos.board.is_game_over(claim_draw=False):  # a draw by rule, with legal moves left
            decision = self._policy_move(go)
        else:
            kwargs = {"start_fens": [fen]}
            if fen is not None and not allie.reads_boards:
                kwargs["find_histories"] = False  # looked for already (``_history``)
            decision = allie.play([game], preset, rng, **kwargs, **clock, **overrides)[0]
            decision = temper(decision, o.temperature, rng)
        extra: list[tuple[str, float]] = []
        if o.multipv > 1:
            if decision.visits:
                ranked = sorted(decision.visits, key=lambda m: -decision.visits[m])
            else:
                ranked = sorted(decision.policy, key=lambda m: -decision.policy[m])
            ranked = [decision.move] + [m for m in ranked if m != decision.move]
            ranked = ranked[: o.multipv]
            # each line's score: the model's value after the move (White's view), one position
            # at a time (batch 1 is what warm-up compiled: MultiPV never waits for a compile)
            extra = [
                (
                    m,
                    root_prior(
                        allie, dataclasses.replace(game, moves=[*game.moves, m]), fen
                    ).value_white,
                )
                for m in ranked
            ]
        return decision, extra

    def _policy_move(self, go: _Go) -> Decision:
        """The game is over by rule (e.g. insufficient material) yet ``go`` asks for a move: the
        prior's most likely one, with a note instead of an error."""
        from allie_jax.engine.api import fallback_decision

        outcome = go.pos.board.outcome(claim_draw=False)
        why = outcome.termination.name.lower() if outcome else "over"
        assert go.prior is not None
        d = fallback_decision(go.prior, f"the game is over ({why}); the policy's most likely move")
        return dataclasses.replace(d, path="prior")

    def _report(self, go: _Go, d: Decision, extra: list[tuple[str, float]]) -> None:
        import chess

        board = go.pos.board
        sign = 1.0 if board.turn == chess.WHITE else -1.0
        elapsed = time.monotonic() - go.start
        nodes = max(d.sims, 1)
        ms = int(elapsed * 1000)
        nps = int(nodes / max(elapsed, 1e-3))
        if d.note and not d.note.startswith("no history for the FEN"):  # said (``_history``)
            self._say_once(d.note)
        q = d.search_value if math.isfinite(d.search_value) else sign * d.value
        lines = extra if extra else [(d.move, sign * q)]
        for i, (move, value_white) in enumerate(lines, start=1):
            v = q if i == 1 else sign * value_white
            parts = ["info depth 1"]
            if len(lines) > 1:
                parts.append(f"multipv {i}")
            after = board.copy(stack=False)
            after.push_uci(move)
            if after.is_checkmate():
                parts.append("score mate 1")
            else:
                parts.append(f"score cp {value_to_cp(v)}")
            if self.options.show_wdl:
                w, dr, lo = (1000, 0, 0) if after.is_checkmate() else value_to_wdl(v)
                parts.append(f"wdl {w} {dr} {lo}")
            count = d.visits.get(move, 0) if d.visits else 0
            shown = count if i > 1 and count else nodes
            parts.append(f"nodes {shown} nps {nps} time {ms} pv {move}")
            self.send(" ".join(parts))
        lam = d.effective_lambda
        self.send(
            f"info string move {d.move} path {d.path} think_time {d.think_time_s:.2f}s "
            f"value_white {d.value:.3f} p_best {d.policy.get(d.move, 0.0):.3f} sims {d.sims}"
            + (f" lambda {lam:.6g}" if math.isfinite(lam) else "")
            + (f" limit {go.plan.limit_s:.3f}s" if go.plan.limit_s is not None else "")
            + f" elapsed {elapsed:.3f}s"
        )


def root_prior(allie: Player, game: Game, fen: str | None) -> Prediction:
    """The player's root prior (``Player.root_prior``: cached where the family caches it)."""
    return allie.root_prior(game, fen)


def replay_board_light(game: Game, fen: str | None) -> chess.Board:
    """The board after ``game.moves`` from ``fen`` (or the start); moves are known legal."""
    import chess

    board = chess.Board(fen) if fen else chess.Board()
    for uci in game.moves:
        board.push_uci(uci)
    return board


def run_uci(
    loader: Callable[[], Player], stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """Read commands until ``quit`` or EOF; exit status 0 either way."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout

    def write(line: str) -> None:
        stdout.write(line + "\n")
        stdout.flush()

    handler = UciHandler(loader, write)
    for line in stdin:
        if not handler.handle(line):
            break
    else:
        handler.handle("quit")
    if not handler.close(timeout=5.0):
        # a worker is still inside XLA (e.g. compiling): leave without tearing down under it,
        # which would abort the process with a C++ error
        stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
