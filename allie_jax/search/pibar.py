"""The final search policy: Grill et al. (2020)'s π̄, its KL weight λ, and the visit distribution.

π̄ = argmax_π  q·π − λ · KL(anchor ‖ π)  over a support (the legal moves, or the visited ones),
whose solution is π̄(a) = λ · anchor(a) / (α − q(a)) with α the unique root of Σ π̄ = 1 in
[max_a(q(a) + λ anchor(a)), max_a q(a) + λ]. The sum is monotone in α, so bisection finds it.
The anchor is the human policy the search is held to (the model's prior unless another is given).

q is shifted by its maximum first: α then lies in [0, λ_N] whatever the values, and the
differences α − q(a), which can be as small as λ_N · prior(a) ≈ 1e-5, do not drown in the
rounding error of numbers of size |q| ≈ 1 (float32 has ~7 digits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_TINY = 1e-30


def kl_lambda(
    c: jax.Array, total_visits: jax.Array, num_legal: jax.Array, *, sqrt: bool = True
) -> jax.Array:
    """λ_N = c · sqrt(ΣN) / (|A| + ΣN) (Grill et al.), or c · ΣN / (|A| + ΣN) (released code)."""
    n = jnp.asarray(total_visits, jnp.float32)
    scale = jnp.sqrt(n) if sqrt else n
    return jnp.asarray(c, jnp.float32) * scale / (jnp.asarray(num_legal, jnp.float32) + n)


def schedule_lambda(
    schedule: str,
    *,
    anchor_lambda: float,
    c_puct: jax.Array,
    scaled_c_puct: jax.Array,
    total_visits: jax.Array,
    num_legal: jax.Array,
    sqrt: bool = True,
) -> jax.Array:
    """float32 [B]: the anchor's KL weight λ under ``SearchConfig.lambda_schedule``.

    "constant": ``anchor_lambda`` whatever the budget; "paper": c_puct·sqrt(ΣN)/(|A|+ΣN) with
    c_puct unscaled; "released": the same with the per-game c_puct·sqrt(mean_sims/N)
    (``scaled_c_puct``). ``sqrt=False`` drops the square root in the last two. A row with no
    visits gets 0 from the last two (π̄ then returns the anchor).
    """
    total = jnp.asarray(total_visits, jnp.float32)
    if schedule == "constant":
        return jnp.full(total.shape, anchor_lambda, jnp.float32)
    if schedule == "paper":
        c = jnp.broadcast_to(jnp.asarray(c_puct, jnp.float32), total.shape)
    elif schedule == "released":
        c = jnp.asarray(scaled_c_puct, jnp.float32)
    else:
        raise ValueError(f"lambda_schedule={schedule!r}: expected constant, paper or released")
    return kl_lambda(c, total, num_legal, sqrt=sqrt)


def visited_support(legal: jax.Array, visits: jax.Array) -> jax.Array:
    """bool [B, A]: the visited legal moves of a row that has visits, its legal moves otherwise.

    The final policy's support under ``SearchConfig.final_support="visited"``: the search then
    never plays (or puts mass on) a move it holds no value for.
    """
    visited = legal & (jnp.asarray(visits) > 0)
    return jnp.where(visited.any(-1, keepdims=True), visited, legal)


def pibar(
    q: jax.Array,
    prior: jax.Array,
    legal: jax.Array,
    lam: jax.Array,
    *,
    iterations: int = 64,
) -> jax.Array:
    """π̄ [B, A] from values q [B, A] (mover's view), anchor ``prior`` [B, A], support ``legal``
    bool [B, A], λ [B].

    Moves off the support get probability 0; the anchor is renormalised over the support (so a
    restricted support solves the same problem with the anchor conditioned on it). A row with
    λ ≤ 0 (no visits) returns its (renormalised) anchor.
    """
    q = jnp.asarray(q, jnp.float32)
    prior = jnp.where(legal, jnp.asarray(prior, jnp.float32), 0.0)
    prior = prior / jnp.maximum(prior.sum(-1, keepdims=True), _TINY)
    lam = jnp.asarray(lam, jnp.float32)
    safe_lam = jnp.maximum(lam, _TINY)[:, None]
    q_max = jnp.max(jnp.where(legal, q, -jnp.inf), axis=-1, keepdims=True)
    q_max = jnp.where(jnp.isfinite(q_max), q_max, 0.0)
    shifted = jnp.where(legal, q - q_max, -jnp.inf)  # <= 0 on legal moves, max exactly 0

    lo = jnp.max(jnp.where(legal, shifted + safe_lam * prior, -jnp.inf), axis=-1)
    hi = safe_lam[:, 0]  # max(shifted) + λ

    def mass(alpha: jax.Array) -> jax.Array:
        denom = jnp.maximum(alpha[:, None] - shifted, _TINY)
        return jnp.where(legal, safe_lam * prior / denom, 0.0)

    def step(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        above = mass(mid).sum(-1) > 1.0
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = jax.lax.fori_loop(0, iterations, step, (lo, hi))
    p = mass(0.5 * (lo + hi))
    p = p / jnp.maximum(p.sum(-1, keepdims=True), _TINY)
    return jnp.where((lam > 0)[:, None], p, prior)


def visit_policy(visits: jax.Array, prior: jax.Array) -> jax.Array:
    """N(a) / ΣN; rows without visits fall back to the prior (the released budget-0 rule)."""
    visits = jnp.asarray(visits, jnp.float32)
    total = visits.sum(-1, keepdims=True)
    return jnp.where(total > 0, visits / jnp.maximum(total, 1.0), prior)


def regularised_objective(
    pi: jax.Array, q: jax.Array, prior: jax.Array, legal: jax.Array, lam: jax.Array
) -> jax.Array:
    """q·π − λ KL(prior ‖ π) over legal moves (the prior is the anchor: KL(anchor ‖ π)): the
    quantity π̄ maximises (for tests and checks)."""
    prior = jnp.where(legal, prior, 0.0)
    kl = jnp.where(
        legal & (prior > 0),
        prior * (jnp.log(jnp.maximum(prior, _TINY)) - jnp.log(jnp.maximum(pi, _TINY))),
        0.0,
    ).sum(-1)
    return jnp.where(legal, q * pi, 0.0).sum(-1) - lam * kl
