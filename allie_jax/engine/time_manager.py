"""The time manager: how long one move may take, from the clock the GUI reports.

The rule (documented with its numbers in ``docs/guide.md``):

* ``moves_to_go`` is UCI ``movestogo`` when the control has one (``40/300``), else
  ``DEFAULT_MOVES_TO_GO`` (sudden death and increment controls: a game is assumed to last about
  that many more moves, which, applied again at every move, spends the clock geometrically).
* ``usable = time_left - move_overhead * (moves_to_go + 2)`` (UCI ``Move Overhead``, default
  100 ms): what the GUI, the pipe and the operating system take between the clock stopping and
  starting is never planned for, for every move still to come (as Stockfish reserves it), so a
  short clock keeps a floor that its lag can eat.
* ``target = usable / moves_to_go + increment``;
* the target is capped by a safe maximum: ``MAX_FRACTION`` of ``time_left - move_overhead``
  (``LAST_MOVE_FRACTION`` when this is the last move before the control adds time), so an
  increment larger than what is left, or a ``movestogo`` of 1, can never plan the whole clock.
* ``go movetime T``: the limit is ``T - move_overhead``.

The limit covers the *whole* move: replay, prefill, the root, every simulation chunk and the
search's finish. ``MovePlan`` turns it into two instants: the search's own deadline, which keeps
back the time its finish has been taking (measured move after move by ``FinishReserve``), and
the hard limit at which the engine answers with its fallback whatever the search is doing.
"""

from __future__ import annotations

import dataclasses
import threading

MOVE_OVERHEAD_S = 0.1  # UCI "Move Overhead" default
DEFAULT_MOVES_TO_GO = 25  # moves assumed left in a game without movestogo
MAX_FRACTION = 0.25  # of the usable time, for one move
LAST_MOVE_FRACTION = 0.75  # with movestogo 1: the control adds time right after this move
MIN_FINISH_S = 0.03  # the search stops at least this long before the limit (finish, output)
MAX_FINISH_S = 2.0  # the reserve never grows past this, however slow one finish was


@dataclasses.dataclass(frozen=True)
class Clock:
    """The mover's clock at the moment a move is asked for (seconds; None = no clock)."""

    time_left_s: float | None = None
    increment_s: float = 0.0
    movetime_s: float | None = None  # a fixed time for this move (UCI ``go movetime``)
    moves_to_go: int | None = None  # UCI ``movestogo``: moves until the control adds time
    overhead_s: float = MOVE_OVERHEAD_S  # UCI ``Move Overhead``


def move_limit(clock: Clock) -> float | None:
    """Seconds the whole move may take under ``clock`` (None when nothing bounds it)."""
    bounds = []
    overhead = max(0.0, clock.overhead_s)
    if clock.movetime_s is not None:
        bounds.append(max(0.0, clock.movetime_s - overhead))
    if clock.time_left_s is not None:
        mtg = clock.moves_to_go if clock.moves_to_go and clock.moves_to_go > 0 else None
        n = mtg or DEFAULT_MOVES_TO_GO
        usable = max(0.0, clock.time_left_s - overhead * (n + 2))
        target = usable / n + max(0.0, clock.increment_s)
        left = max(0.0, clock.time_left_s - overhead)
        cap = left * (LAST_MOVE_FRACTION if mtg == 1 else MAX_FRACTION)
        bounds.append(min(target, cap))
    return min(bounds) if bounds else None


class FinishReserve:
    """How long before the limit the search must stop so the move still lands inside it.

    The search checks its deadline only between simulation chunks; what follows the last chunk
    (the finish: the final policy, the decision, copying results back, the reply) takes time too,
    and more on a busy machine. Each move reports how long it ran past its search deadline; the
    reserve is the largest recent overrun (decaying slowly), never under ``MIN_FINISH_S``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserve = MIN_FINISH_S

    @property
    def seconds(self) -> float:
        with self._lock:
            return self._reserve

    def observe(self, overrun_s: float) -> None:
        """Record that a move ended ``overrun_s`` seconds after its search deadline."""
        with self._lock:
            grown = min(MAX_FINISH_S, max(0.0, overrun_s) * 1.5)
            self._reserve = max(MIN_FINISH_S, grown, 0.9 * self._reserve)


@dataclasses.dataclass(frozen=True)
class MovePlan:
    """The instants (``time.monotonic()``) one move works to; None = unbounded."""

    start: float
    limit_s: float | None  # the whole move's limit
    search_deadline: float | None  # the search's own deadline: the limit less the finish
    hard_deadline: float | None  # the fallback answers here if nothing else has

    @classmethod
    def make(cls, start: float, clock: Clock | None, reserve_s: float) -> MovePlan:
        limit = None if clock is None else move_limit(clock)
        if limit is None:
            return cls(start, None, None, None)
        search = start + max(0.0, limit - reserve_s)
        return cls(start, limit, search, start + limit)
