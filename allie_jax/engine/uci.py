"""A UCI engine around ``Allie``: the command handler, testable in-process, and a stdin loop.

Design choices that matter to GUIs and bots:

* ``uci`` is answered at once and the checkpoint loads in a background thread; ``isready`` waits
  for it, so a GUI never times out on ``uci`` and ``go`` never races the load. ``isready`` then
  compiles every shape the engine can meet under the current options (``Allie.warmup``; again
  after options changed), so no move waits for the compiler.
  With JAX's persistent compilation cache (``launch.uci`` turns it on) a second launch loads
  them from disk.
* ``go`` thinks in a worker thread, so ``isready`` and ``stop`` are answered while thinking.
  ``bestmove`` is sent exactly once per ``go``. The clock gives the move a limit
  (``pacing.time_budget``); the search runs in chunks and stops there with what it has, and
  ``stop`` ends it within a chunk. Should the worker still not have answered shortly after the
  limit (``pacing.answer_by``), or 50 ms after ``stop``, the engine answers a legal move itself.
* Each game gets an id (a new one at ``ucinewgame`` or when ``position`` does not continue the
  last one), so the search keeps the game's KV cache between moves and a move costs only the
  plies added since the last one.
* Allie's own rating: ``SelfElo`` if set, else ``UCI_Elo`` when ``UCI_LimitStrength`` is on
  (the UCI convention: a GUI sending every default plays as Allie-Policy does, at the
  opponent's rating), else the opponent's rating (``UCI_Opponent`` or ``OppoElo``).
* The model reads the game, not a board: ``position startpos moves ...`` is encoded as the game so
  far. ``position fen F moves ...`` has no history, so the model reads only the moves after ``F``
  (behind the usual header) while the legal moves come from ``F`` (python-chess); an
  ``info string`` warns that this is off the training distribution. Search presets need the
  standard start, so from a FEN the engine plays from the policy.
* Allie predicts a result (tanh, White's view), not draw odds: ``score cp`` maps the mover's value
  with Lc0's curve and ``wdl`` reports w = (1+v)/2, d = 0, l = (1−v)/2 per mille.
* After each searched move, the summary ``info string ... sims N lambda L`` gives the effective
  KL weight λ the played policy is optimal for (``Decision.effective_lambda``); ``GumbelCScale``
  is the Gumbel modes' knob (λ ∝ 1 / c_scale).
* Resignation is a decision, not a move: with ``AllowResign`` the engine sends
  ``info string resign`` before its ``bestmove`` (the Python API returns ``Decision.resigned``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import chess

from allie_jax import vocab
from allie_jax.engine.api import PRESETS, Allie, Decision
from allie_jax.engine.pacing import Clock, answer_by, remaining_wait, time_budget
from allie_jax.game import Game

ENGINE_NAME = "Allie (allie-jax)"
ENGINE_AUTHOR = "allie-jax authors (after Zhang et al., 2024)"
DEFAULT_ELO = 1500
STOP_ANSWER_S = 0.05  # after ``stop``, the engine answers itself if the search has not
FINISH_S = 0.03  # the search stops this long before the move's limit (its last steps, output)
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
    board: chess.Board


@dataclasses.dataclass(frozen=True)
class GoParams:
    wtime: float | None = None  # seconds
    btime: float | None = None
    winc: float = 0.0
    binc: float = 0.0
    movetime: float | None = None
    nodes: int | None = None
    infinite: bool = False

    @classmethod
    def parse(cls, tokens: list[str]) -> GoParams:
        """Parse ``go`` arguments; unknown or malformed ones are ignored (UCI asks for leniency)."""
        values: dict[str, Any] = {}
        ms_keys = {"wtime", "btime", "winc", "binc", "movetime"}
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok == "infinite":
                values["infinite"] = True
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
                    i += 1
            i += 1
        return cls(**values)

    def clock(self, white: bool) -> Clock:
        return Clock(
            time_left_s=self.wtime if white else self.btime,
            increment_s=self.winc if white else self.binc,
            movetime_s=self.movetime,
        )


class UciHandler:
    """Handles UCI command lines; ``handle`` returns False after ``quit``."""

    def __init__(
        self,
        loader: Callable[[], Allie],
        write: Callable[[str], None],
        *,
        warmup: bool = True,
    ) -> None:
        self._loader = loader
        self._write_raw = write
        self._warmup = warmup
        self._out_lock = threading.Lock()
        self._allie: Allie | None = None
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
        self._position = _Position(None, [], chess.Board())
        self._tc: str | None = None  # inferred at the first go of a game
        self._game_id = self._new_game_id()
        self._go_count = 0
        self._go_position = self._position
        self._interim: dict[int, tuple[int, str]] = {}  # go -> the search's best so far
        self.last_decision: Decision | None = None
        self.warmup_s: float | None = None  # seconds the last warm-up took (None: none ran)

    # ------------------------------------------------------------ plumbing

    def send(self, line: str) -> None:
        with self._out_lock:
            self._write_raw(line)

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

    def _ensure_warm(self, allie: Allie) -> None:
        """Compile every shape the current options can meet (once per distinct setting)."""
        preset, overrides = self._play_settings()
        key = repr((preset, sorted(overrides.items())))
        if key in self._warm or not hasattr(allie, "warmup"):
            return
        t = time.monotonic()
        with self._model_lock:
            allie.warmup(preset, 1, **overrides)
        self._warm.add(key)
        self.warmup_s = time.monotonic() - t

    def _wait_model(self) -> Allie | None:
        self._start_loading()
        assert self._load_thread is not None
        self._load_thread.join()
        return self._allie

    @property
    def thinking(self) -> bool:
        """True until this go's bestmove is sent (the worker may linger a moment after it)."""
        return self._answered_go < self._go_count

    def _answer(self, go_index: int, move: str) -> bool:
        """Send ``bestmove`` for go ``go_index`` unless it was answered already."""
        with self._answer_lock:
            if self._answered_go >= go_index:
                return False
            # answered before the line goes out: a GUI's next go may arrive the instant it does
            self._answered_go = go_index
            self.send(f"bestmove {move}")
            return True

    def _current(self, go_index: int) -> bool:
        return self._answered_go < go_index

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
        self._position = _Position(None, [], chess.Board())
        self._tc = None
        self._game_id = self._new_game_id()

    def _cmd_position(self, args: list[str]) -> None:
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
        if fen is not None and (fen != old.start_fen or not continues):
            self.send(
                "info string warning: no move history before the FEN; the model reads only the "
                "moves after it and search presets fall back to the policy"
            )
        self._position = _Position(fen, ucis, board)

    def _cmd_go(self, args: list[str]) -> None:
        t0 = time.monotonic()
        if self.thinking:
            self.send("info string already thinking; go ignored")
            return
        pos = self._position
        snapshot = _Position(pos.start_fen, list(pos.moves), pos.board.copy(stack=False))
        self._stop.clear()
        self._go_count += 1
        go_index = self._go_count
        self._go_position = snapshot
        self._interim = {}
        try:
            params = GoParams.parse(args)
            game = self._game_for(snapshot, params)  # here, not in the worker: it sets self._tc
        except Exception as exc:  # every go must get a bestmove
            legal = next(iter(snapshot.board.legal_moves), None)
            self.send(f"info string error in go: {type(exc).__name__}: {exc}")
            self._answer(go_index, legal.uci() if legal else "(none)")
            return
        clock = params.clock(snapshot.board.turn == chess.WHITE)
        self._think_thread = threading.Thread(
            target=self._think,
            args=(snapshot, game, params, go_index, t0),
            name="allie-go",
            daemon=True,
        )
        self._think_thread.start()
        self._workers = [t for t in self._workers if t.is_alive()] + [self._think_thread]
        hard = answer_by(clock) if not params.infinite else None
        if hard is not None:
            timer = threading.Timer(
                max(0.0, t0 + hard - time.monotonic()),
                self._fallback,
                args=(snapshot, go_index, "the move's time limit"),
            )
            timer.daemon = True
            timer.start()

    def _fallback(self, pos: _Position, go_index: int, why: str) -> None:
        """Answer a legal move now if the worker has not (after ``stop`` or at the hard limit)."""
        if not self._current(go_index):
            return
        legal = next(iter(pos.board.legal_moves), None)
        move = legal.uci() if legal else "(none)"
        sims, searched = self._interim.get(go_index, (0, None))
        if searched is not None and chess.Move.from_uci(searched) in pos.board.legal_moves:
            move, what = searched, f"the search's most visited move after {sims} simulations"
        else:
            what = "a legal move (no simulation finished yet)"
        if self._answered_go < go_index:
            self.send(f"info string answering at {why} with {what}")
        self._answer(go_index, move)

    def _cmd_stop(self, args: list[str]) -> None:
        self._stop_thinking()

    def _stop_thinking(self) -> None:
        """Stop the search: its bestmove comes within a chunk, else a legal move within 50 ms."""
        self._stop.set()
        thread, go_index = self._think_thread, self._go_count
        if thread is None or not self.thinking:
            return
        end = time.monotonic() + STOP_ANSWER_S
        while self.thinking and time.monotonic() < end:
            thread.join(timeout=0.005)
        if self.thinking:
            self._fallback(self._go_position, go_index, "stop")

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

    def _think(
        self, pos: _Position, game: Game, params: GoParams, go_index: int, t0: float
    ) -> None:
        bestmove = "(none)"
        try:
            legal = list(pos.board.legal_moves)
            if not legal:
                outcome = pos.board.outcome()
                why = outcome.termination.name.lower() if outcome else "no legal moves"
                self.send(f"info string the game is over ({why}): no move to play")
                return
            bestmove = legal[0].uci()  # a legal answer whatever happens below
            allie = self._wait_model()
            if allie is None:
                self.send(
                    f"info string model unavailable ({self._load_error}); playing a legal move"
                )
                return
            clock = params.clock(pos.board.turn == chess.WHITE)
            budget = None if params.infinite else time_budget(clock)
            deadline = None if budget is None else t0 + max(0.0, budget - FINISH_S)
            with self._model_lock:
                if not self._current(go_index):
                    return  # answered meanwhile (stop, time limit): nothing left to do
                decision, extra = self._decide(allie, pos, game, params, go_index, deadline)
            bestmove = decision.move
            if not self._current(go_index):
                return
            self.last_decision = decision
            self._report(pos, decision, extra, time.monotonic() - t0)
            if decision.resigned and self.options.allow_resign:
                self.send("info string resign")
            if self.options.human_pacing:
                self._stop.wait(remaining_wait(decision.think_time_s, clock, time.monotonic() - t0))
        except Exception as exc:
            if self._current(go_index):
                self.send(f"info string error while thinking: {type(exc).__name__}: {exc}")
        finally:
            if params.infinite:
                self._stop.wait()  # UCI: no bestmove before stop in infinite mode
            self._answer(go_index, bestmove)

    def _play_settings(self) -> tuple[str, dict[str, Any]]:
        """The preset and SearchConfig overrides the options ask for (warm-up and play agree)."""
        o = self.options
        preset = o.mode
        overrides: dict[str, Any] = {"temperature": o.temperature}
        if o.temperature <= 0:  # temperature 0 means argmax (SearchConfig wants T > 0)
            overrides = {"temperature": 1.0, "sampling": "argmax"}
        if preset not in ("policy", "greedy"):
            overrides["mean_sims"] = o.mean_sims
            overrides["max_sims"] = max(o.max_sims, o.mean_sims)
        if preset.startswith("gumbel"):
            overrides["gumbel_c_scale"] = o.gumbel_c_scale
        return preset, overrides

    def _decide(
        self,
        allie: Allie,
        pos: _Position,
        game: Game,
        params: GoParams,
        go_index: int,
        deadline: float | None = None,
    ) -> tuple[Decision, list[tuple[str, float]]]:
        o = self.options
        preset, overrides = self._play_settings()
        clock: dict[str, Any] = {
            "deadline": deadline,
            "should_stop": self._stop.is_set,
            "progress": lambda sims, moves: self._interim.__setitem__(go_index, (sims, moves[0])),
        }
        if params.nodes is not None and params.nodes > 0 and preset not in ("policy", "greedy"):
            clock["budgets"] = [min(params.nodes, overrides["max_sims"])]
        rng = (o.seed * 1_000_003 + go_index) % (2**31 - 1)
        fens = [pos.start_fen]
        if pos.board.is_game_over(claim_draw=False):  # a draw by rule, with legal moves left
            decision = self._policy_move(allie, pos, game)
        else:
            decision = allie.play([game], preset, rng, start_fens=fens, **clock, **overrides)[0]
        extra: list[tuple[str, float]] = []
        if o.multipv > 1:
            ranked = sorted(decision.policy.items(), key=lambda kv: -kv[1])[: o.multipv]
            children = [dataclasses.replace(game, moves=game.moves + [m]) for m, _ in ranked]
            # each child is scored by the model's value after the move (White's view), one at
            # a time: batch 1 is what warm-up compiled, so MultiPV never waits for a compile
            preds = [allie.predict([c], start_fens=fens)[0] for c in children]
            extra = [(m, p.value_white) for (m, _), p in zip(ranked, preds, strict=True)]
        return decision, extra

    def _policy_move(self, allie: Allie, pos: _Position, game: Game) -> Decision:
        """The game is over by rule (e.g. insufficient material) yet ``go`` asks for a move: the
        policy's most likely one, with a note instead of an error."""
        outcome = pos.board.outcome(claim_draw=False)
        why = outcome.termination.name.lower() if outcome else "over"
        pred = allie.predict([game], start_fens=[pos.start_fen])[0]
        move = max(pred.move_probs, key=pred.move_probs.get)
        return Decision(
            move=move,
            think_time_s=pred.think_time_s,
            value=pred.value_white,
            resigned=False,
            sims=0,
            policy=pred.move_probs,
            note=f"the game is over ({why}); the policy's most likely move",
        )

    def _report(
        self, pos: _Position, d: Decision, extra: list[tuple[str, float]], elapsed: float
    ) -> None:
        sign = 1.0 if pos.board.turn == chess.WHITE else -1.0
        nodes = max(d.sims, 1)
        ms = int(elapsed * 1000)
        if d.note:
            self.send(f"info string {d.note}")
        lines = extra if extra else [(d.move, d.value)]
        if extra and extra[0][0] != d.move:  # keep the played move first
            lines = [(d.move, d.value)] + [e for e in extra if e[0] != d.move]
            lines = lines[: len(extra)]
        for i, (move, value_white) in enumerate(lines, start=1):
            v = sign * value_white
            parts = ["info depth 1"]
            if len(lines) > 1:
                parts.append(f"multipv {i}")
            parts.append(f"score cp {value_to_cp(v)}")
            if self.options.show_wdl:
                w, dr, lo = value_to_wdl(v)
                parts.append(f"wdl {w} {dr} {lo}")
            parts.append(f"nodes {nodes} time {ms} pv {move}")
            self.send(" ".join(parts))
        lam = getattr(d, "effective_lambda", math.nan)
        self.send(
            f"info string think_time {d.think_time_s:.2f}s value_white {d.value:.3f} "
            f"p_best {d.policy.get(d.move, 0.0):.3f} sims {d.sims}"
            + (f" lambda {lam:.6g}" if math.isfinite(lam) else "")
        )


def run_uci(
    loader: Callable[[], Allie], stdin: TextIO | None = None, stdout: TextIO | None = None
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
