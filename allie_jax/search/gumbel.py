"""Gumbel MuZero search (Danihelka et al., 2022) with a budget per game, as a KL-regularised mode.

This is ``mctx.gumbel_muzero_policy`` (mctx 0.0.71) run inside ``tree_search.search``, the
one-jit batched loop with KV-cached leaves, so each game of a batch can have its own budget:

- Sequential halving at the root. mctx builds its table of considered visit counts from a static
  ``num_simulations``; here the host builds every row once (``considered_visits_table``:
  [max_considered + 1, max_sims + 1, max_sims], indexed by the number of considered actions and
  the budget) and each game gathers its own row, which its root selector reads at simulation
  index Σ N(root, ·), exactly where mctx reads its table.
- Gumbel noise per game (``gumbel_noise``: the same draw stock mctx makes from that game's key).
- Interior nodes: mctx's ``gumbel_muzero_interior_action_selection`` (visit counts tracking
  softmax(logits + σ(completed Q))).
- Illegal moves (prior logit ≤ ``selection.ILLEGAL_LOGIT``) are masked in every argmax and in the
  final policy.

Completed Q is mctx's ``qtransform_completed_by_mix_value``: unvisited actions take the mixed
value (the raw value interpolated with the prior-weighted visited Q's); the completed vector is
min-max rescaled and multiplied by (c_visit + max N) · c_scale. mctx has no notion of illegal
moves below the root, so its min/max runs over every action, and the illegal ones carry the
mixed value: kept as is (in chess some action is always illegal, so the range always covers the
mixed value), which is what keeps budgets 1..N equal to stock (tested).

Policy improvement: π' = softmax(anchor + σ(completed Q)). σ is linear in q, so π' solves
argmax_p Σ p·q − λ·KL(p ‖ softmax(anchor)) with

    λ = (q_max − q_min) / ((c_visit + max N) · c_scale)

(``effective_lambda``, in value units, one per game and move). The user's knob is ``c_scale``
(``SearchConfig.gumbel_c_scale``): larger trusts the search more. The anchor is the model's prior
unless the caller passes ``anchor_logits`` (a separate human policy, e.g. Maia, for piKL-style
play); the search itself (its selection and mixed value) keeps the model's prior. A game with
budget 0 gets π' = softmax(anchor): σ of an unsearched root is 0.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np
from mctx._src import seq_halving  # mctx's sequential-halving schedule (0.0.71)

from allie_jax.search import tree_search
from allie_jax.search.selection import ILLEGAL_LOGIT, first_argmax, legal_from_logits

MODES = ("gumbel", "gumbel-adaptive")
_EPSILON = 1e-8  # mctx's floor on q_max − q_min when rescaling


class GumbelParams(NamedTuple):
    """mctx's defaults: ``maxvisit_init``=50, ``value_scale``=0.1, 16 considered, noise scale 1."""

    c_visit: float = 50.0
    c_scale: float = 0.1
    max_considered: int = 16
    noise_scale: float = 1.0


class GumbelResult(NamedTuple):
    policy: jax.Array  # float32 [B, A]: softmax(anchor + σ(completed Q)) over legal moves
    action: jax.Array  # int32 [B]: stock mctx's action (Gumbel + logits + σ among most visited)
    visits: jax.Array  # int32 [B, A]: root visit counts
    effective_lambda: jax.Array  # float32 [B]: the KL weight π' is optimal for (NaN: no search)
    search_value: jax.Array  # float32 [B]: root value after search, side to move's view


@functools.lru_cache(maxsize=4)
def considered_visits_table(max_considered: int, max_sims: int) -> np.ndarray:
    """int32 [max_considered + 1, max_sims + 1, max(max_sims, 1)]: mctx's halving schedule.

    ``table[m, n, :n]`` is ``seq_halving.get_sequence_of_considered_visits(m, n)`` — the visit
    count an action must have to be selectable at simulation i of a budget-n search with m
    considered actions (mctx's ``get_table_of_considered_visits(m, n)[m]``); the rest is 0.
    """
    table = np.zeros((max_considered + 1, max_sims + 1, max(max_sims, 1)), np.int32)
    for m in range(max_considered + 1):
        for n in range(1, max_sims + 1):
            table[m, n, :n] = seq_halving.get_sequence_of_considered_visits(m, n)
    return table


def gumbel_noise(keys: jax.Array, num_actions: int, scale: float = 1.0) -> jax.Array:
    """float32 [B, A]: for game b the noise stock mctx draws in a batch-1 call with ``keys[b]``."""

    def one(key):
        _, gumbel_rng = jax.random.split(key)
        return scale * jax.random.gumbel(gumbel_rng, (1, num_actions), jnp.float32)[0]

    return jax.vmap(one)(keys)


def completed_qvalues(tree: mctx.Tree, node: chex.Numeric) -> jax.Array:
    """[A] Q(node, ·) with unvisited actions completed by the mixed value (unbatched tree)."""
    q = tree.qvalues(node)
    visits = tree.children_visits[node]
    prior = jax.nn.softmax(tree.children_prior_logits[node])
    prior = jnp.maximum(jnp.finfo(prior.dtype).tiny, prior)  # as mctx: no NaN if all are 0
    visited = visits > 0
    total = jnp.sum(visits)
    mass = jnp.sum(jnp.where(visited, prior, 0.0))
    weighted_q = jnp.sum(jnp.where(visited, prior * q / jnp.where(visited, mass, 1.0), 0.0))
    mixed = (tree.raw_values[node] + total * weighted_q) / (total + 1)
    return jnp.where(visited, q, mixed)


def _slope(completed: jax.Array, visits: jax.Array, params: GumbelParams) -> jax.Array:
    """dσ/dq: (c_visit + max N) · c_scale / max(q_max − q_min, ε) (1/λ)."""
    spread = jnp.max(completed, -1) - jnp.min(completed, -1)
    return (params.c_visit + jnp.max(visits, -1)) * params.c_scale / jnp.maximum(spread, _EPSILON)


def sigma(tree: mctx.Tree, node: chex.Numeric, params: GumbelParams) -> jax.Array:
    """σ(completed Q) [A]: mctx's ``qtransform_completed_by_mix_value`` (min-max rescaled)."""
    completed = completed_qvalues(tree, node)
    visits = tree.children_visits[node]
    return (completed - jnp.min(completed)) * _slope(completed, visits, params)


def _root_score(considered_visit, gumbel, logits, sigma_q, visits, legal):
    """mctx's ``score_considered`` with illegal actions masked: Gumbel + logits + σ(q)."""
    score = seq_halving.score_considered(considered_visit, gumbel, logits, sigma_q, visits)
    return jnp.where(legal, score, -jnp.inf)


def make_gumbel_selection(params: GumbelParams) -> tree_search.SelectFn:
    """The mctx action-selection function: sequential halving at the root, deterministic inside.

    Reads ``tree.extra_data["gumbel"]`` [A] (this game's noise) and ``["considered"]`` [W] (its
    row of ``considered_visits_table``).
    """

    def select(rng_key, tree: mctx.Tree, node_index, depth=None):
        del rng_key, depth
        logits = tree.children_prior_logits[node_index]
        legal = legal_from_logits(logits)
        visits = tree.children_visits[node_index]
        sigma_q = sigma(tree, node_index, params)
        # root: the action with the best Gumbel + logits + σ(q) among those with the visit
        # count sequential halving asks for at this simulation (index = Σ N at the root)
        row = tree.extra_data["considered"]
        simulation = jnp.minimum(jnp.sum(visits), row.shape[-1] - 1)
        root = _root_score(
            row[simulation], tree.extra_data["gumbel"], logits, sigma_q, visits, legal
        )
        # interior: visit frequencies that track the improved policy softmax(logits + σ(q))
        improved = jax.nn.softmax(logits + sigma_q)
        interior = improved - visits / (1.0 + jnp.sum(visits))
        score = jnp.where(node_index == tree_search.Tree.ROOT_INDEX, root, interior)
        return first_argmax(jnp.where(legal, score, -jnp.inf))

    return select


def search(
    root: tree_search.NodeEval,
    expand_fn: tree_search.ExpandFn,
    budgets: chex.Array,
    noise: chex.Array,
    table: chex.Array,
    *,
    num_nodes: int,
    params: tree_search.SearchParams,
    gumbel: GumbelParams,
) -> mctx.Tree:
    """Gumbel MuZero with ``budgets[b]`` simulations for game b, in one batched loop.

    ``noise`` [B, A] is each game's Gumbel noise (``gumbel_noise``), ``table`` the
    ``considered_visits_table`` (budgets index its second axis; larger ones are clipped).
    """
    budgets = jnp.asarray(budgets, jnp.int32)
    return tree_search.search(
        root,
        expand_fn,
        budgets,
        jnp.zeros(budgets.shape, jnp.float32),  # c_puct: unused by Gumbel selection
        num_nodes=num_nodes,
        params=params,
        select_fn=make_gumbel_selection(gumbel),
        extra_data=root_extra_data(root, budgets, noise, table, gumbel),
    )


def root_extra_data(
    root: tree_search.NodeEval,
    budgets: chex.Array,
    noise: chex.Array,
    table: chex.Array,
    params: GumbelParams,
) -> dict[str, jax.Array]:
    """``tree.extra_data`` for Gumbel selection: each game's noise and its halving row.

    The row depends on the budget and on the number of considered actions, min(max_considered,
    legal moves at the root), as mctx's table lookup does.
    """
    legal = legal_from_logits(root.prior_logits)
    considered = jnp.minimum(params.max_considered, legal.sum(-1))
    budgets = jnp.clip(jnp.asarray(budgets, jnp.int32), 0, table.shape[1] - 1)
    return {"gumbel": jnp.asarray(noise, jnp.float32), "considered": table[considered, budgets]}


def improve(
    tree: mctx.Tree,
    noise: chex.Array,
    params: GumbelParams,
    anchor_logits: chex.Array | None = None,
) -> GumbelResult:
    """The root's improved policy, mctx's action and the effective λ, per game (batched tree)."""
    root = tree_search.Tree.ROOT_INDEX
    logits = tree.children_prior_logits[:, root]
    legal = legal_from_logits(logits)
    visits = tree.children_visits[:, root]
    completed = jax.vmap(completed_qvalues, in_axes=(0, None))(tree, root)
    slope = _slope(completed, visits, params)
    sigma_q = (completed - jnp.min(completed, -1, keepdims=True)) * slope[:, None]
    anchor = logits if anchor_logits is None else jnp.asarray(anchor_logits, jnp.float32)
    policy = jax.nn.softmax(jnp.where(legal, anchor + sigma_q, ILLEGAL_LOGIT), axis=-1)
    policy = jnp.where(legal, policy, 0.0)
    most = jnp.max(visits, -1, keepdims=True)
    score = jax.vmap(_root_score)(most, noise, logits, sigma_q, visits, legal)
    searched = visits.sum(-1) > 0
    return GumbelResult(
        policy=policy,
        action=jnp.argmax(score, -1).astype(jnp.int32),
        visits=visits,
        effective_lambda=jnp.where(searched, 1.0 / slope, jnp.nan).astype(jnp.float32),
        search_value=tree.node_values[:, root],
    )
