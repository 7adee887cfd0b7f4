"""What the one search needs from a model family: its roots and its leaf evaluation inside jit.

``Searcher`` (search/searcher.py) runs every family the same way: per-game budgets, chunks, the
deadline, fixed shapes, warm-up, the final policy and the move rule. What differs is how a root
is evaluated and how a new node is, so a family hands the Searcher two objects:

- ``Roots`` (host side): the move-id lists the Searcher replays inside jit (``chess_jax``), then
  the root outputs and the per-game ``context`` the leaves need (the decoder: its KV cache of the
  game prefix; the board model: the game's Elos; Maia: the root's 8-board history).
- ``Leaves`` (static, hashable; called inside jit): the root's ``NodeEval``, the
  ``tree_search.ExpandFn`` that evaluates a batch of new nodes (one rules step and one model call
  for the whole batch), and how the context's rows follow a reordering of the batch.

Values in a ``NodeEval`` are from the view of the side to move at the node; ``node_eval`` turns a
family's raw outputs into one (legal-masked logits, exact values at terminal nodes).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import chess_jax, vocab
from allie_jax.game import Game, normalize_think_time
from allie_jax.search.selection import mask_logits
from allie_jax.search.tree_search import ExpandFn, NodeEval

# log-prob given to the vocabulary's non-move tokens by a family whose model predicts moves only
# (time controls, termination): such a family never resigns by the termination-token rule
NO_TOKEN = -1e9


class RootOutputs(NamedTuple):
    """A family's outputs at the roots: the decoder's ``ModelOutputs`` at the last token has them.

    ``policy_logits`` [B, ≥ 1993] (move ids first, then the special tokens), ``time`` [B]
    (normalised think time; a family without a time head gives ``normalize_think_time(0)``),
    ``value`` [B] (White's view).
    """

    policy_logits: jax.Array
    time: jax.Array
    value: jax.Array


def mover_value(value_white: jax.Array, white_to_move: jax.Array) -> jax.Array:
    return jnp.where(white_to_move, value_white, -value_white)


def node_eval(
    state: chess_jax.ChessState,
    policy_logits: jax.Array,
    value_mover: jax.Array,
    payload: Any,
    legal: jax.Array | None = None,
) -> NodeEval:
    """A NodeEval at ``state``: logits masked to the legal moves, the mover's value, and the
    exact value (mate −1, draws 0) where the rules end the game there (never expanded)."""
    if legal is None:
        legal = chess_jax.legal_mask(state)
    done, result_white = chess_jax.outcome(state, legal)
    exact = mover_value(result_white, chess_jax.white_to_move(state))
    value = jnp.where(done, exact, value_mover)
    logits = mask_logits(policy_logits[:, : vocab.NUM_MOVES].astype(jnp.float32), legal)
    return NodeEval(logits, value.astype(jnp.float32), done, payload)


def take_rows(tree: Any, order: jax.Array, sorted_rows: bool, axis: int = 0) -> Any:
    """Every leaf of ``tree`` with its rows (``axis``) in ``order`` (a no-op unless sorted)."""
    if not sorted_rows:
        return tree
    return jax.tree.map(lambda x: jnp.take(x, order, axis=axis), tree)


def shrink_and_pad(size: int, rows: int, fn, *args) -> NodeEval:
    """``fn`` on the first ``size`` rows of ``args`` (leaves [R, ...]), padded back to ``rows``.

    The idle tail of a sorted, mixed-budget batch then costs nothing (its writes are dropped).
    """
    ev = fn(*jax.tree.map(lambda x: x[:size], args))
    pad = rows - size
    if not pad:
        return ev
    return jax.tree.map(lambda x: jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)), ev)


def bucketed_expand(
    row_buckets: tuple[int, ...], batch: int, evaluate, context: Any = ()
) -> ExpandFn:
    """An ExpandFn for a family whose leaves need the parent's payload, the action and the
    per-game ``context`` (leaves [B, ...]) but not the path (the model reads the position).

    ``row_buckets`` descend from the leaf rows of a step, B·K with ``leaf_batch`` K (row r is a
    leaf of game r // K, so a game's K rows read its payload store and its context row), in
    multiples of K. ``evaluate(parent_payload, action, context)`` runs on the smallest bucket
    covering the active rows (a ``lax.switch``), every argument with one row per leaf.
    """
    buckets = tuple(row_buckets or (batch,))
    k = buckets[0] // batch if batch else 1
    if (
        k < 1
        or buckets[0] != batch * k
        or list(buckets) != sorted(buckets, reverse=True)
        or any(size % k for size in buckets)
    ):
        raise ValueError(
            f"row_buckets={buckets} must descend from the leaf rows (batch size {batch} x "
            "leaf_batch) in multiples of leaf_batch"
        )
    rows_total = buckets[0]
    if k > 1:  # a game's K leaf rows each read its context row
        context = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), context)

    def expand(payloads, parent, path_nodes, path_len, action, num_active=None):
        del path_nodes, path_len
        rows = jnp.arange(parent.shape[0])
        game = rows if k == 1 else rows // k
        node = jax.tree.map(lambda x: x[game, parent], payloads)
        branches = [
            functools.partial(shrink_and_pad, size, rows_total, evaluate) for size in buckets
        ]
        if len(branches) == 1:
            return branches[0](node, action, context)
        if num_active is None:
            num_active = parent.shape[0]
        bucket = jnp.sum(jnp.asarray(buckets) >= num_active) - 1
        return jax.lax.switch(bucket, branches, node, action, context)

    return expand


def move_root_outputs(move_logits: jax.Array, value_white: jax.Array) -> RootOutputs:
    """``RootOutputs`` of a family that predicts moves only: ``move_logits`` [B, 1968] first,
    ``NO_TOKEN`` for the special tokens (it never resigns by the termination token), and the
    think time of a family without a time head (``normalize_think_time(0)``)."""
    b = move_logits.shape[0]
    full = jnp.full((b, vocab.VOCAB_SIZE), NO_TOKEN, jnp.float32)
    time = jnp.full((b,), normalize_think_time(np.float32(0.0)), jnp.float32)
    return RootOutputs(full.at[:, : vocab.NUM_MOVES].set(move_logits), time, value_white)


@dataclasses.dataclass(frozen=True)
class PositionLeaves(abc.ABC):
    """``Leaves`` of a family whose model reads the position (not the path): a node's payload
    holds its ``chess_jax`` state (and whatever else the family keeps per node), a new node is
    ``child``'s one rules step and one model call for every leaf row of the step, and the
    context has one row per game. A family writes ``root_eval`` and ``child``."""

    @abc.abstractmethod
    def child(self, model: Any, node: Any, action: jax.Array, context: Any) -> NodeEval:
        """The NodeEval of the positions after ``action`` from ``node`` (one row per leaf)."""

    def make_expand(self, model: Any, context: Any, row_buckets: tuple[int, ...]) -> ExpandFn:
        batch = jax.tree.leaves(context)[0].shape[0]
        return bucketed_expand(row_buckets, batch, functools.partial(self.child, model), context)

    def sort_context(self, context: Any, order: jax.Array, sorted_rows: bool) -> Any:
        return take_rows(context, order, sorted_rows)


class Leaves(Protocol):
    """A family's evaluation inside the search's jit (static: hashable, compared by value)."""

    def root_eval(self, model: Any, state: Any, root_out: Any, context: Any) -> NodeEval:
        """The roots' NodeEval (its payload is what every node of this family carries)."""

    def make_expand(self, model: Any, context: Any, row_buckets: tuple[int, ...]) -> ExpandFn:
        """The ExpandFn of the batch (``context``'s rows in the tree's row order)."""

    def sort_context(self, context: Any, order: jax.Array, sorted_rows: bool) -> Any:
        """``context`` with its rows in ``order`` (when the batch is sorted by budget)."""


class Roots(Protocol):
    """A family's roots, host side (see the module docstring)."""

    leaves: Leaves
    stats: Any  # a Counter the Searcher adds ``simulations`` / ``positions`` to

    def replay_widths(self) -> tuple[int, ...]:
        """Widths the move lists are padded to for the in-jit replay (ascending)."""

    def prepare(self, games: Sequence[Game], batch: int) -> tuple[list[np.ndarray], Any]:
        """(move ids of each of ``batch`` rows (padding rows repeat row 0), host data)."""

    def evaluate(self, prepared: Any, state: Any, legal: Any) -> tuple[Any, Any]:
        """(root outputs [batch], context) for the replayed roots."""

    def warm(self, batch: int, replay: Any) -> Iterator[tuple[int, Any, Any, Any, Any]]:
        """Every root shape a batch can meet: (replay width, state, legal, root outputs, context)
        on synthetic inputs; ``replay(width)`` gives the start position's (state, legal) at that
        width (the Searcher then compiles its decision for each)."""

    def forget(self) -> None:
        """Drop whatever is kept between calls (the decoder's per-game cache)."""


class PositionRoots(abc.ABC):
    """``Roots`` of a family whose model reads the position: games from the standard start (the
    Searcher replays their moves inside jit), a per-game ``context`` from the host, and a jitted
    root evaluation. A family gives ``leaves``, ``host_context`` and ``root_outputs``.

    ``claimable_roots``: a root in a draw the rules would let a player claim is still searched
    (only a root without a legal move is over), for a family whose leaves say so.
    """

    leaves: Leaves
    claimable_roots: bool = False

    def __init__(self, model: Any, *, fixed_shapes: bool = False) -> None:
        self.graphdef, self.params = nnx.split(model)
        self.fixed_shapes = fixed_shapes
        self.stats: collections.Counter = collections.Counter()

    @abc.abstractmethod
    def host_context(self, games: Sequence[Game], batch: int) -> tuple[np.ndarray, ...]:
        """Per-game host arrays (leading axis ``batch``; rows past ``games`` are padding)."""

    @abc.abstractmethod
    def root_outputs(self, state: Any, legal: jax.Array, context: tuple) -> RootOutputs:
        """The roots' outputs (a jitted call on ``graphdef`` / ``params``)."""

    def games(self, games: Sequence[Game]) -> Sequence[Game]:
        """The games as the family reads them (the board model: Elo conditioning)."""
        return games

    def forget(self) -> None:  # noqa: B027 (a hook: these families keep nothing between calls)
        """Nothing is kept between calls: a position family has no per-game cache."""

    def replay_widths(self) -> tuple[int, ...]:
        """The decoder's cache widths (prefill imports this module, hence the late import)."""
        from allie_jax.search.prefill import ENGINE_SHORT_WIDTH, LENGTH_BUCKETS

        return (ENGINE_SHORT_WIDTH, 512) if self.fixed_shapes else LENGTH_BUCKETS

    def prepare(self, games: Sequence[Game], batch: int):
        games = list(self.games(games))
        moves = [chess_jax.uci_to_move_ids(list(g.moves)) for g in games]
        moves += [moves[0]] * (batch - len(games))
        return moves, self.host_context(games, batch)

    def evaluate(self, prepared, state, legal):
        context = tuple(jnp.asarray(x) for x in prepared)
        return self.root_outputs(state, legal, context), context

    def warm(self, batch: int, replay) -> Iterator[tuple[int, Any, Any, Any, Any]]:
        start = self.host_context([Game(moves=[])], batch)
        for width in self.replay_widths():
            state, legal = replay(width)
            root, context = self.evaluate(start, state, legal)
            yield width, state, legal, root, context
