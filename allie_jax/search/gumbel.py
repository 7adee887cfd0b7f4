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

Completed Q is mctx's ``qtransform_completed_by_mix_value`` (``selection.completed_q``,
"mixed"): unvisited actions take the mixed value (the raw value interpolated with the
prior-weighted visited Q's). σ, the transform of completed Q that joins the logits, comes in two
forms (``GumbelParams.transform``):

- "mctx" (stock): the completed vector is min-max rescaled and multiplied by
  (c_visit + max N) · c_scale. mctx has no notion of illegal moves below the root, so its min/max
  runs over every action, and the illegal ones carry the mixed value: kept as is (in chess some
  action is always illegal, so the range always covers the mixed value), which is what keeps
  budgets 1..N equal to stock (tested). π' = softmax(anchor + σ) then solves
  argmax_p Σ p·q − λ·KL(p ‖ softmax(anchor)) with λ = (q_max − q_min) / ((c_visit + max N) · c_scale):
  λ follows the spread of Q, so a noise-level spread overturns the anchor as fully as a whole
  point (the anchor has no fixed strength; ``c_scale`` is not λ).
- "anchor" (the human-anchored mode): σ = q̂ / λ with λ in value units from the user's
  schedule (``pibar.schedule_lambda``: constant ``anchor_lambda`` by default), no rescaling, at
  the root (sequential halving and π') and inside the tree (interior selection), so
  π' = softmax(log π_anchor + q̂/λ) solves the same problem with the λ the user set. Its
  support may be the visited moves only (``visited_only``), so π' never plays a move the search
  did not look at.

``effective_lambda`` (one per game and move) reports λ either way. The anchor is the model's
prior unless the caller passes ``anchor_logits`` (a separate human policy, e.g. Maia, for
piKL-style play); the search itself (its selection and mixed value) keeps the model's prior. A
game with budget 0 gets π' = softmax(anchor): σ of an unsearched root is 0.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np

from allie_jax import compat
from allie_jax.search import pibar, tree_search
from allie_jax.search.config import DEFAULT_ANCHOR_LAMBDA
from allie_jax.search.selection import (
    ILLEGAL_LOGIT,
    completed_q,
    first_argmax,
    legal_from_logits,
)

MODES = ("gumbel", "gumbel-adaptive")
_EPSILON = 1e-8  # mctx's floor on q_max − q_min when rescaling


TRANSFORMS = ("anchor", "mctx")
_MIN_LAMBDA = 1e-8  # floor on λ in σ = q̂/λ (a "paper"/"released" λ is 0 at a node without visits)


class GumbelParams(NamedTuple):
    """mctx's defaults: ``maxvisit_init``=50, ``value_scale``=0.1, 16 considered, noise scale 1,
    stock σ. ``transform="anchor"`` uses σ = q̂/λ with λ from the other fields (see module doc);
    ``c_puct`` is the unscaled c of the "paper" schedule ("released" reads each game's scaled
    c from ``tree.extra_data["c_puct"]``)."""

    c_visit: float = 50.0
    c_scale: float = 0.1
    max_considered: int = 16
    noise_scale: float = 1.0
    transform: str = "mctx"
    anchor_lambda: float = DEFAULT_ANCHOR_LAMBDA
    lambda_schedule: str = "constant"
    lambda_sqrt: bool = True
    c_puct: float = 1.25
    visited_only: bool = False  # "anchor": π' over the visited moves once the root has visits


class GumbelResult(NamedTuple):
    policy: jax.Array  # float32 [B, A]: softmax(anchor + σ(completed Q)) over legal moves
    action: jax.Array  # int32 [B]: stock mctx's action (Gumbel + logits + σ among most visited)
    visits: jax.Array  # int32 [B, A]: root visit counts
    effective_lambda: jax.Array  # float32 [B]: the KL weight π' is optimal for (NaN: no search)
    search_value: jax.Array  # float32 [B]: root value after search, side to move's view


@functools.lru_cache(maxsize=4)
def considered_visits_table(max_considered: int, max_sims: int) -> np.ndarray:
    """int32 [max_considered + 1, max_sims + 1, max(max_sims, 1)]: mctx's halving schedule.

    ``table[m, n, :n]`` is ``compat.mctx_seq_halving().get_sequence_of_considered_visits(m, n)`` — the visit
    count an action must have to be selectable at simulation i of a budget-n search with m
    considered actions (mctx's ``get_table_of_considered_visits(m, n)[m]``); the rest is 0.
    """
    table = np.zeros((max_considered + 1, max_sims + 1, max(max_sims, 1)), np.int32)
    for m in range(max_considered + 1):
        for n in range(1, max_sims + 1):
            table[m, n, :n] = compat.mctx_seq_halving().get_sequence_of_considered_visits(m, n)
    return table


def gumbel_noise(keys: jax.Array, num_actions: int, scale: float = 1.0) -> jax.Array:
    """float32 [B, A]: for game b the noise stock mctx draws in a batch-1 call with ``keys[b]``."""

    def one(key):
        _, gumbel_rng = jax.random.split(key)
        return scale * jax.random.gumbel(gumbel_rng, (1, num_actions), jnp.float32)[0]

    return jax.vmap(one)(keys)


def completed_qvalues(tree: mctx.Tree, node: chex.Numeric) -> jax.Array:
    """[A] Q(node, ·) with unvisited actions completed by mctx's mixed value (unbatched tree)."""
    return completed_q(tree, node, fpu_mode="mixed")


def _slope(completed: jax.Array, visits: jax.Array, params: GumbelParams) -> jax.Array:
    """Stock dσ/dq: (c_visit + max N) · c_scale / max(q_max − q_min, ε) (1/λ)."""
    spread = jnp.max(completed, -1) - jnp.min(completed, -1)
    return (params.c_visit + jnp.max(visits, -1)) * params.c_scale / jnp.maximum(spread, _EPSILON)


def anchor_lambda(
    visits: jax.Array, legal: jax.Array, scaled_c_puct: jax.Array, params: GumbelParams
) -> jax.Array:
    """λ [...] of the "anchor" transform at a node (visits/legal [..., A], c [...])."""
    return pibar.schedule_lambda(
        params.lambda_schedule,
        anchor_lambda=params.anchor_lambda,
        c_puct=params.c_puct,
        scaled_c_puct=scaled_c_puct,
        total_visits=jnp.sum(visits, -1),
        num_legal=jnp.sum(legal, -1),
        sqrt=params.lambda_sqrt,
    )


def transform(
    completed: jax.Array, visits: jax.Array, params: GumbelParams, lam: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """(σ(completed Q) [..., A], the λ π' = softmax(logits + σ) is optimal for [...]).

    "mctx": min-max rescaled, λ = spread / ((c_visit + max N) · c_scale). "anchor": q̂/λ with the
    given λ, shifted by its maximum (a constant per node: softmax and argmax do not see it).
    """
    if params.transform == "mctx":
        slope = _slope(completed, visits, params)
        sigma_q = (completed - jnp.min(completed, -1, keepdims=True)) * slope[..., None]
        return sigma_q, 1.0 / slope
    if params.transform != "anchor":
        raise ValueError(f"transform={params.transform!r}: expected one of {list(TRANSFORMS)}")
    lam = jnp.asarray(lam, jnp.float32)
    shifted = completed - jnp.max(completed, -1, keepdims=True)
    return shifted / jnp.maximum(lam, _MIN_LAMBDA)[..., None], lam


def sigma(tree: mctx.Tree, node: chex.Numeric, params: GumbelParams) -> jax.Array:
    """σ(completed Q) [A] at a node of an unbatched tree (stock or anchored, see ``transform``)."""
    completed = completed_qvalues(tree, node)
    visits = tree.children_visits[node]
    lam = None
    if params.transform == "anchor":
        legal = legal_from_logits(tree.children_prior_logits[node])
        lam = anchor_lambda(visits, legal, tree.extra_data["c_puct"], params)
    return transform(completed, visits, params, lam)[0]


def _root_score(considered_visit, gumbel, logits, sigma_q, visits, legal):
    """mctx's ``score_considered`` with illegal actions masked: Gumbel + logits + σ(q)."""
    score = compat.mctx_seq_halving().score_considered(
        considered_visit, gumbel, logits, sigma_q, visits
    )
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
    c_puct: chex.Array | None = None,
) -> mctx.Tree:
    """Gumbel MuZero with ``budgets[b]`` simulations for game b, in one batched loop.

    ``noise`` [B, A] is each game's Gumbel noise (``gumbel_noise``), ``table`` the
    ``considered_visits_table`` (budgets index its second axis; larger ones are clipped).
    ``c_puct`` [B] (default 0) is read only by the "anchor" transform's "released" schedule.
    """
    budgets = jnp.asarray(budgets, jnp.int32)
    if c_puct is None:
        c_puct = jnp.zeros(budgets.shape, jnp.float32)
    return tree_search.search(
        root,
        expand_fn,
        budgets,
        jnp.asarray(c_puct, jnp.float32),
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
    lam = None
    support = legal
    if params.transform == "anchor":
        lam = anchor_lambda(visits, legal, tree.extra_data["c_puct"], params)
        if params.visited_only:
            support = pibar.visited_support(legal, visits)
    sigma_q, lam = transform(completed, visits, params, lam)
    anchor = logits if anchor_logits is None else jnp.asarray(anchor_logits, jnp.float32)
    policy = jax.nn.softmax(jnp.where(support, anchor + sigma_q, ILLEGAL_LOGIT), axis=-1)
    policy = jnp.where(support, policy, 0.0)
    most = jnp.max(visits, -1, keepdims=True)
    score = jax.vmap(_root_score)(most, noise, logits, sigma_q, visits, legal)
    searched = visits.sum(-1) > 0
    return GumbelResult(
        policy=policy,
        action=jnp.argmax(score, -1).astype(jnp.int32),
        visits=visits,
        effective_lambda=jnp.where(searched, lam, jnp.nan).astype(jnp.float32),
        search_value=tree.node_values[:, root],
    )
