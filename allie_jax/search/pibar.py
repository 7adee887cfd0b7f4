"""The final search policy: Grill et al. (2020)'s π̄ and the visit-count distribution.

π̄ = argmax_π  q·π − λ_N · KL(prior ‖ π)  over the legal moves, whose solution is
π̄(a) = λ_N · prior(a) / (α − q(a)) with α the unique root of Σ π̄ = 1 in
[max_a(q(a) + λ_N prior(a)), max_a q(a) + λ_N]. The sum is monotone in α, so bisection finds it.

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


def pibar(
    q: jax.Array,
    prior: jax.Array,
    legal: jax.Array,
    lam: jax.Array,
    *,
    iterations: int = 64,
) -> jax.Array:
    """π̄ [B, A] from values q [B, A] (mover's view), prior [B, A], legal bool [B, A], λ [B].

    Illegal actions get probability 0. A row with λ ≤ 0 (no visits) returns its prior.
    """
    q = jnp.asarray(q, jnp.float32)
    prior = jnp.where(legal, jnp.asarray(prior, jnp.float32), 0.0)
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
    """q·π − λ KL(prior ‖ π) over legal moves: the quantity π̄ maximises (for tests and checks)."""
    prior = jnp.where(legal, prior, 0.0)
    kl = jnp.where(
        legal & (prior > 0),
        prior * (jnp.log(jnp.maximum(prior, _TINY)) - jnp.log(jnp.maximum(pi, _TINY))),
        0.0,
    ).sum(-1)
    return jnp.where(legal, q * pi, 0.0).sum(-1) - lam * kl
