"""The play modes: one list that the search, the API, UCI, the match runner, the browser page and
the evaluator read, and which of them each model family can play.

Standard library only: the UCI engine lists the modes in its option table before it imports
anything heavy (a GUI waits about a second for ``uciok``).

- ``policy``: a move drawn from the model's policy (no tree); ``greedy``: its most likely move.
- ``search`` / ``gumbel``: a tree of a fixed budget (π̄ from pUCT visits / Gumbel's sequential
  halving), both anchored to the human policy.
- ``adaptive`` / ``gumbel-adaptive``: the same with each move's budget from the model's predicted
  think time, so only a family with a think-time head (the Allie decoder) plays them.
"""

from __future__ import annotations

MODES = ("policy", "greedy", "search", "adaptive", "gumbel", "gumbel-adaptive")
SEARCH_MODES = ("search", "adaptive", "gumbel", "gumbel-adaptive")  # the modes that build a tree
ADAPTIVE_MODES = ("adaptive", "gumbel-adaptive")  # budgets from the predicted think time


def modes_for(*, think_time: bool) -> tuple[str, ...]:
    """The modes a family plays: all of them with a think-time head, else all but adaptive."""
    return MODES if think_time else tuple(m for m in MODES if m not in ADAPTIVE_MODES)


def default_mode(modes: tuple[str, ...]) -> str:
    """The paper's default (``adaptive``) where the family has it, else ``search``."""
    return "adaptive" if "adaptive" in modes else "search"
