"""What every player answers with, and what a player is: no engine, search or model imports.

``Decision`` is one move chosen for one game; ``Player`` is anything that answers a batch of games
in progress with decisions: ``engine.api.Allie`` (the decoder and the board family),
``baselines.maia_player.MaiaEngine`` (Maia-1). The UCI engine, the match runner, the browser
page and the evaluator talk to players through this module only, so they need not know a
family.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from allie_jax.game import Game


@dataclasses.dataclass(frozen=True)
class Decision:
    """A move chosen under a preset. ``value`` is from White's view, like ``value_white``.

    ``effective_lambda`` is the human anchor's strength λ the final policy is optimal for,
    π' = argmax_p Σ p·q − λ·KL(anchor ‖ p) for π̄ (``search``/``adaptive``), and the λ of
    π' = softmax(log anchor + q̂/λ) for the Gumbel modes (which solves the same problem with
    KL(p ‖ anchor)); NaN when no simulation ran (``policy``, ``greedy``, a budget of 0, a
    fallback).
    """

    move: str
    think_time_s: float
    value: float
    resigned: bool
    sims: int
    policy: dict[str, float]
    note: str = ""
    effective_lambda: float = math.nan
    path: str = "prior"  # "search" | "prior" | "fallback" (see engine/api.py's docstring)
    search_value: float = math.nan  # the root's searched value, side to move's view
    visits: dict[str, int] = dataclasses.field(default_factory=dict)  # root visits per move


@runtime_checkable
class Player(Protocol):
    """Answers a batch of games in progress (moves from the game's start) under a preset.

    ``preset`` is a mode name (``policy``, ``greedy``, ``search``, ``gumbel``, ...; which ones a
    family supports is the family's), ``rng`` an int seed or a jax key, ``overrides`` the
    preset's ``SearchConfig`` fields.
    """

    def play(
        self, games: Sequence[Game], preset: str, rng: Any = 0, **overrides: Any
    ) -> list[Decision]: ...
