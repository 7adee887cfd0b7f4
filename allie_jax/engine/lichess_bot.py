"""A lichess-bot ``homemade`` engine: Allie in-process, no UCI pipe (see docs/lichess-bot.md).

lichess-bot imports the class named in ``engine.name`` from its ``homemade.py``; that file only
needs ``from allie_jax.engine.lichess_bot import AllieEngine``. The Python API gives the bot what
UCI cannot: the resignation flag (``PlayResult.resigned``) and the opponent's rating and the time
control straight from lichess-bot's game object.

``AllieBot`` holds the logic and does not import lichess-bot, so it is tested without it;
``AllieEngine`` (defined only when lichess-bot's ``lib.engine_wrapper`` is importable) is the thin
``MinimalEngine`` subclass lichess-bot instantiates. lichess-bot's constructor signature changes
(December 2025 added ``debug``), so ``AllieEngine`` passes whatever it is given to
``MinimalEngine`` and only picks out the game; the UCI route (docs/lichess-bot.md) does not depend
on lichess-bot's Python internals at all and is the stable one.

lichess-bot builds an engine per game: the model is loaded and compiled once per process
(``load_allie``), with JAX's persistent compilation cache on, and every move gets the clock's
deadline, as the UCI engine's do.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
from typing import Any

import chess
import chess.engine

from allie_jax import vocab
from allie_jax.engine.api import PRESETS, Allie
from allie_jax.engine.pacing import Clock, remaining_wait, time_budget
from allie_jax.game import Game

DEFAULT_ELO = 1500


@functools.cache
def load_allie(checkpoint: str, mode: str) -> Allie:
    """One loaded, compiled Allie per (checkpoint, mode) in this process, shared by all games."""
    from allie_jax.engine.compile_cache import enable_compilation_cache

    try:
        enable_compilation_cache()
    except OSError:  # compiling without a persistent cache still plays
        pass
    allie = Allie.load(checkpoint)
    allie.warmup(mode, 1)
    return allie


def _seconds(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, datetime.timedelta):
        return x.total_seconds()
    return float(x)


class AllieBot:
    """Chooses a move for a lichess-bot game from its board, time limit and game object.

    ``options`` (from ``homemade_options`` in config.yml): ``checkpoint`` (or env
    ``ALLIE_CHECKPOINT``), ``mode`` (policy/greedy/search/adaptive), ``self_elo`` (0 = the
    opponent's rating), ``human_pacing`` (wait the predicted think time, within the clock),
    ``allow_resign``, ``seed``.
    """

    def __init__(self, options: dict[str, Any] | None = None, allie: Allie | None = None):
        o = dict(options or {})
        self.mode = str(o.get("mode", "adaptive"))
        if self.mode not in PRESETS:
            raise ValueError(f"homemade option mode={self.mode!r}: expected one of {PRESETS}")
        self.self_elo = int(o.get("self_elo", 0))
        self.human_pacing = bool(o.get("human_pacing", True))
        self.allow_resign = bool(o.get("allow_resign", True))
        self.seed = int(o.get("seed", 0))
        checkpoint = o.get("checkpoint") or os.environ.get("ALLIE_CHECKPOINT")
        if allie is None:
            if not checkpoint:
                raise ValueError("set homemade_options.checkpoint or ALLIE_CHECKPOINT")
            allie = load_allie(str(checkpoint), self.mode)
        self.allie = allie
        self._moves = 0

    def game_for(self, board: chess.Board, game: Any = None) -> tuple[Game, str | None]:
        """The Allie game (header from lichess-bot's game object) and its start FEN, if any."""
        root = board.root()
        start_fen = None if root.fen() == chess.STARTING_FEN else root.fen()
        opponent = getattr(getattr(game, "opponent", None), "rating", None) or DEFAULT_ELO
        opponent = int(min(max(int(opponent), vocab.MIN_ELO), vocab.MAX_ELO))
        me = self.self_elo or opponent
        white = board.turn == chess.WHITE
        tc = None
        initial = _seconds(getattr(game, "clock_initial", None))
        if initial is not None and initial < 10 * 365 * 86400:
            inc = _seconds(getattr(game, "clock_increment", 0)) or 0.0
            tc = f"{int(round(initial))}+{int(round(inc))}"
        return (
            Game(
                moves=[m.uci() for m in board.move_stack],
                white_elo=me if white else opponent,
                black_elo=opponent if white else me,
                time_control=tc,
                game_id=str(getattr(game, "id", "")),
            ),
            start_fen,
        )

    def choose(
        self, board: chess.Board, time_limit: chess.engine.Limit | None = None, game: Any = None
    ) -> chess.engine.PlayResult:
        t0 = time.monotonic()
        g, fen = self.game_for(board, game)
        self._moves += 1
        clock = Clock()
        if time_limit is not None:
            white = board.turn == chess.WHITE
            clock = Clock(
                time_left_s=_seconds(time_limit.white_clock if white else time_limit.black_clock),
                increment_s=_seconds(time_limit.white_inc if white else time_limit.black_inc)
                or 0.0,
                movetime_s=_seconds(time_limit.time),
            )
        budget = time_budget(clock)
        deadline = None if budget is None else t0 + budget
        seed = self.seed * 1_000_003 + self._moves
        d = self.allie.play([g], self.mode, seed, start_fens=[fen], deadline=deadline)[0]
        if self.human_pacing:
            time.sleep(remaining_wait(d.think_time_s, clock, time.monotonic() - t0))
        value_stm = d.value if board.turn == chess.WHITE else -d.value
        info = {
            "score": chess.engine.PovScore(
                chess.engine.Cp(int(round(1000 * value_stm))), board.turn
            ),
            "nodes": d.sims,
            "string": f"think {d.think_time_s:.1f}s",
        }
        return chess.engine.PlayResult(
            chess.Move.from_uci(d.move),
            None,
            info=info,
            resigned=bool(d.resigned and self.allow_resign),
        )


try:  # lichess-bot present: the class its homemade.py imports
    from lib.engine_wrapper import MinimalEngine  # type: ignore[import-not-found]
except ImportError:  # not running inside lichess-bot
    MinimalEngine = None

if MinimalEngine is not None:

    class AllieEngine(MinimalEngine):  # type: ignore[misc, valid-type]
        """lichess-bot homemade engine; options come from ``homemade_options`` in config.yml."""

        def __init__(self, commands, options, stderr, draw_or_resign, *args, **kwargs):
            # lichess-bot passes (..., game, debug, **popen_args) since December 2025 and
            # (..., game, **popen_args) before: hand everything on, keep only the game
            super().__init__(commands, options, stderr, draw_or_resign, *args, **kwargs)
            self.bot = AllieBot(dict(options or {}))
            self.game = args[0] if args else kwargs.get("game")

        def search(self, board, time_limit, ponder, draw_offered, root_moves):
            return self.bot.choose(board, time_limit, self.game)
