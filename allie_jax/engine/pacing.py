"""How long a human-paced move may take, given the predicted think time and the clock.

The model predicts think times without seeing the clock (clocks are not tokens), so the clock
bound lives here: a paced move never spends more than a quarter of the remaining time plus the
increment, and always leaves a safety margin, so pacing alone never loses on time.
"""

from __future__ import annotations

import dataclasses

SAFETY_S = 1.0  # never plan to use the last second (network lag, process scheduling)


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
        bounds.append(max(0.0, clock.movetime_s - 0.05))
    if clock.time_left_s is not None:
        left = max(0.0, clock.time_left_s)
        bounds.append(max(0.0, min(left * 0.25 + clock.increment_s, left - SAFETY_S)))
    return min(bounds) if bounds else None


def paced_time(predicted_s: float, clock: Clock) -> float:
    """Seconds a human-paced move takes in total: the prediction, clipped to the clock's budget."""
    budget = time_budget(clock)
    t = max(0.0, float(predicted_s))
    return t if budget is None else min(t, budget)


def remaining_wait(predicted_s: float, clock: Clock, elapsed_s: float) -> float:
    """How much longer to wait before answering, after ``elapsed_s`` already spent thinking."""
    return max(0.0, paced_time(predicted_s, clock) - max(0.0, elapsed_s))
