"""The end of a search: the final policy of every root from its tree, the move and resignation.

One rule for every family and mode: π̄ (completed Q, λ from the user's schedule) or the visit
distribution for the pUCT modes, Gumbel's improved policy for the Gumbel ones, the tempered
prior (or anchor) for a row that ran no simulation; then ``decision``'s move rule and
resignation rule, in the callers' row order (a row's move does not depend on how the batch was
sorted by budget).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import vocab
from allie_jax.search import decision, gumbel, pibar, selection
from allie_jax.search.config import SearchConfig
from allie_jax.search.leaves import take_rows


class SortedRows(NamedTuple):
    """Each row's plan after ``steps.start`` sorted the batch (by budget, if it sorted).

    ``order[i]`` is the callers' row at sorted row i; ``budgets`` the simulations of each sorted
    row (after the search: the simulations it actually ran); ``c_puct`` its budget-scaled c.
    """

    order: jax.Array  # int32 [B]
    budgets: jax.Array  # int32 [B]
    c_puct: jax.Array  # float32 [B]


class MoveInputs(NamedTuple):
    """What the move rule needs besides the tree (callers' row order).

    ``anchor_logits`` (None: the model's prior) is the policy the final one is regularised
    towards: π̄'s KL term, Gumbel's softmax(anchor + σ), the budget-0 rows' tempered policy.
    """

    argmax_rows: jax.Array  # bool [B]: rows whose move is the final policy's argmax
    rng: jax.Array  # the move's key (Gumbel noise folds a stream out of it)
    anchor_logits: jax.Array | None = None  # float32 [B, 1968]


def finish(
    tree,
    rows: SortedRows,
    root_out,
    move: MoveInputs,
    config: SearchConfig,
    sorted_rows: bool,
) -> dict[str, jax.Array]:
    """The final policy from the searched tree, back in the callers' row order, and the move.

    ``rows.budgets``: the simulations each (sorted) row actually ran; a row with 0 plays from
    the tempered prior (or anchor) as in ``policy``.
    """
    budgets_s, c_puct_s, order = rows.budgets, rows.c_puct, rows.order
    argmax_rows, rng, anchor_logits = move
    prior_logits = tree.extra_data.get(selection.RAW_ROOT_LOGITS, tree.children_prior_logits[:, 0])
    legal = selection.legal_from_logits(prior_logits)
    prior = decision.legal_prior(prior_logits, legal)
    anchor = prior_logits
    if anchor_logits is not None:
        anchor = take_rows(anchor_logits.astype(jnp.float32), order, sorted_rows)
        anchor = selection.mask_logits(anchor, legal)
    tempered = decision.legal_prior(anchor, legal, config.temperature)
    visits = tree.children_visits[:, 0]
    if config.gumbel:
        improved = gumbel.improve(tree, tree.extra_data["gumbel"], gumbel_params(config), anchor)
        searched, lam = improved.policy, improved.effective_lambda
    else:
        anchor_prior = decision.legal_prior(anchor, legal)
        # completed Q (mctx's mixed value) and λ from the user's schedule (search/pibar.py)
        q = jax.vmap(lambda t: selection.completed_q(t, 0, fpu_mode="mixed"))(tree)
        lam = pibar.schedule_lambda(
            config.lambda_schedule,
            anchor_lambda=config.anchor_lambda,
            c_puct=config.c_puct,
            scaled_c_puct=c_puct_s,
            total_visits=visits.sum(-1),
            num_legal=legal.sum(-1),
            sqrt=config.lambda_sqrt,
        )
        support = legal
        if config.final_support == "visited":
            support = pibar.visited_support(legal, visits)
        if config.final_policy == "pibar":
            searched = pibar.pibar(
                q, anchor_prior, support, lam, iterations=config.pibar_iterations
            )
        else:
            searched = pibar.visit_policy(visits, anchor_prior)
    lam = jnp.where(budgets_s > 0, lam, jnp.nan).astype(jnp.float32)
    policy = jnp.where((budgets_s > 0)[:, None], searched, tempered)
    search_value = tree.node_values[:, 0]
    root_value = tree.raw_values[:, 0]
    # back to the callers' row order before sampling, so a row's move does not depend on how
    # the batch was sorted
    inverse = jnp.argsort(order)
    legal, prior, policy, visits, search_value, root_value, lam = take_rows(
        (legal, prior, policy, visits, search_value, root_value, lam), inverse, sorted_rows
    )
    return {
        "move_id": decision.draw_moves(policy, legal, argmax_rows, rng),
        "policy": policy,
        "prior": prior,
        "visits": visits.astype(jnp.int32),
        "resign": decision.resign_flags(root_out.policy_logits, legal, root_value, config),
        "search_value": search_value,
        "effective_lambda": lam,
    }


def gumbel_params(config: SearchConfig) -> gumbel.GumbelParams | None:
    """The Gumbel knobs of a ``gumbel*`` config (static, hashable), None for other modes."""
    if not config.gumbel:
        return None
    return gumbel.GumbelParams(
        c_visit=float(config.gumbel_c_visit),
        c_scale=float(config.gumbel_c_scale),
        max_considered=int(config.gumbel_considered),
        noise_scale=float(config.gumbel_noise),
        transform=config.gumbel_transform,
        anchor_lambda=float(config.anchor_lambda),
        lambda_schedule=config.lambda_schedule,
        lambda_sqrt=bool(config.lambda_sqrt),
        c_puct=float(config.c_puct),
        visited_only=config.final_support == "visited",
    )


def kl_params(config: SearchConfig) -> selection.KLParams | None:
    """The KL selection's knobs (static, hashable) when ``config.selection`` is "kl", else None."""
    if config.selection != "kl":
        return None
    return selection.KLParams(
        anchor_lambda=float(config.anchor_lambda),
        lambda_schedule=config.lambda_schedule,
        c_puct=float(config.c_puct),
        lambda_sqrt=bool(config.lambda_sqrt),
        iterations=int(config.pibar_iterations),
    )


def select_fn(gumbel_params: gumbel.GumbelParams | None, kl: selection.KLParams | None = None):
    """The tree's action selection: Gumbel's for Gumbel modes, KL-regularised for
    ``selection="kl"``, else None (``tree_search``'s default, Allie's pUCT)."""
    if gumbel_params is not None:
        return gumbel.make_gumbel_selection(gumbel_params)
    if kl is not None:
        return selection.make_kl_selection(**kl._asdict())
    return None


@functools.lru_cache(maxsize=4)
def _halving_table_for(max_considered: int, max_sims: int) -> jax.Array:
    return jnp.asarray(gumbel.considered_visits_table(max_considered, max_sims))


def halving_table(config: SearchConfig) -> jax.Array:
    """Sequential halving's rows for every budget up to ``max_sims`` (built once per shape)."""
    return _halving_table_for(config.gumbel_considered, config.max_sims)


def anchor_rows(anchor_logits: Any, n: int, b: int) -> jax.Array | None:
    """The caller's anchor as float32 [b, 1968] (padding rows uniform), checked."""
    if anchor_logits is None:
        return None
    anchor = np.asarray(anchor_logits, np.float32)
    if anchor.ndim != 2 or anchor.shape[0] != n or anchor.shape[1] < vocab.NUM_MOVES:
        raise ValueError(
            f"anchor_logits has shape {anchor.shape}: expected ({n}, {vocab.NUM_MOVES}), "
            "one row of move logits per game"
        )
    anchor = anchor[:, : vocab.NUM_MOVES]
    if np.isnan(anchor).any() or np.isposinf(anchor).any():
        raise ValueError("anchor_logits holds NaN or +inf: expected finite logits (or -inf)")
    anchor = np.where(np.isneginf(anchor), selection.ILLEGAL_LOGIT, anchor)
    return jnp.asarray(np.concatenate([anchor, np.zeros((b - n, anchor.shape[1]), np.float32)]))
