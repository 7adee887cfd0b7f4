"""The search's jitted programs, the same for every model family.

- ``decide_unsearched``: every row at budget 0 (``policy``, ``greedy``, an all-zero adaptive
  batch): no tree, the move from the tempered prior (or anchor).
- ``search``: the whole search of a batch in one call: ``start`` (rows sorted by budget, the root
  evaluated, the tree initialised), every simulation, ``finish.finish``.
- ``search_start`` / ``search_chunk`` / ``search_finish``: the same in pieces, for a caller with
  a clock (simulation ``sim`` does exactly the same either way).

Their inputs are a few typed bundles (as mctx's ``RootFnOutput`` / ``PolicyOutput``), not long
positional lists: ``RootBatch`` (the replayed roots and the family's root outputs and context),
``RowPlan`` (each row's budget, c_puct, the order that sorts rows by budget, Gumbel's halving
table), ``finish.MoveInputs`` (argmax rows, key, anchor), ``finish.SortedRows`` (the plan in
sorted order, which ``start`` returns and the chunks and ``finish`` read), and one static
``TreeSpec`` (the family's leaves, tree size, pUCT knobs, row buckets, the selection rule).

The family enters as ``TreeSpec.leaves`` (static: its root evaluation and leaf expansion, see
search/leaves.py) and ``RootBatch.context`` (its per-game data: the decoder's KV cache, the board
model's Elos, Maia's root history).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from allie_jax import aot
from allie_jax.search import decision, gumbel, selection, tree_search
from allie_jax.search.config import SearchConfig
from allie_jax.search.finish import MoveInputs, SortedRows, finish, select_fn
from allie_jax.search.leaves import RootOutputs, mover_value, take_rows

__all__ = [
    "MoveInputs",
    "RootBatch",
    "RowPlan",
    "SortedRows",
    "TreeSpec",
    "decide_unsearched",
    "search",
    "search_chunk",
    "search_finish",
    "search_start",
    "start",
]

_NOISE_STREAM = 0x6B  # the Gumbel noise's key: fold_in(rng, this); the move is drawn with rng


class RootBatch(NamedTuple):
    """The roots of a padded batch: the replayed states, their legal moves, the family's root
    outputs (``leaves.RootOutputs``) and its per-game leaf context (any pytree)."""

    state: Any  # chess_jax.ChessState [B]
    legal: jax.Array  # bool [B, 1968]
    out: RootOutputs
    context: Any


class RowPlan(NamedTuple):
    """Each row's search plan (callers' row order)."""

    budgets: jax.Array  # int32 [B]: simulations (≤ num_nodes − 1)
    c_puct: jax.Array  # float32 [B]: the budget-scaled c_puct
    order: jax.Array  # int32 [B]: the rows sorted by budget, descending (identity if unsorted)
    halving_table: jax.Array | None = None  # Gumbel modes: sequential halving for every budget


class TreeSpec(NamedTuple):
    """Everything static about a batch's search (hashable: one jit static argument).

    ``row_buckets``: the batch sizes the leaf evaluation is compiled for (more than one: rows
    are sorted by budget and the active ones are a prefix). ``gumbel`` / ``kl``: the selection
    rule (Gumbel's root halving, KL-regularised selection, or, both None, Allie's pUCT).
    """

    leaves: Any  # the family's ``leaves.Leaves``
    num_nodes: int
    tree_params: tree_search.SearchParams
    row_buckets: tuple[int, ...]
    gumbel: gumbel.GumbelParams | None = None
    kl: selection.KLParams | None = None

    @property
    def sorted_rows(self) -> bool:
        return len(self.row_buckets) > 1


@functools.partial(aot.jit, static_argnames=("config",))
def decide_unsearched(roots: RootBatch, move: MoveInputs, *, config: SearchConfig):
    """Every row at budget 0: no tree. With an anchor, the move comes from the tempered anchor."""
    legal = roots.legal
    value_stm = mover_value(roots.out.value, roots.state.color == 0)
    res = decision.policy_step(
        roots.out.policy_logits, legal, value_stm, move.argmax_rows, move.rng, config
    )
    if move.anchor_logits is not None:
        res["policy"] = decision.legal_prior(move.anchor_logits, legal, config.temperature)
        res["move_id"] = decision.draw_moves(res["policy"], legal, move.argmax_rows, move.rng)
    res["visits"] = jnp.zeros(legal.shape, jnp.int32)
    res["search_value"] = value_stm
    res["effective_lambda"] = jnp.full(value_stm.shape, jnp.nan, jnp.float32)
    return res


def start(spec: TreeSpec, model, roots: RootBatch, plan: RowPlan, move: MoveInputs):
    """Rows sorted by budget (if ``spec.sorted_rows``), the root evaluated, the tree initialised.

    Gumbel modes (``spec.gumbel``) also draw each game's noise (in the callers' row order, so
    it does not depend on the sort) and gather its sequential-halving row; both ride in
    ``tree.extra_data``; KL selection (``spec.kl``) with a caller's anchor carries it there
    (``selection.ROOT_ANCHOR``). Returns the tree and the plan in sorted order.
    """
    sort = spec.sorted_rows
    order = plan.order
    state_s, out_s, budgets_s, c_puct_s = take_rows(
        (roots.state, roots.out, plan.budgets, plan.c_puct), order, sort
    )
    context_s = spec.leaves.sort_context(roots.context, order, sort)
    root = spec.leaves.root_eval(model, state_s, out_s, context_s)
    extra = None
    if spec.gumbel is not None:
        keys = jax.random.split(jax.random.fold_in(move.rng, _NOISE_STREAM), plan.budgets.shape[0])
        noise = gumbel.gumbel_noise(
            take_rows(keys, order, sort), root.prior_logits.shape[-1], spec.gumbel.noise_scale
        )
        extra = gumbel.root_extra_data(root, budgets_s, noise, plan.halving_table, spec.gumbel)
    elif spec.kl is not None and move.anchor_logits is not None:
        legal_s = selection.legal_from_logits(root.prior_logits)
        anchor_s = take_rows(move.anchor_logits.astype(jnp.float32), order, sort)
        # the same distribution ``finish`` regularises the final policy towards
        anchor_prior = decision.legal_prior(selection.mask_logits(anchor_s, legal_s), legal_s)
        extra = {selection.ROOT_ANCHOR: anchor_prior}
    # pUCT and KL trees keep log-priors (one exp per visit instead of a softmax); Gumbel's logits
    tree = tree_search.init_tree(
        root, c_puct_s, spec.num_nodes, extra, log_prior=spec.gumbel is None
    )
    return tree, SortedRows(order, budgets_s, c_puct_s)


def _simulate(spec: TreeSpec, model, context, tree, rows: SortedRows, first, stop):
    """Simulations ``first .. stop − 1`` of the sorted rows with the family's leaves."""
    context_s = spec.leaves.sort_context(context, rows.order, spec.sorted_rows)
    expand = spec.leaves.make_expand(model, context_s, spec.row_buckets)
    return tree_search.run_simulations(
        tree,
        expand,
        rows.budgets,
        first,
        stop,
        num_nodes=spec.num_nodes,
        params=spec.tree_params,
        select_fn=select_fn(spec.gumbel, spec.kl),
    )


@functools.partial(aot.jit, static_argnames=("graphdef", "spec", "config"))
def search(
    graphdef,
    params,
    roots: RootBatch,
    plan: RowPlan,
    move: MoveInputs,
    *,
    spec: TreeSpec,
    config: SearchConfig,
):
    """The whole search of a batch in one call: ``start``, every simulation, ``finish``."""
    model = nnx.merge(graphdef, params)
    tree, rows = start(spec, model, roots, plan, move)
    stop = jnp.max(jnp.minimum(rows.budgets, spec.num_nodes - 1))
    tree = _simulate(spec, model, roots.context, tree, rows, 0, stop)
    return finish(tree, rows, roots.out, move, config, spec.sorted_rows)


@functools.partial(aot.jit, static_argnames=("graphdef", "spec"))
def search_start(
    graphdef, params, roots: RootBatch, plan: RowPlan, move: MoveInputs, *, spec: TreeSpec
):
    """``start`` on its own: the tree and the sorted plan for ``search_chunk``."""
    return start(spec, nnx.merge(graphdef, params), roots, plan, move)


@functools.partial(aot.jit, static_argnames=("graphdef", "spec"), donate_argnames=("tree",))
def search_chunk(graphdef, params, context, tree, rows: SortedRows, first, stop, *, spec: TreeSpec):
    """Simulations ``first .. stop − 1`` on the tree ``search_start`` (or a chunk) returned."""
    return _simulate(spec, nnx.merge(graphdef, params), context, tree, rows, first, stop)


@functools.partial(aot.jit, static_argnames=("config", "sorted_rows"))
def search_finish(
    tree,
    rows: SortedRows,
    root_out: RootOutputs,
    move: MoveInputs,
    *,
    config: SearchConfig,
    sorted_rows: bool,
):
    """``finish`` on a chunked search's tree (``rows.budgets``: the simulations each ran)."""
    return finish(tree, rows, root_out, move, config, sorted_rows)
