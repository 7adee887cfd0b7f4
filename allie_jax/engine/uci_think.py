"""The UCI engine's thinking half: the model (loaded in the background, compiled ahead at
``isready``), the ``go`` worker, and the single ``bestmove`` each ``go`` gets.

``engine/uci.py``'s ``UciHandler`` is a ``Thinker`` that reads commands. Design choices that
matter to GUIs and bots:

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
* A game from a FEN is played from a history reaching it exactly (``engine.fen_history``,
  searched in the background from ``position`` on) when the player reads games; without one,
  the position goes to the board-reading model the user configured (``Player.fen_model``), else
  the move is the fallback; an ``info string`` says which, once per game.
* ``Temperature`` applies to every move: to the prior of budget-0 moves (the preset's rule) and
  to the search's final policy (``api.temper``; 0 plays its most likely move).
* ``go ponder``: the engine searches the position (with the expected reply already on the
  board) without a clock; ``ponderhit`` starts the clock for that move (the search continues
  under its deadline), ``stop`` answers at once.
* Resignation is a decision, not a move: with ``AllowResign`` the engine sends
  ``info string resign`` before its ``bestmove`` (the Python API returns ``Decision.resigned``).

Standard library and light modules only at import (see ``engine/uci.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from allie_jax.engine import uci_report
from allie_jax.engine.pacing import remaining_wait
from allie_jax.engine.time_manager import Clock, FinishReserve, MovePlan
from allie_jax.engine.uci_options import Options, play_settings
from allie_jax.engine.uci_position import Position, replay_board_light
from allie_jax.modes import SEARCH_MODES

if TYPE_CHECKING:
    from allie_jax.engine.uci_go import GoParams
    from allie_jax.game import Game
    from allie_jax.player import Decision, Player, Prediction

STOP_ANSWER_S = 0.05  # after ``stop``, the engine answers itself if the search has not
INFO_EVERY_S = 0.5  # periodic info lines while searching


@dataclasses.dataclass
class Go:
    """One ``go``: what it plays on, its clock, and what a forced answer can play."""

    index: int
    pos: Position
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


def root_prior(allie: Player, game: Game, fen: str | None) -> Prediction:
    """The player's root prior (``Player.root_prior``: cached where the family caches it)."""
    return allie.root_prior(game, fen)


class Thinker:
    """The model, the ``go`` worker and the answers (see the module docstring)."""

    _game_id: str  # the game being played (set and renewed by the command handler)

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
        self._go_count = 0
        self._go: Go | None = None
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

    # ------------------------------------------------------------ the model

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
        preset, overrides = play_settings(self.options)
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

    # ------------------------------------------------------------ answers

    @property
    def thinking(self) -> bool:
        """True until this go's bestmove is sent (the worker may linger a moment after it)."""
        return self._answered_go < self._go_count

    def _answer(self, go: Go, move: str, ponder: str | None = None) -> bool:
        """Send ``bestmove`` for ``go`` unless it was answered already."""
        with self._answer_lock:
            if self._answered_go >= go.index:
                return False
            # answered before the line goes out: a GUI's next go may arrive the instant it does
            self._answered_go = go.index
            self.send(f"bestmove {move}" + (f" ponder {ponder}" if ponder else ""))
            return True

    def _current(self, go: Go) -> bool:
        return self._answered_go < go.index

    def _start_thinking(self, go: Go) -> None:
        """Run ``go`` in a worker thread, with the fallback armed at its limit."""
        self._go = go
        self._think_thread = threading.Thread(
            target=self._think, args=(go,), name="allie-go", daemon=True
        )
        self._think_thread.start()
        self._workers = [t for t in self._workers if t.is_alive()] + [self._think_thread]
        self._arm(go)

    def _arm(self, go: Go) -> None:
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

    def _fallback(self, go: Go, why: str) -> None:
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

    # ------------------------------------------------------------ thinking

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

    def _history(self, allie: Player, go: Go) -> tuple[Game, str | None, str]:
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

    def _think(self, go: Go) -> None:
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

    def _observe(self, go: Go) -> None:
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

    def _progress(self, go: Go, sims: int, moves: list[str]) -> None:
        """Each chunk's best move (for a forced answer) and, twice a second, an ``info`` line."""
        import chess

        go.interim = (sims, moves[0])
        now = time.monotonic()
        if now - go.last_info >= INFO_EVERY_S:
            go.last_info = now
            value = None
            if go.prior is not None:
                sign = 1.0 if go.pos.board.turn == chess.WHITE else -1.0
                value = go.prior.value_white * sign
            elapsed = max(now - go.start, 1e-3)
            line = uci_report.progress_line(sims, moves[0], elapsed, value, self.options.show_wdl)
            self.send(line)

    def _decide(
        self, allie: Player, go: Go, game: Game, fen: str | None
    ) -> tuple[Decision, list[tuple[str, float]]]:
        from allie_jax.engine.api import temper

        o = self.options
        preset, overrides = play_settings(o)
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
            ranked = uci_report.multipv_moves(decision, o.multipv)
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

    def _policy_move(self, go: Go) -> Decision:
        """The game is over by rule (e.g. insufficient material) yet ``go`` asks for a move: the
        prior's most likely one, with a note instead of an error."""
        from allie_jax.engine.api import fallback_decision

        outcome = go.pos.board.outcome(claim_draw=False)
        why = outcome.termination.name.lower() if outcome else "over"
        assert go.prior is not None
        d = fallback_decision(go.prior, f"the game is over ({why}); the policy's most likely move")
        return dataclasses.replace(d, path="prior")

    def _report(self, go: Go, d: Decision, extra: list[tuple[str, float]]) -> None:
        elapsed = time.monotonic() - go.start
        if d.note and not d.note.startswith("no history for the FEN"):  # said (``_history``)
            self._say_once(d.note)
        show_wdl = self.options.show_wdl
        for line in uci_report.decision_lines(
            go.pos.board, d, extra, elapsed, show_wdl, go.plan.limit_s
        ):
            self.send(line)
