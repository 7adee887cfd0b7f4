"""π̄ (Grill et al. 2020), λ_N and the budget rule against hand-computed / brute-force references."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax.search import budget, pibar
from allie_jax.search.config import SearchConfig


def _random_case(rng: np.random.Generator, batch: int = 8, actions: int = 40):
    legal = rng.random((batch, actions)) < 0.6
    legal[:, 0] = True
    logits = rng.normal(size=(batch, actions)) * 2
    logits = np.where(legal, logits, -np.inf)
    prior = np.exp(logits - logits.max(-1, keepdims=True))
    prior /= prior.sum(-1, keepdims=True)
    q = rng.uniform(-1, 1, size=(batch, actions))
    return q.astype(np.float32), prior.astype(np.float32), legal


def _objective(pi, q, prior, legal, lam):
    return np.asarray(pibar.regularised_objective(pi, q, prior, legal, lam))


def test_pibar_sums_to_one_and_is_zero_off_the_legal_set():
    q, prior, legal = _random_case(np.random.default_rng(0))
    lam = np.full(q.shape[0], 0.05, np.float32)
    p = np.asarray(pibar.pibar(q, prior, legal, lam))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    assert (p[~legal] == 0).all() and (p >= 0).all()


def test_pibar_matches_closed_form_fixed_point():
    """π̄(a) = λ prior(a) / (α − q(a)) with one α per row: the ratios pin α down."""
    q, prior, legal = _random_case(np.random.default_rng(1))
    lam = np.full(q.shape[0], 0.1, np.float32)
    p = np.asarray(pibar.pibar(q, prior, legal, lam), np.float64)
    for b in range(q.shape[0]):
        m = legal[b] & (prior[b] > 1e-6)
        alpha = q[b][m] + lam[b] * prior[b][m] / p[b][m]
        np.testing.assert_allclose(alpha, alpha.mean(), atol=2e-4)


def test_pibar_tends_to_prior_as_lambda_grows():
    q, prior, legal = _random_case(np.random.default_rng(2))
    gaps = []
    for lam in (0.01, 0.1, 1.0, 10.0, 1000.0):
        p = np.asarray(pibar.pibar(q, prior, legal, np.full(q.shape[0], lam, np.float32)))
        gaps.append(np.abs(p - prior).max())
    assert all(a >= b - 1e-6 for a, b in zip(gaps, gaps[1:], strict=False)), gaps
    assert gaps[-1] < 1e-3


def test_pibar_tends_to_argmax_q_as_lambda_vanishes():
    q, prior, legal = _random_case(np.random.default_rng(3))
    p = np.asarray(pibar.pibar(q, prior, legal, np.full(q.shape[0], 1e-5, np.float32)))
    best = np.argmax(np.where(legal, q, -np.inf), -1)
    assert (p[np.arange(len(best)), best] > 0.95).all()


def test_pibar_maximises_regularised_objective_against_perturbations():
    rng = np.random.default_rng(4)
    q, prior, legal = _random_case(rng, batch=4)
    lam = np.array([0.02, 0.1, 0.5, 2.0], np.float32)
    p = np.asarray(pibar.pibar(q, prior, legal, lam), np.float64)
    best = _objective(p, q, prior, legal, lam)
    for _ in range(200):
        noise = rng.normal(size=p.shape) * rng.choice([1e-3, 1e-2, 1e-1])
        other = np.where(legal, np.maximum(p * np.exp(noise), 1e-12), 0.0)
        other /= other.sum(-1, keepdims=True)
        assert (_objective(other, q, prior, legal, lam) <= best + 1e-5).all()


def _pibar_float64(q, prior, legal, lam):
    """Textbook bisection in float64, without any shift: the independent reference."""
    out = np.zeros_like(q, dtype=np.float64)
    for b in range(q.shape[0]):
        m = legal[b]
        qb, pb = q[b][m].astype(np.float64), prior[b][m].astype(np.float64)
        lo, hi = (qb + lam[b] * pb).max(), qb.max() + lam[b]
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if (lam[b] * pb / (mid - qb)).sum() > 1 else (lo, mid)
        p = lam[b] * pb / (0.5 * (lo + hi) - qb)
        out[b][m] = p / p.sum()
    return out


@pytest.mark.parametrize("offset", [0.0, 500.0])
def test_pibar_float32_matches_float64_even_with_large_values(offset):
    """q is shifted by its maximum first, so values far from 0 keep float32 accuracy."""
    q, prior, legal = _random_case(np.random.default_rng(5))
    q = (q + offset).astype(np.float32)
    lam = np.full(q.shape[0], 0.01, np.float32)
    p = np.asarray(pibar.pibar(q, prior, legal, lam))
    np.testing.assert_allclose(p, _pibar_float64(q, prior, legal, lam), atol=2e-5)


def test_zero_lambda_and_visit_policy_fall_back_to_prior():
    q, prior, legal = _random_case(np.random.default_rng(6), batch=2)
    p = np.asarray(pibar.pibar(q, prior, legal, np.zeros(2, np.float32)))
    np.testing.assert_allclose(p, prior, atol=1e-7)
    visits = np.zeros_like(q)
    visits[1, 0] = 3.0
    visits[1, 1] = 1.0
    vp = np.asarray(pibar.visit_policy(visits, prior))
    np.testing.assert_allclose(vp[0], prior[0])
    assert vp[1, 0] == pytest.approx(0.75) and vp[1, 1] == pytest.approx(0.25)


def test_kl_lambda_hand_values():
    # Grill: 1.25 · sqrt(50) / (30 + 50); released: 1.25 · 50 / 80.
    lam = pibar.kl_lambda(jnp.array([1.25]), jnp.array([50]), jnp.array([30]))
    assert float(lam[0]) == pytest.approx(1.25 * math.sqrt(50) / 80, rel=1e-6)
    lam = pibar.kl_lambda(jnp.array([1.25]), jnp.array([50]), jnp.array([30]), sqrt=False)
    assert float(lam[0]) == pytest.approx(1.25 * 50 / 80, rel=1e-6)


def test_adaptive_budget_rule():
    cfg = SearchConfig(mode="adaptive")
    t = np.array([-3.0, 0.0, 0.04, 4.64001, 10.0, 18.5, 1e4, np.nan])
    got = budget.simulation_budgets(cfg, t)
    c = 50 / 4.64001
    want = [0, 0, round(c * 0.04), 50, round(c * 10), 199, 200, 0]
    assert got.tolist() == want
    assert budget.simulation_budgets(SearchConfig(mode="search"), t).tolist() == [50] * len(t)
    assert budget.simulation_budgets(SearchConfig(mode="policy"), t).tolist() == [0] * len(t)


def test_scaled_c_puct():
    cfg = SearchConfig()
    c = budget.scaled_c_puct(cfg, np.array([0, 50, 200, 12]))
    np.testing.assert_allclose(c, [1.25, 1.25, 1.25 * 0.5, 1.25 * math.sqrt(50 / 12)], rtol=1e-6)
