"""One human-vs-Allie game in the browser or a notebook: settings, board, clocks, and the PGN.

python-chess holds the authoritative board: every move the page sends is parsed and checked
against its legal moves here, whatever the page itself allowed. The engine's own moves come from
``Allie.play`` with the game's two ratings in the headers (the engine's for its side, the
human's for theirs), exactly as in matches and the UCI engine, and with the clock's budget
(``pacing.time_budget``) as the search's deadline. Clocks run on the server
(``time.monotonic``), so a slow page or a paused tab cannot stop them; they stand still while
the session is ``preparing`` (the engine compiling its shapes), which is never Allie's time.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import chess
import chess.pgn

from allie_jax.engine.pacing import Clock, remaining_wait, time_budget
from allie_jax.game import Game
from allie_jax.modes import MODES

MIN_ELO, MAX_ELO = 500, 3000  # the model's rating range (SPEC: Elo is clamped to it)
MAX_BASE_S = 3 * 3600.0
MAX_INCREMENT_S = 180.0
TOP_MOVES = 3
# The engine accepts a draw offer when its model's value for its own side is at most this: it
# agrees when it does not think it stands better, as a human club player would.
DRAW_ACCEPT_VALUE = 0.0

# ``play(game, mode, budget_s) -> Decision``: budget_s is how long the move may take from now
# (None: no clock); ``allie_player`` turns it into ``Allie.play``'s deadline.
PlayFn = Callable[[Game, str, float | None], Any]


class RequestError(Exception):
    """A request the server refuses; ``status`` is the HTTP code (4xx), the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class GameSettings:
    """What the page chose. ``base_s = 0`` plays without clocks."""

    human_colour: str = "white"
    engine_elo: int = 1500
    human_elo: int = 1500
    mode: str = "adaptive"
    base_s: float = 300.0
    increment_s: float = 3.0
    human_pacing: bool = False

    @property
    def time_control(self) -> str | None:
        """The PGN / model header ("300+3"); None without clocks."""
        return f"{self.base_s:g}+{self.increment_s:g}" if self.base_s > 0 else None

    @classmethod
    def from_request(cls, data: Any, rng: Callable[[], bool] | None = None) -> GameSettings:
        """Validated settings from a JSON body; unknown or wrong fields are a 400 naming them."""
        if not isinstance(data, Mapping):
            raise RequestError(400, "the body must be a JSON object of game settings")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise RequestError(400, f"unknown setting(s) {unknown}; known: {sorted(fields)}")
        values = dict(data)
        colour = values.get("human_colour", "white")
        if colour == "random":
            colour = "white" if (rng or (lambda: secrets.randbits(1) == 1))() else "black"
        if colour not in ("white", "black"):
            raise RequestError(400, f"human_colour {colour!r}: expected white, black or random")
        values["human_colour"] = colour
        for name in ("engine_elo", "human_elo"):
            if name in values:
                v = values[name]
                if isinstance(v, bool) or not isinstance(v, int) or not MIN_ELO <= v <= MAX_ELO:
                    raise RequestError(
                        400, f"{name} {v!r}: expected an integer in [{MIN_ELO}, {MAX_ELO}]"
                    )
        if values.get("mode", "adaptive") not in MODES:
            raise RequestError(400, f"mode {values['mode']!r}: expected one of {list(MODES)}")
        for name, top in (("base_s", MAX_BASE_S), ("increment_s", MAX_INCREMENT_S)):
            if name in values:
                v = values[name]
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= top:
                    raise RequestError(400, f"{name} {v!r}: expected seconds in [0, {top:g}]")
                values[name] = float(v)
        if "human_pacing" in values and not isinstance(values["human_pacing"], bool):
            raise RequestError(400, f"human_pacing {values['human_pacing']!r}: expected a boolean")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class EngineMove:
    """What the page shows under the board after each engine move."""

    uci: str
    san: str
    predicted_think_s: float  # the model's think-time prediction for this move
    spent_s: float  # wall time the engine's clock was charged (from the start of its turn)
    value_white: float  # the model's value of the position before its move, White's view
    sims: int
    top_moves: list[tuple[str, float]]  # (SAN, probability) of the engine's final policy
    note: str = ""
    top_uci: list[tuple[str, float]] = dataclasses.field(default_factory=list)  # for arrows
    # the clock time this move was allowed, from the start of its turn (None: no clock): what
    # had already run when the engine was asked, plus ``time_budget`` of the clock then
    budget_s: float | None = None


class GameSession:
    """One game's state. Methods are thread-safe (one lock per game)."""

    def __init__(
        self,
        settings: GameSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        preparing: bool = False,
    ) -> None:
        self.id = secrets.token_urlsafe(9)
        self.settings = settings
        self.board = chess.Board()
        self.engine_moves: dict[int, EngineMove] = {}  # ply -> what the engine showed
        self.result: str | None = None
        self.termination = ""
        self.started = datetime.datetime.now(datetime.UTC)
        self._now = clock
        self._sleep = sleep
        start = settings.base_s if settings.base_s > 0 else None
        self._left: dict[bool, float | None] = {chess.WHITE: start, chess.BLACK: start}
        self._clocks_after: list[float | None] = []  # mover's clock after each ply (PGN %clk)
        self._turn_started = clock()
        self._lock = threading.Lock()
        self._thinking = False
        self.preparing = preparing  # the engine compiles; clocks stand still, no move is taken
        self.notice = ""  # the last event the page should show (a declined draw, a takeback)
        self._draw_offered_at: int | None = None  # ply of the human's last draw offer
        self.rematch_id: str | None = None
        self.last_seen = clock()

    # ------------------------------------------------------------------ whose turn, clocks
    @property
    def human_colour(self) -> chess.Color:
        return chess.WHITE if self.settings.human_colour == "white" else chess.BLACK

    @property
    def engine_to_move(self) -> bool:
        return self.result is None and self.board.turn != self.human_colour

    @property
    def thinking(self) -> bool:
        return self._thinking

    def time_left(self, colour: chess.Color) -> float | None:
        """Seconds on ``colour``'s clock now (the mover's clock runs unless preparing)."""
        left = self._left[colour]
        if left is None:
            return None
        if self.result is None and not self.preparing and self.board.turn == colour:
            left -= self._now() - self._turn_started
        return max(0.0, left)

    def ready(self) -> None:
        """The engine has compiled: the clocks start now."""
        with self._lock:
            if self.preparing:
                self.preparing = False
                self._turn_started = self._now()

    def _time_forfeit(self, mover: chess.Color) -> None:
        """``mover``'s flag fell: a loss, or a draw when the opponent cannot mate (FIDE 6.9)."""
        self._left[mover] = 0.0
        if self.board.has_insufficient_material(not mover):
            self._finish("1/2-1/2", "Time forfeit (draw: no mating material against the flag)")
        else:
            self._finish("0-1" if mover == chess.WHITE else "1-0", "Time forfeit")

    def _flag_check(self) -> None:
        """End the game if the side to move has run out of time."""
        mover = self.board.turn
        if self.result is None and self.time_left(mover) == 0.0:
            self._time_forfeit(mover)

    def _charge_and_push(self, move: chess.Move) -> float:
        """Stop the mover's clock (adding the increment), play ``move``; the seconds spent."""
        mover = self.board.turn
        spent = self._now() - self._turn_started
        left = self._left[mover]
        if left is not None:
            left = max(0.0, left - spent)
            if left == 0.0:
                self._time_forfeit(mover)
                return spent
            left += self.settings.increment_s
            self._left[mover] = left
        self.board.push(move)
        self._clocks_after.append(left)
        self._turn_started = self._now()
        self.notice = ""
        if self.board.is_game_over(claim_draw=True):
            outcome = self.board.outcome(claim_draw=True)
            assert outcome is not None
            self._finish(outcome.result(), outcome.termination.name.replace("_", " ").lower())
        return spent

    def _finish(self, result: str, termination: str) -> None:
        self.result, self.termination = result, termination

    def _check_open(self) -> None:
        self._flag_check()
        if self.result is not None:
            raise RequestError(409, f"the game is over ({self.result}, {self.termination})")
        if self.preparing:
            raise RequestError(
                409, "Allie is preparing (compiling once, off the clock): try again when ready"
            )

    # ------------------------------------------------------------------ moves
    def human_move(self, uci: Any) -> None:
        """Play the human's move after checking it with python-chess (400 / 409 on refusal)."""
        with self._lock:
            self.last_seen = self._now()
            self._check_open()
            if self.board.turn != self.human_colour:
                raise RequestError(409, "it is the engine's turn")
            if not isinstance(uci, str):
                raise RequestError(400, f"move {uci!r}: expected a UCI string such as 'e2e4'")
            try:
                move = chess.Move.from_uci(uci)
            except ValueError:
                raise RequestError(400, f"move {uci!r} is not UCI (e.g. 'e2e4', 'e7e8q')") from None
            if move not in self.board.legal_moves:
                hint = ""
                if chess.Move(move.from_square, move.to_square, chess.QUEEN) in (
                    self.board.legal_moves
                ):
                    hint = " (a promotion needs its piece, e.g. 'e7e8q')"
                raise RequestError(400, f"move {uci!r} is illegal in {self.board.fen()}{hint}")
            self._charge_and_push(move)

    def _game(self) -> Game:
        """The game as the model reads it; ``game_id`` keys the Searcher's cache across moves
        (it checks the prefix token by token, so a takeback only re-reads the changed plies)."""
        s = self.settings
        engine_white = self.human_colour == chess.BLACK
        return Game(
            moves=[m.uci() for m in self.board.move_stack],
            white_elo=s.engine_elo if engine_white else s.human_elo,
            black_elo=s.human_elo if engine_white else s.engine_elo,
            time_control=s.time_control,
            game_id=f"web-{self.id}",
        )

    def engine_move(self, play: PlayFn) -> EngineMove | None:
        """Ask ``play(game, mode, budget_s) -> Decision`` for the engine's move and play it.

        ``budget_s`` is ``pacing.time_budget`` of the engine's clock at this moment (None
        without clocks). The model runs outside the game's lock, so the page can keep reading
        the state (and the running clock) while the engine thinks. With human pacing on, the
        answer waits out the predicted think time, bounded by the clock
        (``pacing.remaining_wait``). Returns None when the engine resigned instead.
        """
        with self._lock:
            self.last_seen = self._now()
            self._check_open()
            if self.board.turn == self.human_colour:
                raise RequestError(409, "it is your turn, not the engine's")
            if self._thinking:
                raise RequestError(409, "the engine is already thinking about this position")
            self._thinking = True
            s = self.settings
            engine_white = self.human_colour == chess.BLACK
            game = self._game()
            ply = len(self.board.move_stack)
            clock = Clock(self.time_left(self.board.turn), s.increment_s)
            started = self._turn_started
            budget = time_budget(clock)
            allowed = None if budget is None else budget + (self._now() - started)
        try:
            decision = play(game, s.mode, budget)
            if s.human_pacing and not decision.resigned:
                self._sleep(remaining_wait(decision.think_time_s, clock, self._now() - started))
        finally:
            with self._lock:
                self._thinking = False
        with self._lock:
            self._check_open()  # the human may have resigned, or the engine flagged meanwhile
            assert len(self.board.move_stack) == ply, "the board moved during the engine's turn"
            if decision.resigned:
                self._finish("0-1" if engine_white else "1-0", "engine resigned")
                return None
            move = chess.Move.from_uci(decision.move)
            if move not in self.board.legal_moves:  # never trust a model's move blindly
                raise RuntimeError(f"engine proposed illegal {decision.move} in {self.board.fen()}")
            san = self.board.san(move)
            top = sorted(decision.policy.items(), key=lambda kv: -kv[1])[:TOP_MOVES]
            top = [
                (u, float(p)) for u, p in top if chess.Move.from_uci(u) in self.board.legal_moves
            ]
            top_san = [(self.board.san(chess.Move.from_uci(u)), p) for u, p in top]
            spent = self._charge_and_push(move)
            info = EngineMove(
                uci=decision.move,
                san=san,
                predicted_think_s=float(decision.think_time_s),
                spent_s=float(spent),
                value_white=float(decision.value),
                sims=int(decision.sims),
                top_moves=top_san,
                note=decision.note,
                top_uci=top,
                budget_s=allowed,
            )
            self.engine_moves[ply] = info
            return info

    def resign(self) -> None:
        with self._lock:
            self._check_open()
            self._finish("0-1" if self.human_colour == chess.WHITE else "1-0", "human resigned")

    def takeback(self) -> None:
        """Undo the human's last move (and the engine's answer to it); Allie always agrees.

        Refused while the engine thinks (its answer would land on a changed board), before the
        human has moved, and once the game is over. No time is given back, as on lichess.
        """
        with self._lock:
            self.last_seen = self._now()
            self._check_open()
            if self._thinking:
                raise RequestError(409, "Allie is thinking: take back after its move")
            plies = 2 if self.board.turn == self.human_colour else 1
            if len(self.board.move_stack) < plies:
                raise RequestError(409, "nothing to take back: you have not moved yet")
            mover = self.board.turn  # what its clock has run so far stays spent
            if self._left[mover] is not None:
                self._left[mover] = self.time_left(mover)
            for _ in range(plies):
                self.board.pop()
            n = len(self.board.move_stack)
            del self._clocks_after[n:]
            for ply in [p for p in self.engine_moves if p >= n]:
                del self.engine_moves[ply]
            self._draw_offered_at = None
            self._turn_started = self._now()
            self.notice = f"took back {plies} move{'s' if plies > 1 else ''}"

    def offer_draw(self, evaluate: Callable[[Game], float] | None) -> bool:
        """The human offers a draw; the engine accepts when its model's value of the position,
        for its own side, is at most ``DRAW_ACCEPT_VALUE``. One offer per position.

        ``evaluate(game) -> value_white`` is the model's value head (one forward pass); None
        (no model) declines. Returns whether the draw was agreed.
        """
        with self._lock:
            self.last_seen = self._now()
            self._check_open()
            if self._thinking:
                raise RequestError(409, "Allie is thinking: offer the draw after its move")
            ply = len(self.board.move_stack)
            if self._draw_offered_at == ply:
                raise RequestError(409, "Allie already answered a draw offer in this position")
            self._draw_offered_at = ply
            game = self._game()
            engine_white = self.human_colour == chess.BLACK
        value = None if evaluate is None else float(evaluate(game))
        with self._lock:
            self._check_open()
            if len(self.board.move_stack) != ply:  # a move landed while the model looked
                raise RequestError(409, "the position changed: offer again")
            if value is None:
                self.notice = "Allie declines the draw (no model to judge the position)"
                return False
            mine = value if engine_white else -value
            if mine <= DRAW_ACCEPT_VALUE:
                self._finish("1/2-1/2", "draw agreed")
                self.notice = f"Allie accepts the draw (its value for itself {mine:+.2f})"
                return True
            self.notice = f"Allie declines the draw: it thinks it stands better ({mine:+.2f})"
            return False

    # ------------------------------------------------------------------ views
    def state(self) -> dict[str, Any]:
        """Everything the page draws, as JSON-ready values."""
        with self._lock:
            self.last_seen = self._now()
            self._flag_check()
            board = self.board
            replay = chess.Board()
            san = []
            for m in board.move_stack:
                san.append(replay.san(m))
                replay.push(m)
            last_engine = max(self.engine_moves) if self.engine_moves else None
            engine_budget = None
            if self.engine_to_move:
                engine_budget = time_budget(
                    Clock(self.time_left(board.turn), self.settings.increment_s)
                )
                if engine_budget is not None and not self.preparing:
                    engine_budget += self._now() - self._turn_started
            human_moves = sum(
                1 for i in range(len(board.move_stack)) if (i % 2 == 0) == (self.human_colour)
            )
            return {
                "id": self.id,
                "settings": dataclasses.asdict(self.settings),
                "fen": board.fen(),
                "moves": [m.uci() for m in board.move_stack],
                "san": san,
                "turn": "white" if board.turn == chess.WHITE else "black",
                "legal_moves": [m.uci() for m in board.legal_moves] if self.result is None else [],
                "clocks": {
                    "white": self.time_left(chess.WHITE),
                    "black": self.time_left(chess.BLACK),
                },
                "engine_to_move": self.engine_to_move,
                "engine_thinking": self._thinking,
                "engine_budget_s": engine_budget,
                "preparing": self.preparing,
                "can_takeback": self.result is None and not self._thinking and human_moves > 0,
                "draw_offer_open": self.result is None
                and self._draw_offered_at != len(board.move_stack),
                "notice": self.notice,
                "last_engine_move": (
                    dataclasses.asdict(self.engine_moves[last_engine]) | {"ply": last_engine}
                    if last_engine is not None
                    else None
                ),
                "result": self.result,
                "termination": self.termination,
                "rematch_id": self.rematch_id,
            }

    def pgn(self) -> str:
        """The game as PGN: ratings, time control, %clk, and the engine's predictions."""
        with self._lock:
            s = self.settings
            game = chess.pgn.Game()
            engine_name = f"Allie ({s.mode}, {s.engine_elo})"
            white, black = ("Human", engine_name)
            if self.human_colour == chess.BLACK:
                white, black = black, white
            game.headers.update(
                Event="allie-jax play",
                Site="local",
                Date=self.started.strftime("%Y.%m.%d"),
                White=white,
                Black=black,
                Result=self.result or "*",
                WhiteElo=str(s.human_elo if white == "Human" else s.engine_elo),
                BlackElo=str(s.human_elo if black == "Human" else s.engine_elo),
                TimeControl=s.time_control or "-",
                Termination=(self.termination or "unterminated").split(" (")[0],
            )
            node: chess.pgn.GameNode = game
            for ply, move in enumerate(self.board.move_stack):
                node = node.add_variation(move)
                parts = []
                if ply < len(self._clocks_after) and self._clocks_after[ply] is not None:
                    node.set_clock(self._clocks_after[ply])
                info = self.engine_moves.get(ply)
                if info is not None:
                    parts.append(
                        f"predicted {info.predicted_think_s:.1f}s, value {info.value_white:+.2f}"
                    )
                if parts:
                    node.comment = (node.comment + " " if node.comment else "") + "; ".join(parts)
            out = io.StringIO()
            game.accept(chess.pgn.FileExporter(out))
            return out.getvalue()
