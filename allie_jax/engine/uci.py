"""A UCI engine around a ``player.Player``: the command handler, testable in-process, and a
stdin loop.

The engine is split so each file has one job: this module reads commands (``UciHandler``) and runs
the loop (``run_uci``); ``uci_options`` holds the option table and what the options ask of a
move (the preset, Allie's rating); ``uci_go`` parses ``go`` and infers the time control;
``uci_position`` reads ``position``; ``uci_think`` is the model and the ``go`` worker (answers,
the fallback, pondering, FEN histories); ``uci_report`` writes the ``info`` lines. The names
callers import from here (``UciHandler``, ``OPTIONS``, ``GoParams``, ``value_to_cp``, ...) stay
importable from this module.

* ``uci`` is answered at once: no module of the engine imports JAX, numpy or python-chess at
  import, and the loader (which imports the model code and reads the checkpoint) runs in a
  background thread started by ``uci``; ``isready`` waits for it and then compiles every shape
  the engine can meet under the current options (``Player.warmup``; again after options
  changed), so no move waits for the compiler.
* The model reads the game, not a board: ``position startpos moves ...`` is the game so far,
  ``position fen F moves ...`` gets a history searched in the background from ``position`` on
  (``uci_think`` says what plays when none is found).
* Each game gets an id (a new one at ``ucinewgame`` or when ``position`` does not continue the
  last one), so the search keeps the game's KV cache between moves and a move costs only the
  plies added since the last one.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

# Only the standard library and light modules of this package at import: ``uciok`` goes out
# before python-chess, numpy or JAX load (each function imports python-chess where it needs it).
from allie_jax import vocab
from allie_jax.engine.time_manager import MovePlan
from allie_jax.engine.uci_go import GoParams, infer_time_control
from allie_jax.engine.uci_options import (
    DEFAULT_ELO,
    LAMBDA_SCHEDULES,
    OPTIONS,
    PRESETS,
    SELECTIONS,
    Options,
    opponent_elo,
    option_key,
    own_elo,
    parse_opponent,
)
from allie_jax.engine.uci_position import (
    Position,
    PositionError,
    parse_position,
    replay_board_light,
)
from allie_jax.engine.uci_report import value_to_cp, value_to_wdl
from allie_jax.engine.uci_think import INFO_EVERY_S, STOP_ANSWER_S, Go, Thinker, root_prior

if TYPE_CHECKING:
    from allie_jax.game import Game
    from allie_jax.player import Player

__all__ = [
    "DEFAULT_ELO",
    "ENGINE_AUTHOR",
    "ENGINE_NAME",
    "INFO_EVERY_S",
    "LAMBDA_SCHEDULES",
    "OPTIONS",
    "PRESETS",
    "SELECTIONS",
    "STOP_ANSWER_S",
    "GoParams",
    "Options",
    "UciHandler",
    "infer_time_control",
    "parse_opponent",
    "replay_board_light",
    "root_prior",
    "run_uci",
    "value_to_cp",
    "value_to_wdl",
]

ENGINE_NAME = "Allie (allie-jax)"
ENGINE_AUTHOR = "allie-jax authors (after Zhang et al., 2024)"
_GAME_IDS = itertools.count(1)


class UciHandler(Thinker):
    """Handles UCI command lines; ``handle`` returns False after ``quit``."""

    def __init__(
        self,
        loader: Callable[[], Player],
        write: Callable[[str], None],
        *,
        warmup: bool = True,
    ) -> None:
        super().__init__(loader, write, warmup=warmup)
        self._position = Position(None, [])
        self._tc: str | None = None  # inferred at the first go of a game
        self._game_id = self._new_game_id()

    @staticmethod
    def _new_game_id() -> str:
        return f"uci-{os.getpid()}-{next(_GAME_IDS)}"

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
        key = option_key(name)
        if key is None:
            self.send(f"info string unknown option {name!r}")
            return
        try:
            OPTIONS[key][1](self.options, value)
        except (ValueError, OverflowError) as exc:
            self.send(f"info string bad value for {key}: {exc}")

    def _cmd_ucinewgame(self, args: list[str]) -> None:
        self._position = Position(None, [])
        self._tc = None
        self._game_id = self._new_game_id()

    def _cmd_position(self, args: list[str]) -> None:
        try:
            pos = parse_position(args)
        except PositionError as exc:
            self.send(f"info string {exc}")
            return
        if not self._position.continued_by(pos):
            self._tc = None  # a different game: re-infer its time control at the next go
            self._game_id = self._new_game_id()
        if pos.start_fen is not None:
            self._search_history(pos.start_fen)
        self._position = pos

    def _cmd_go(self, args: list[str]) -> None:
        import chess

        t0 = time.monotonic()
        if self.thinking:
            self.send("info string already thinking; go ignored")
            return
        pos = self._position
        snapshot = Position(pos.start_fen, list(pos.moves), pos.board.copy(stack=False))
        self._stop.clear()
        self._go_count += 1
        params = GoParams.parse(args)
        overhead = self.options.move_overhead_ms / 1000.0
        clock = params.clock(snapshot.board.turn == chess.WHITE, overhead)
        game = self._game_for(snapshot, params)  # here, not in the worker: it sets self._tc
        unbounded = params.infinite or params.ponder
        plan = MovePlan.make(t0, None if unbounded else clock, self.reserve.seconds)
        self._start_thinking(
            Go(self._go_count, snapshot, game, params, t0, clock, plan, params.ponder)
        )

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

    def _cmd_stop(self, args: list[str]) -> None:
        self._stop_thinking()

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

    # ------------------------------------------------------------ the game's header

    def own_elo(self) -> tuple[int, str]:
        """Allie's rating token and where it comes from (``uci_options.own_elo``)."""
        return own_elo(self.options)

    def _elos(self, white_to_move: bool) -> tuple[int, int]:
        me, oppo = own_elo(self.options)[0], opponent_elo(self.options)
        return (me, oppo) if white_to_move else (oppo, me)

    def _game_for(self, pos: Position, params: GoParams) -> Game:
        import chess

        from allie_jax.game import Game

        white = pos.board.turn == chess.WHITE
        if self.options.time_control:
            tc = vocab.normalize_time_control(self.options.time_control)
        else:
            if self._tc is None:
                self._tc = params.time_control(white)
            tc = self._tc
        we, be = self._elos(white)
        return Game(
            moves=list(pos.moves),
            white_elo=we,
            black_elo=be,
            time_control=tc,
            game_id=self._game_id,
        )


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
