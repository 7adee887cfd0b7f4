"""piKL-Hedge (Jacob et al. 2022, seed 002, Algorithm 1) for batches of two-player matrix games.

Each player i maximises the KL-regularised utility of the seed's equation (5),

    u_{i,λ_i}(π_i, π_{-i}) = u_i(π_i, π_{-i}) − λ_i · D_KL(π_i ‖ τ_i),

with τ_i the anchor (human) policy and λ_i ≥ 0. Algorithm 1 keeps, for every action a, the
cumulative utility ("regret" numerator) Q_i^t(a) = Q_i^{t−1}(a) + u_i(a, a_{−i}^t) and plays

    π_i^t(a) ∝ exp( (η · Q_i^{t−1}(a) + η · t · λ_i · log τ_i(a)) / (1 + η · t · λ_i) ),

i.e. follow-the-regularised-leader with entropy step 1/η on the regularised utilities of rounds
1..t (the KL part of round t is known before playing it, so it enters with weight t). λ_i = 0 is
plain Hedge, π^t ∝ exp(η Q^{t−1}); λ_i → ∞ gives π^t = τ_i at every iteration. (The seed's text
lost its LaTeX; this is the formula re-derived as the maximiser of
⟨π, Q^{t−1}⟩ − t λ KL(π‖τ) + (1/η) H(π), which is what its Algorithm 1 computes.)

The seed proves O(log T) regret in the regularised utilities for λ_i > 0; for λ = 0 the Hedge
bound with rewards in a range of width w is Regret_T ≤ ln|A|/η + η w² T / 8, so in a zero-sum
game the average strategies' duality gap is at most (Regret_T^1 + Regret_T^2) / T
(``hedge_gap_bound``).

``full_information=True`` (the default) updates Q with the expected utility against the
opponent's current mixed policy, u_i(a, π_{−i}^t) (deterministic, what a search uses);
``full_information=False`` samples a_{−i}^t ~ π_{−i}^t as in Algorithm 1.
"""

from __future__ import annotations

import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class PiKLConfig:
    """Iterations, Hedge step η, and whether utilities are expected (full information) or sampled."""

    iterations: int = 1000
    eta: float = 0.1
    full_information: bool = True


@flax.struct.dataclass
class PiKLResult:
    """Average and last iterates of both players (``[B, n]`` row, ``[B, m]`` column)."""

    avg_row: jax.Array
    avg_col: jax.Array
    last_row: jax.Array
    last_col: jax.Array
    gap_trace: jax.Array  # [iterations, B]: zero-sum duality gap of the running averages


def pikl_policy(
    cum_utility: jax.Array, log_tau: jax.Array, lam: jax.Array, eta: float, t
) -> jax.Array:
    """π^t from the cumulative utilities Q^{t−1}, the anchor log τ, λ and the round t (1-based)."""
    weight = eta * t * lam[..., None]
    logits = (eta * cum_utility + weight * log_tau) / (1.0 + weight)
    return jax.nn.softmax(logits, axis=-1)


def duality_gap(payoff: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    """Exploitability (NashConv) of (x, y) in the zero-sum game where the row player gets ``payoff``:
    max_a (A y)_a − min_b (xᵀ A)_b ≥ 0, zero exactly at a Nash equilibrium."""
    best_row = jnp.max(jnp.einsum("...nm,...m->...n", payoff, y), axis=-1)
    best_col = jnp.min(jnp.einsum("...nm,...n->...m", payoff, x), axis=-1)
    return best_row - best_col


def pikl_hedge(
    payoff_row: jax.Array,
    payoff_col: jax.Array,
    tau_row: jax.Array,
    tau_col: jax.Array,
    lam_row,
    lam_col,
    config: PiKLConfig = PiKLConfig(),
    rng: jax.Array | None = None,
) -> PiKLResult:
    """Run piKL-Hedge for both players on a batch of general-sum matrix games.

    ``payoff_row[b, a, c]`` / ``payoff_col[b, a, c]``: utilities of the row / column player when
    they play (a, c); ``tau_*``: anchors (strictly positive where an action may be played);
    ``lam_*``: scalars or ``[B]``. ``gap_trace`` is meaningful for zero-sum games
    (``payoff_col = −payoff_row``).
    """
    payoff_row = jnp.asarray(payoff_row, jnp.float32)
    payoff_col = jnp.asarray(payoff_col, jnp.float32)
    if payoff_row.ndim == 2:  # one game: run it as a batch of one
        out = pikl_hedge(
            payoff_row[None],
            jnp.asarray(payoff_col)[None],
            jnp.asarray(tau_row)[None],
            jnp.asarray(tau_col)[None],
            lam_row,
            lam_col,
            config,
            rng,
        )
        return PiKLResult(
            out.avg_row[0], out.avg_col[0], out.last_row[0], out.last_col[0], out.gap_trace[:, 0]
        )
    batch, n, m = payoff_row.shape
    if payoff_col.shape != payoff_row.shape:
        raise ValueError(f"payoff_col {payoff_col.shape} must match payoff_row {payoff_row.shape}")
    lam_r = jnp.broadcast_to(jnp.asarray(lam_row, jnp.float32), (batch,))
    lam_c = jnp.broadcast_to(jnp.asarray(lam_col, jnp.float32), (batch,))
    log_tau_r = jnp.log(jnp.broadcast_to(jnp.asarray(tau_row, jnp.float32), (batch, n)))
    log_tau_c = jnp.log(jnp.broadcast_to(jnp.asarray(tau_col, jnp.float32), (batch, m)))
    if not config.full_information and rng is None:
        raise ValueError("pikl_hedge: sampled play (full_information=False) needs an rng")
    rng = jax.random.key(0) if rng is None else rng
    return _run(payoff_row, payoff_col, log_tau_r, log_tau_c, lam_r, lam_c, rng, config)


@jax.jit(static_argnames=("config",))
def _run(payoff_row, payoff_col, log_tau_r, log_tau_c, lam_r, lam_c, rng, config: PiKLConfig):
    batch, n, m = payoff_row.shape
    eta = config.eta

    def step(carry, t):
        q_r, q_c, sum_r, sum_c, key = carry
        pi_r = pikl_policy(q_r, log_tau_r, lam_r, eta, t)
        pi_c = pikl_policy(q_c, log_tau_c, lam_c, eta, t)
        if config.full_information:
            u_r = jnp.einsum("bnm,bm->bn", payoff_row, pi_c)
            u_c = jnp.einsum("bnm,bn->bm", payoff_col, pi_r)
        else:
            key, kr, kc = jax.random.split(key, 3)
            a_r = jax.random.categorical(kr, jnp.log(pi_r), axis=-1)
            a_c = jax.random.categorical(kc, jnp.log(pi_c), axis=-1)
            u_r = jnp.take_along_axis(payoff_row, a_c[:, None, None], axis=2)[..., 0]
            u_c = jnp.take_along_axis(payoff_col, a_r[:, None, None], axis=1)[:, 0, :]
        sum_r, sum_c = sum_r + pi_r, sum_c + pi_c
        gap = duality_gap(payoff_row, sum_r / t, sum_c / t)
        return (q_r + u_r, q_c + u_c, sum_r, sum_c, key), (pi_r, pi_c, gap)

    init = (
        jnp.zeros((batch, n)),
        jnp.zeros((batch, m)),
        jnp.zeros((batch, n)),
        jnp.zeros((batch, m)),
        rng,
    )
    ts = jnp.arange(1, config.iterations + 1, dtype=jnp.float32)
    (_, _, sum_r, sum_c, _), (pis_r, pis_c, gaps) = jax.lax.scan(step, init, ts)
    return PiKLResult(
        avg_row=sum_r / config.iterations,
        avg_col=sum_c / config.iterations,
        last_row=pis_r[-1],
        last_col=pis_c[-1],
        gap_trace=gaps,
    )


def hedge_gap_bound(num_row: int, num_col: int, iterations: int, eta: float, width: float) -> float:
    """Bound on the zero-sum duality gap of Hedge's (λ = 0) average strategies after T iterations:
    (ln n + ln m)/(η T) + η w² / 4, with w the width of the payoff range."""
    return (math.log(num_row) + math.log(num_col)) / (eta * iterations) + eta * width**2 / 4
