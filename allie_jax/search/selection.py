"""Allie's pUCT child selection, as an mctx action-selection function.

Mirrors the released ``MCTS.ucb_score`` (y0mingzhang/allie):

    score(a) = Q(s, a) + (log((N(s) + c_base + 1) / c_base) + c) · sqrt(N(s)) · P(s, a) / (1 + N(s, a))

with values in [−1, 1], not normalised, from the view of the player to move at s. Differences,
both fixes listed in SPEC §4: N(s) counts the node's own evaluation (mctx's ``node_visits``; the
released root started at 0 so its first simulation scored every child 0), and an unvisited child
gets a first-play-urgency value instead of the released Q = 0 (``fpu_mode="absolute", fpu=0``
reproduces the released rule).

c is per game (``tree.extra_data["c_puct"]``: c_puct · sqrt(mean_sims / budget)). Illegal moves
carry prior logits at or below ``ILLEGAL_LOGIT`` at every node and are never selected. Ties go
to the lowest action id (``jnp.argmax``), which the Python reference reproduces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx

from allie_jax.search import pibar

ILLEGAL_LOGIT = (
    -1e9
)  # prior logit of an illegal move (finite: softmax of a terminal node stays NaN-free)
_LEGAL_THRESHOLD = 0.5 * ILLEGAL_LOGIT


def legal_from_logits(logits: jax.Array) -> jax.Array:
    return logits > _LEGAL_THRESHOLD


def mask_logits(logits: jax.Array, legal: jax.Array) -> jax.Array:
    """Prior logits restricted to legal moves (softmax over the legal set, SPEC §4)."""
    return jnp.where(legal, logits, ILLEGAL_LOGIT)


# ``tree.extra_data`` key whose presence says the tree's ``children_prior_logits`` are log-priors
# (``log_prior``); it holds the root's logits as the model gave them (for the final policy).
RAW_ROOT_LOGITS = "raw_root_logits"
# ``tree.extra_data`` key of the caller's anchor at the root (float [B, A], a distribution over the
# legal moves): KL selection regularises the root towards it instead of the model's prior, as the
# final policy does (``Searcher.run(anchor_logits=...)``: e.g. Allie's prior with a Maia anchor).
ROOT_ANCHOR = "root_anchor"


def log_prior(logits: jax.Array) -> jax.Array:
    """Log-softmax over the legal moves (last axis); illegal moves stay at ``ILLEGAL_LOGIT``.

    A tree that stores these instead of raw logits lets pUCT read a node's prior as one
    ``exp`` per visit instead of a softmax (max, exp, sum, divide over all 1968 moves at every
    tree level of every simulation).
    """
    legal = legal_from_logits(logits)
    return jnp.where(legal, jax.nn.log_softmax(logits, axis=-1), ILLEGAL_LOGIT)


def first_argmax(x: jax.Array) -> jax.Array:
    """int32 [...]: ``jnp.argmax(x, -1)`` (ties → the lowest index) as two plain reductions.

    XLA on CPU lowers argmax to one variadic (value, index) reduction that does not vectorise;
    inside the selection loop it was the largest single cost of a small model's simulation step
    (depth x rows x 1968 actions per step). A max, then the lowest index holding it, is the same
    answer for any x without NaN (a NaN row gives 0, as argmax does for an all-NaN row).
    """
    size = x.shape[-1]
    best = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.min(jnp.where(x == best, jnp.arange(size, dtype=jnp.int32), size), axis=-1)
    return jnp.where(index == size, 0, index).astype(jnp.int32)


COMPLETIONS = ("mixed", "absolute", "reduction")  # how ``completed_q`` fills unvisited children


def mixed_value(tree: mctx.Tree, node_index: chex.Numeric) -> jax.Array:
    """mctx's ``qtransform_completed_by_mix_value`` value for unvisited children (unbatched).

    (V(s) + ΣN · Σ_visited π(a)·Q(s, a) / Σ_visited π(a)) / (ΣN + 1): the raw value interpolated
    with the prior-weighted mean of the visited Q's, so an unvisited move is worth what the
    search has seen on average, not more (the root value can beat every visited move's Q and
    make π̄ pick a move the search never looked at).
    """
    q = tree.qvalues(node_index)
    visits = tree.children_visits[node_index]
    prior = jax.nn.softmax(tree.children_prior_logits[node_index])  # log-priors: softmax = exp
    prior = jnp.maximum(jnp.finfo(prior.dtype).tiny, prior)  # as mctx: no NaN if all are 0
    visited = visits > 0
    total = jnp.sum(visits)
    mass = jnp.sum(jnp.where(visited, prior, 0.0))
    weighted_q = jnp.sum(jnp.where(visited, prior * q / jnp.where(visited, mass, 1.0), 0.0))
    return (tree.raw_values[node_index] + total * weighted_q) / (total + 1)


def completed_q(
    tree: mctx.Tree, node_index: chex.Numeric, *, fpu_mode: str = "mixed", fpu: float = 0.0
) -> jax.Array:
    """Q(s, ·) [A] of an unbatched tree: visited children's mean values, a completion for the rest.

    The one completed-Q of the package (pUCT selection, π̄, Gumbel's σ, Maia's search):
    ``fpu_mode`` "mixed" is mctx's completion (``mixed_value``: the final policies and Gumbel),
    "absolute" gives unvisited children ``fpu``, "reduction" the parent's running value minus
    ``fpu`` (pUCT's first-play urgency).
    """
    visited_q = tree.qvalues(node_index)
    if fpu_mode == "mixed":
        first_play = mixed_value(tree, node_index)
    elif fpu_mode == "absolute":
        first_play = jnp.asarray(fpu, visited_q.dtype)
    elif fpu_mode == "reduction":  # the parent's running value (its mover's view) minus fpu
        first_play = tree.node_values[node_index] - fpu
    else:
        raise ValueError(f"fpu_mode={fpu_mode!r}: expected one of {list(COMPLETIONS)}")
    return jnp.where(tree.children_visits[node_index] > 0, visited_q, first_play)


def make_puct_selection(
    *, c_base: float, fpu_mode: str, fpu: float
) -> Callable[[chex.PRNGKey, mctx.Tree, chex.Numeric, chex.Numeric], chex.Array]:
    """An mctx ``(rng_key, tree, node_index, depth) -> action`` function (used at every node)."""

    def select(rng_key, tree: mctx.Tree, node_index, depth=None):
        del rng_key, depth  # mctx calls root selection without depth
        logits = tree.children_prior_logits[node_index]
        legal = legal_from_logits(logits)
        # a tree of log-priors (``log_prior``; static: the key is in the pytree or not)
        prior = jnp.exp(logits) if RAW_ROOT_LOGITS in tree.extra_data else jax.nn.softmax(logits)
        parent_visits = tree.node_visits[node_index].astype(jnp.float32)
        c = tree.extra_data["c_puct"]
        factor = (jnp.log((parent_visits + c_base + 1.0) / c_base) + c) * jnp.sqrt(parent_visits)
        q = completed_q(tree, node_index, fpu_mode=fpu_mode, fpu=fpu)
        visits = tree.children_visits[node_index].astype(jnp.float32)
        score = q + factor * prior / (1.0 + visits)
        return first_argmax(jnp.where(legal, score, -jnp.inf))

    return select


class KLParams(NamedTuple):
    """``make_kl_selection``'s settings as one static, hashable value (a jit static argument)."""

    anchor_lambda: float
    lambda_schedule: str = "constant"
    c_puct: float = 1.25
    lambda_sqrt: bool = True
    iterations: int = 64


def make_kl_selection(
    *,
    anchor_lambda: float,
    lambda_schedule: str = "constant",
    c_puct: float = 1.25,
    lambda_sqrt: bool = True,
    iterations: int = 64,
) -> Callable[[chex.PRNGKey, mctx.Tree, chex.Numeric, chex.Numeric], chex.Array]:
    """KL-regularised selection at every node (piKL applied recursively): an mctx selector.

    At node s, π̄_s = argmax_π Σ_a Q(s, a)·π(a) − λ·KL(P(s, ·) ‖ π) (``pibar.pibar``) on the
    completed Q (mctx's mixed value for unvisited children) with the node's prior as anchor and
    λ from the schedule (``pibar.schedule_lambda``; "released" reads the game's scaled c from
    ``tree.extra_data["c_puct"]``); the child taken is argmax_a π̄_s(a) − N(s, a)/(1 + ΣN(s)),
    Grill et al.'s deterministic choice whose visit frequencies track π̄_s. So every node's
    visits, not only the root's final policy, are held to the anchor with the strength the user
    set. A node without visited children selects its prior's argmax. Ties go to the lowest id.
    With ``tree.extra_data[ROOT_ANCHOR]`` the root's anchor is the caller's, not its prior.
    """

    def select(rng_key, tree: mctx.Tree, node_index, depth=None):
        del rng_key, depth
        logits = tree.children_prior_logits[node_index]
        legal = legal_from_logits(logits)
        prior = jnp.exp(logits) if RAW_ROOT_LOGITS in tree.extra_data else jax.nn.softmax(logits)
        prior = jnp.where(legal, prior, 0.0)
        if ROOT_ANCHOR in tree.extra_data:  # static: the tree carries the caller's root anchor
            prior = jnp.where(
                node_index == mctx.Tree.ROOT_INDEX, tree.extra_data[ROOT_ANCHOR], prior
            )
        visits = tree.children_visits[node_index]
        q = completed_q(tree, node_index, fpu_mode="mixed")
        lam = pibar.schedule_lambda(
            lambda_schedule,
            anchor_lambda=anchor_lambda,
            c_puct=c_puct,
            scaled_c_puct=tree.extra_data["c_puct"],
            total_visits=jnp.sum(visits),
            num_legal=jnp.sum(legal),
            sqrt=lambda_sqrt,
        )
        pi = pibar.pibar(q[None], prior[None], legal[None], lam[None], iterations=iterations)[0]
        total = jnp.sum(visits).astype(jnp.float32)
        score = pi - visits.astype(jnp.float32) / (1.0 + total)
        return first_argmax(jnp.where(legal, score, -jnp.inf))

    return select
