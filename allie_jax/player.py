"""What every player answers with, and what a player is: no engine, search or model imports.

``Decision`` is one move chosen for one game, ``Prediction`` the model's raw view of one
position; ``Player`` is anything that answers a batch of games in progress with decisions:
``engine.api.Allie`` (the decoder and the board family), ``baselines.maia_player.MaiaEngine``
(Maia-1 in matches and the product test), ``baselines.maia_uci.MaiaUciEngine`` (Maia-1 behind
UCI). The UCI engine, the match runner, the browser page and the evaluator talk to players
through this module only, so they need not know a family.

Every feature a caller may use is part of the interface, so no caller probes a player for one:
a family without a feature implements it explicitly, and ``PlayerBase`` holds those explicit
defaults (a player that reads boards needs no FEN history, one with nothing to compile ahead
warms up by doing nothing, ...). Standard library only at import (the UCI engine and Maia's
UCI front import it before ``uciok``).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # standard library only at import: launch.uci answers ``uci`` before numpy
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


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The model's view of the position after ``game.moves``.

    ``move_probs`` is the softmax over legal moves only; ``resign`` is the paper's rule (the
    termination token's logit beats every legal move and the mover's value is below −0.9).
    """

    move_probs: dict[str, float]
    think_time_s: float
    value_white: float
    resign: bool


@runtime_checkable
class Player(Protocol):
    """Answers a batch of games in progress (moves from the game's start) under a preset.

    ``preset`` is a mode name (``policy``, ``greedy``, ``search``, ``gumbel``, ...; ``modes``
    are those the family plays), ``rng`` an int seed or a jax key, ``overrides`` the preset's
    ``SearchConfig`` fields. ``start_fens`` (one per game, None: the standard start) and a
    caller's clock (``deadline``, ``should_stop``, ``budgets``, ``progress``) are keywords of
    ``play`` that a family may ignore (see each family's ``play``).

    ``reads_boards``: the model reads the position itself, so a FEN is played as it is; a
    player that reads the game instead (the decoder) plays a FEN from a history reaching it
    (``history_for``), and without one from its ``fen_model`` (a board-reading player the user
    configured; None: the move is the fallback).
    """

    modes: tuple[str, ...]
    reads_boards: bool
    fen_model: Player | None

    def play(
        self, games: Sequence[Game], preset: str, rng: Any = 0, **overrides: Any
    ) -> list[Decision]: ...

    def predict(
        self, games: Sequence[Game], *, start_fens: Sequence[str | None] | None = None
    ) -> list[Prediction]:
        """The model's legal-move distribution, think time, value and resignation, per game."""
        ...

    def root_prior(self, game: Game, start_fen: str | None = None) -> Prediction:
        """``predict`` for one game, maybe cached: a caller out of time plays its best move."""
        ...

    def history_for(self, game: Game, start_fen: str | None, **limits: Any) -> tuple[Game, str]:
        """``game`` rewritten to start from the standard position (and a line saying what
        happened), or unchanged with the reason none was found."""
        ...

    def warmup(self, preset: str = "policy", batch_size: int = 1, **overrides: Any) -> int:
        """Compile what a batch of ``batch_size`` games under ``preset`` runs; calls made."""
        ...

    def fix_shapes(self) -> None:
        """From now on run a closed set of shapes (the ones ``warmup`` compiles)."""
        ...


class PlayerBase(abc.ABC):
    """The ``Player`` features a family may not have, each as an explicit default.

    A subclass gives ``modes``, ``play`` and ``predict``, and overrides the rest where its model
    has the feature (``engine.api.Allie`` overrides them all).
    """

    modes: tuple[str, ...]
    reads_boards: bool = True  # the position is read as given: a FEN needs no history
    fen_model: Player | None = None  # reading boards itself, it needs no board model beside it

    @abc.abstractmethod
    def play(
        self, games: Sequence[Game], preset: str, rng: Any = 0, **overrides: Any
    ) -> list[Decision]:
        """See ``Player.play``."""

    @abc.abstractmethod
    def predict(
        self, games: Sequence[Game], *, start_fens: Sequence[str | None] | None = None
    ) -> list[Prediction]:
        """See ``Player.predict``."""

    def root_prior(self, game: Game, start_fen: str | None = None) -> Prediction:
        """``predict`` for the one game, uncached (a family whose forward is cheap)."""
        return self.predict([game], start_fens=[start_fen])[0]

    def history_for(self, game: Game, start_fen: str | None, **limits: Any) -> tuple[Game, str]:
        """The game unchanged: a board-reading player plays the FEN itself, no history needed."""
        del start_fen, limits
        return game, ""

    def warmup(self, preset: str = "policy", batch_size: int = 1, **overrides: Any) -> int:
        """Nothing compiled ahead: the first move compiles what it needs (0 calls made)."""
        del preset, batch_size, overrides
        return 0

    def fix_shapes(self) -> None:  # noqa: B027 (an explicit default: nothing follows the batch)
        """Nothing to close: this player's shapes do not follow the batch."""
