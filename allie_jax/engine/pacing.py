"""How long a move may take under the clock: the one rule for the search deadline and pacing.

The model predicts think times without seeing the clock (clocks are not tokens), and the search
budget follows that prediction, so the clock bound lives outside the model: the time manager
(``allie_jax.engine.time_manager``: movestogo, move overhead, a per-move target capped by a safe
maximum) gives each move its limit (``time_budget``). The search gets that limit as its deadline
(it runs in chunks and stops with what it has); human pacing waits at most until it; and
``answer_by`` adds the small grace after which a caller answers without waiting for the search.
"""

from __future__ import annotations

from allie_jax.engine.time_manager import Clock, move_limit

__all__ = ["Clock", "answer_by", "paced_time", "remaining_wait", "time_budget"]

GRACE_S = 0.2  # after the limit, a caller answers without the search (at most 1/4 of the rest)


def time_budget(clock: Clock) -> float | None:
    """The most a move may take under this clock (``time_manager.move_limit``); None: unbounded."""
    return move_limit(clock)


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
        grace.append(0.5 * max(0.0, clock.overhead_s))
    if clock.time_left_s is not None:
        grace.append(0.25 * max(0.0, clock.time_left_s - clock.overhead_s - budget))
    return budget + max(0.0, min(grace))


def paced_time(predicted_s: float, clock: Clock) -> float:
    """Seconds a human-paced move takes in total: the prediction, clipped to the clock's budget."""
    budget = time_budget(clock)
    t = max(0.0, float(predicted_s))
    return t if budget is None else min(t, budget)


def remaining_wait(predicted_s: float, clock: Clock, elapsed_s: float) -> float:
    """How much longer to wait before answering, after ``elapsed_s`` already spent thinking."""
    return max(0.0, paced_time(predicted_s, clock) - max(0.0, elapsed_s))
