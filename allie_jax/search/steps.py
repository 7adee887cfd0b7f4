"""The search's jitted programs, the same for every model family.

- ``decide_unsearched``: every row at budget 0 (``policy``, ``greedy``, an all-zero adaptive
  batch): no tree, the move from the tempered prior (or anchor).
- ``search``: the whole search of a batch in one call: ``start`` (rows sorted by budget, the root
  evaluated, the tree initialised), every simulation, ``finish.finish``.
- ``search_start`` / ``search_chunk`` / ``search_finish``: the same in pieces, for a caller with
  a clock (simulation ``sim`` does exactly the same either way).

The family enters as ``leaves`` (static: its root evaluation and leaf expansion, see
search/leaves.py) and ``context`` (its per-game data: the decoder's KV cache, the board model's
Elos, Maia's root history).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from allie_jax import aot
from allie_jax.search import decision, gumbel, tree_search
from allie_jax.search.config import SearchConfig
from allie_jax.search.finish import finish, gumbel_params, select_fn
from allie_jax.search.leaves import mover_value, take_rows

_NOISE_STREAM = 0x6B  # the Gumbel noise's key: fold_in(rng, this); the move is drawn with rng


@functools.partial(aot.jit, static_argnames=("config",))
def decide_unsearched(
    root_state, legal, root_out, argmax_rows, rng, anchor_logits, *, config: SearchConfig
):
    """Every row at budget 0: no tree. With an anchor, the move comes from the tempered anchor."""
    value_stm = mover_value(root_out.value, root_state.color == 0)
    res = decision.policy_step(root_out.policy_logits, legal, value_stm, argmax_rows, rng, config)
    if anchor_logits is not None:
        res["policy"] = decision.legal_prior(anchor_logits, legal, config.temperature)
        res["move_id"] = decision.draw_moves(res["policy"], legal, argmax_rows, rng)
    res["visits"] = jnp.zeros(legal.shape, jnp.int32)
    res["search_value"] = value_stm
    res["effective_lambda"] = jnp.full(value_stm.shape, jnp.nan, jnp.float32)
    return res


def start(
    leaves,
    model,
    context,
    root_state,
    root_out,
    budgets,
    c_puct,
    order,
    num_nodes,
    sorted_rows,
    rng,
    halving_table,
    gumbel_params: gumbel.GumbelParams | None,
):
    """Rows sorted by budget (if ``sorted_rows``), the root evaluated, the tree initialised.

    Gumbel modes (``gumbel_params``) also draw each game's noise (in the callers' row order, so
    it does not depend on the sort) and gather its sequential-halving row; both ride in
    ``tree.extra_data``.
    """
    state_s, out_s, budgets_s, c_puct_s = take_rows(
        (root_state, root_out, budgets, c_puct), order, sorted_rows
    )
    root = leaves.root_eval(model, state_s, out_s, leaves.sort_context(context, order, sorted_rows))
    extra = None
    if gumbel_params is not None:
        keys = jax.random.split(jax.random.fold_in(rng, _NOISE_STREAM), budgets.shape[0])
        noise = gumbel.gumbel_noise(
            take_rows(keys, order, sorted_rows),
            root.prior_logits.shape[-1],
            gumbel_params.noise_scale,
        )
        extra = gumbel.root_extra_data(root, budgets_s, noise, halving_table, gumbel_params)
    # pUCT trees keep log-priors (one exp per visit instead of a softmax); Gumbel's keep logits
    tree = tree_search.init_tree(root, c_puct_s, num_nodes, extra, log_prior=gumbel_params is None)
    return tree, budgets_s, c_puct_s


_STATIC = ("graphdef", "leaves", "num_nodes", "config", "tree_params", "row_buckets")


@functools.partial(aot.jit, static_argnames=_STATIC)
def search(
    graphdef,
    params,
    context,
    root_state,
    root_out,
    budgets,
    c_puct,
    argmax_rows,
    rng,
    order,
    anchor_logits,
    halving_table,
    *,
    leaves,
    num_nodes: int,
    config: SearchConfig,
    tree_params: tree_search.SearchParams,
    row_buckets: tuple[int, ...],
):
    """The whole search of a batch in one call: ``start``, every simulation, ``finish``."""
    model = nnx.merge(graphdef, params)
    sorted_rows = len(row_buckets) > 1  # rows by budget, descending: the active rows are a prefix
    gp = gumbel_params(config)
    tree, budgets_s, c_puct_s = start(
        leaves,
        model,
        context,
        root_state,
        root_out,
        budgets,
        c_puct,
        order,
        num_nodes,
        sorted_rows,
        rng,
        halving_table,
        gp,
    )
    expand = leaves.make_expand(
        model, leaves.sort_context(context, order, sorted_rows), row_buckets
    )
    stop = jnp.max(jnp.minimum(budgets_s, num_nodes - 1))
    tree = tree_search.run_simulations(
        tree,
        expand,
        budgets_s,
        0,
        stop,
        num_nodes=num_nodes,
        params=tree_params,
        select_fn=select_fn(gp),
    )
    return finish(
        tree,
        budgets_s,
        c_puct_s,
        order,
        root_out,
        argmax_rows,
        rng,
        anchor_logits,
        config,
        sorted_rows,
    )


@functools.partial(
    aot.jit, static_argnames=("graphdef", "leaves", "num_nodes", "sorted_rows", "gumbel_params")
)
def search_start(
    graphdef,
    params,
    context,
    root_state,
    root_out,
    budgets,
    c_puct,
    order,
    rng,
    halving_table,
    *,
    leaves,
    num_nodes,
    sorted_rows,
    gumbel_params,
):
    model = nnx.merge(graphdef, params)
    return start(
        leaves,
        model,
        context,
        root_state,
        root_out,
        budgets,
        c_puct,
        order,
        num_nodes,
        sorted_rows,
        rng,
        halving_table,
        gumbel_params,
    )


@functools.partial(
    aot.jit,
    static_argnames=(
        "graphdef",
        "leaves",
        "num_nodes",
        "tree_params",
        "row_buckets",
        "gumbel_params",
    ),
    donate_argnames=("tree",),
)
def search_chunk(
    graphdef,
    params,
    context,
    order,
    tree,
    budgets_s,
    start,
    stop,
    *,
    leaves,
    num_nodes: int,
    tree_params: tree_search.SearchParams,
    row_buckets: tuple[int, ...],
    gumbel_params: gumbel.GumbelParams | None = None,
):
    model = nnx.merge(graphdef, params)
    context_s = leaves.sort_context(context, order, len(row_buckets) > 1)
    expand = leaves.make_expand(model, context_s, row_buckets)
    return tree_search.run_simulations(
        tree,
        expand,
        budgets_s,
        start,
        stop,
        num_nodes=num_nodes,
        params=tree_params,
        select_fn=select_fn(gumbel_params),
    )


@functools.partial(aot.jit, static_argnames=("config", "sorted_rows"))
def search_finish(
    tree,
    budgets_s,
    c_puct_s,
    order,
    root_out,
    argmax_rows,
    rng,
    anchor_logits,
    *,
    config: SearchConfig,
    sorted_rows: bool,
):
    return finish(
        tree,
        budgets_s,
        c_puct_s,
        order,
        root_out,
        argmax_rows,
        rng,
        anchor_logits,
        config,
        sorted_rows,
    )
