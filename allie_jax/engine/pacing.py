"""How long a move may take under the clock: the one rule for the search deadline and pacing.

The model predicts think times without seeing the clock (clocks are not tokens), and the search
budget follows that prediction, so the clock bound lives here: a move never plans more than a
quarter of the remaining time plus the increment, and always leaves a safety margin
(``time_budget``). The search gets that limit as its deadline (it runs in chunks and stops with
what it has); human pacing waits at most until it; and ``answer_by`` adds the small grace after
which the UCI engine answers without waiting for the search at all.
"""

from __future__ import annotations

import dataclasses

SAFETY_S = 1.0  # never plan to use the last second (network lag, process scheduling)
MAX_FRACTION = 0.25  # of the remaining time, for one move (plus the increment)
MOVETIME_MARGIN_S = 0.05  # ``go movetime``: answer this much before the time is up
GRACE_S = 0.2  # after the limit, the engine answers without the search (at most 1/4 of the rest)


@dataclasses.dataclass(frozen=True)
class Clock:
    """The mover's clock at the moment a move is asked for (seconds; None = no clock)."""

    time_left_s: float | None = None
    increment_s: float = 0.0
    movetime_s: float | None = None  # a fixed time for this move (UCI ``go movetime``)


def time_budget(clock: Clock) -> float | None:
    """The most a move may take under this clock; None when nothing bounds it."""
    bounds = []
    if clock.movetime_s is not None:
        bounds.append(max(0.0, clock.movetime_s - MOVETIME_MARGIN_S))
    if clock.time_left_s is not None:
        left = max(0.0, clock.time_left_s)
        bounds.append(max(0.0, min(left * MAX_FRACTION + clock.increment_s, left - SAFETY_S)))
    return min(bounds) if bounds else None


def answer_by(clock: Clock) -> float | None:
    """Seconds after which a move must be answered whatever the search is doing (None: never).

    ``time_budget`` plus a grace that still leaves time on the clock: the search stops at the
    budget by itself; this bound catches what it cannot interrupt (a compile, a stalled host).
    """
    budget = time_budget(clock)
    if budget is None:
        return None
    grace = [GRACE_S]
    if clock.movetime_s is not None:
        grace.append(0.5 * MOVETIME_MARGIN_S)
    if clock.time_left_s is not None:
        grace.append(0.25 * max(0.0, clock.time_left_s - budget))
    return budget + min(grace)


def paced_time(predicted_s: float, clock: Clock) -> float:
    """Seconds a human-paced move takes in total: the prediction, clipped to the clock's budget."""
    budget = time_budget(clock)
    t = max(0.0, float(predicted_s))
    return t if budget is None else min(t, budget)


def remaining_wait(predicted_s: float, clock: Clock, elapsed_s: float) -> float:
    """How much longer to wait before answering, after ``elapsed_s`` already spent thinking."""
    return max(0.0, paced_time(predicted_s, clock) - max(0.0, elapsed_s))
