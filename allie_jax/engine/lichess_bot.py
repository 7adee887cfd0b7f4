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
(``load_allie``: ``Allie.warmup``, the fixed shapes the UCI engine compiles), with JAX's
persistent compilation cache on. Every move gets the clock's budget (``pacing.time_budget``)
less a move overhead (the network round trip to lichess, which the bot's clock pays too) as the
search's deadline, and the lichess game id, so the search keeps what it read of the game between
moves. The move is answered by ``pacing.answer_by`` (less the same overhead) whatever the search
is doing: if it has not finished (a stalled host, a compile) or failed, the answer is the
model's own prior, its most probable legal move from one forward pass computed before the search
(never an arbitrary legal move).
"""

from __future__ import annotations

import datetime
import functools
import os
import threading
import time
from typing import Any

import chess
import chess.engine

from allie_jax import vocab
from allie_jax.engine.api import PRESETS, Allie
from allie_jax.engine.pacing import Clock, answer_by, remaining_wait, time_budget
from allie_jax.game import Game

DEFAULT_ELO = 1500
MOVE_OVERHEAD_S = 0.3  # the network round trip to lichess, taken off every move's budget
_PLAY_LOCKS: dict[int, threading.Lock] = {}  # one search at a time per Allie (shared by games)


def _play_lock(allie: Any) -> threading.Lock:
    return _PLAY_LOCKS.setdefault(id(allie), threading.Lock())


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
    ``allow_resign``, ``seed``, ``move_overhead_ms`` (taken off every move's budget; default
    300).
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
        self.overhead_s = float(o.get("move_overhead_ms", 1000 * MOVE_OVERHEAD_S)) / 1000
        if not self.overhead_s >= 0:
            raise ValueError(f"homemade option move_overhead_ms={self.overhead_s * 1000}: < 0")
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
        """The move for ``board`` under ``time_limit``; ``info["string"]`` names the path that
        decided it: ``search`` (the preset, cut at its deadline if need be) or ``prior`` (the
        model's most probable legal move, when the search missed the hard limit or failed)."""
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
        budget, hard = time_budget(clock), answer_by(clock)
        deadline = None if budget is None else t0 + max(0.0, budget - self.overhead_s)
        hard_at = None if hard is None else t0 + max(0.0, hard - self.overhead_s)
        seed = self.seed * 1_000_003 + self._moves
        prior = None
        if hard_at is not None:  # the answer if the search cannot make the hard limit
            prior = self.allie.predict([g], start_fens=[fen])[0]
        d, path, why = self._search(g, fen, seed, deadline, hard_at)
        if d is None:
            if prior is None:  # no clock, and the search failed: the prior, late but chosen
                prior = self.allie.predict([g], start_fens=[fen])[0]
            move = max(prior.move_probs.items(), key=lambda kv: kv[1])[0]
            value_white, think_s, sims, resigned = prior.value_white, prior.think_time_s, 0, False
        else:
            move, value_white, think_s = d.move, d.value, d.think_time_s
            sims, resigned = d.sims, d.resigned
            why = d.note
        if self.human_pacing and not resigned:
            budget_left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = remaining_wait(think_s, clock, time.monotonic() - t0)
            time.sleep(wait if budget_left is None else min(wait, budget_left))
        value_stm = value_white if board.turn == chess.WHITE else -value_white
        info = {
            "score": chess.engine.PovScore(
                chess.engine.Cp(int(round(1000 * value_stm))), board.turn
            ),
            "nodes": sims,
            "string": f"think {think_s:.1f}s; decided by {path}" + (f" ({why})" if why else ""),
        }
        return chess.engine.PlayResult(
            chess.Move.from_uci(move),
            None,
            info=info,
            resigned=bool(resigned and self.allow_resign),
        )

    def _search(
        self,
        g: Game,
        fen: str | None,
        seed: int,
        deadline: float | None,
        hard_at: float | None,
    ) -> tuple[Any, str, str]:
        """``Allie.play`` in a worker, waited for until ``hard_at``: (decision or None, path,
        why). A worker past the hard limit finishes in the background (its search stops at its
        deadline); the next move's search waits for it (one search per Allie at a time)."""
        box: dict[str, Any] = {}
        lock = _play_lock(self.allie)

        def work() -> None:
            try:
                with lock:
                    box["d"] = self.allie.play(
                        [g], self.mode, seed, start_fens=[fen], deadline=deadline
                    )[0]
            except Exception as exc:  # the move must still be answered
                box["error"] = f"{type(exc).__name__}: {exc}"

        # not a daemon: a process exiting while the worker is inside XLA (a late compile) would
        # abort; the search itself stops at its deadline
        worker = threading.Thread(target=work, daemon=False)
        worker.start()
        worker.join(None if hard_at is None else max(0.0, hard_at - time.monotonic()))
        if "d" in box:
            return box["d"], "search", ""
        if "error" in box:
            return None, "prior", f"the search failed: {box['error']}"
        return None, "prior", "the search missed the move's hard limit"


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
