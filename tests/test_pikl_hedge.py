"""piKL-Hedge on matrix games: λ → ∞ returns the anchor, λ = 0 solves zero-sum games (checked against
scipy's linear-programming solution) within the Hedge bound, λ > 0 reaches the regularised
equilibrium π_i ∝ τ_i · exp(u_i(·, π_−i) / λ_i)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from allie_jax.search.pikl_hedge import PiKLConfig, duality_gap, hedge_gap_bound, pikl_hedge

RPS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])


def lp_value(payoff: np.ndarray) -> tuple[float, np.ndarray]:
    """Value and a maximin strategy of the row player: max v s.t. xᵀA ≥ v, Σx = 1, x ≥ 0."""
    n, m = payoff.shape
    c = np.zeros(n + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-payoff.T, np.ones((m, 1))])
    a_eq = np.hstack([np.ones((1, n)), np.zeros((1, 1))])
    res = linprog(
        c,
        A_ub=a_ub,
        b_ub=np.zeros(m),
        A_eq=a_eq,
        b_eq=[1.0],
        bounds=[(0, None)] * n + [(None, None)],
    )
    assert res.success
    return float(res.x[-1]), res.x[:n]


def test_infinite_lambda_returns_the_anchor():
    rng = np.random.default_rng(0)
    payoff = rng.uniform(-1, 1, size=(4, 5, 6))
    tau_r = rng.dirichlet(np.ones(5), size=4)
    tau_c = rng.dirichlet(np.ones(6), size=4)
    out = pikl_hedge(payoff, -payoff, tau_r, tau_c, 1e9, 1e9, PiKLConfig(iterations=200, eta=0.5))
    np.testing.assert_allclose(out.avg_row, tau_r, atol=1e-5)
    np.testing.assert_allclose(out.last_col, tau_c, atol=1e-5)


def test_rps_lambda_zero_converges_to_the_lp_equilibrium():
    uniform = np.ones(3) / 3
    tau = np.array([0.8, 0.1, 0.1])  # anchor ignored at λ = 0
    cfg = PiKLConfig(iterations=4000, eta=0.05)
    out = pikl_hedge(RPS, -RPS, tau, tau, 0.0, 0.0, cfg)
    value, x_star = lp_value(RPS)
    assert value == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(x_star, uniform, atol=1e-6)
    np.testing.assert_allclose(out.avg_row, uniform, atol=2e-2)
    gap = float(duality_gap(RPS, out.avg_row, out.avg_col))
    assert gap <= hedge_gap_bound(3, 3, cfg.iterations, cfg.eta, width=2.0)
    assert gap < 0.05


def test_random_zero_sum_games_against_linprog_and_the_bound():
    rng = np.random.default_rng(1)
    games = rng.uniform(-1, 1, size=(16, 7, 5))
    cfg = PiKLConfig(iterations=3000, eta=0.05)
    tau_r, tau_c = np.ones((16, 7)) / 7, np.ones((16, 5)) / 5
    out = pikl_hedge(games, -games, tau_r, tau_c, 0.0, 0.0, cfg)
    gaps = np.asarray(out.gap_trace)  # [T, B]
    for b in range(16):
        value, _ = lp_value(games[b])
        x, y = np.asarray(out.avg_row[b]), np.asarray(out.avg_col[b])
        guaranteed_row = (x @ games[b]).min()  # what x secures
        conceded_col = (games[b] @ y).max()  # what y concedes
        assert guaranteed_row <= value + 1e-5 <= conceded_col + 2e-5
        assert conceded_col - guaranteed_row == pytest.approx(gaps[-1, b], abs=1e-5)
    # the seed's guarantee, checked along the way: gap_T <= (ln n + ln m)/(ηT) + η w²/4
    for t in (100, 300, 1000, 3000):
        bound = hedge_gap_bound(7, 5, t, cfg.eta, width=2.0)
        assert gaps[t - 1].max() <= bound, (t, gaps[t - 1].max(), bound)
    assert gaps[-1].max() < 0.05 and gaps[-1].mean() < gaps[99].mean() / 3


def test_positive_lambda_reaches_the_regularised_equilibrium():
    rng = np.random.default_rng(2)
    payoff = rng.uniform(-1, 1, size=(8, 4, 4))
    tau_r = rng.dirichlet(np.ones(4) * 2, size=8)
    tau_c = rng.dirichlet(np.ones(4) * 2, size=8)
    lam = 0.5
    out = pikl_hedge(payoff, -payoff, tau_r, tau_c, lam, lam, PiKLConfig(iterations=3000, eta=0.2))

    def residual(x, y):
        # fixed point of the regularised best response: x ∝ τ exp(A y / λ), y ∝ τ exp(−Aᵀx / λ)
        br_x = tau_r * np.exp(np.einsum("bnm,bm->bn", payoff, y) / lam)
        br_y = tau_c * np.exp(-np.einsum("bnm,bn->bm", payoff, x) / lam)
        return max(
            np.abs(x - br_x / br_x.sum(-1, keepdims=True)).max(),
            np.abs(y - br_y / br_y.sum(-1, keepdims=True)).max(),
        )

    # regularisation makes the last iterate converge (the average too, more slowly)
    last = residual(np.asarray(out.last_row), np.asarray(out.last_col))
    assert last < 3e-3
    assert residual(np.asarray(out.avg_row), np.asarray(out.avg_col)) < 1e-2
    early = pikl_hedge(payoff, -payoff, tau_r, tau_c, lam, lam, PiKLConfig(iterations=300, eta=0.2))
    assert last < residual(np.asarray(early.last_row), np.asarray(early.last_col)) / 5


def test_sampled_play_needs_an_rng_and_still_converges():
    with pytest.raises(ValueError, match="rng"):
        pikl_hedge(
            RPS, -RPS, np.ones(3) / 3, np.ones(3) / 3, 0.0, 0.0, PiKLConfig(full_information=False)
        )
    import jax

    out = pikl_hedge(
        RPS,
        -RPS,
        np.ones(3) / 3,
        np.ones(3) / 3,
        0.0,
        0.0,
        PiKLConfig(iterations=4000, eta=0.02, full_information=False),
        rng=jax.random.key(3),
    )
    assert float(duality_gap(RPS, out.avg_row, out.avg_col)) < 0.15
