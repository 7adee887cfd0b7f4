"""The human anchor's strength: λ in value units, its schedules, Gumbel's anchored transform, and
a final policy that never plays a move the search did not visit."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from allie_jax.search import SearchConfig, gumbel, pibar, selection, tree_search
from tests.support.toy_game import ToyGame

PRIOR = np.array([0.6, 0.3, 0.1])
NOISE_Q = np.array([0.0, 0.01, 0.02])  # a noise-level spread
POINT_Q = np.array([0.0, 0.5, 1.0])  # a whole-point spread
MAX_N = 20


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _improved(q: np.ndarray, params: gumbel.GumbelParams) -> tuple[np.ndarray, float]:
    visits = jnp.asarray([MAX_N, 0, 0])
    lam = params.anchor_lambda if params.transform == "anchor" else None
    sigma_q, eff = gumbel.transform(jnp.asarray(q, jnp.float32), visits, params, lam)
    policy = jax.nn.softmax(jnp.log(jnp.asarray(PRIOR, jnp.float32)) + sigma_q)
    return np.asarray(policy, np.float64), float(eff)


def test_stock_sigma_follows_the_q_spread_and_the_anchored_mode_does_not():
    """Stock σ rescales Q by its spread: a 0.02 spread and a 1.0 spread give the same π'
    [0.005, 0.083, 0.912]. The anchored mode, softmax(log π + q/λ) with λ = 0.11, keeps the human
    prior for noise-level Q and overturns it only for a whole-point difference."""
    stock = gumbel.GumbelParams()  # mctx's c_visit 50, c_scale 0.1
    small, lam_small = _improved(NOISE_Q, stock)
    large, lam_large = _improved(POINT_Q, stock)
    # independent: σ = (c_visit + max N) · c_scale · (q − q_min) / (q_max − q_min) = 7 · [0, ½, 1]
    expect = _softmax(np.log(PRIOR) + 7.0 * np.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(small, expect, atol=1e-5)
    np.testing.assert_allclose(large, expect, atol=1e-5)
    np.testing.assert_allclose(expect, [0.005, 0.083, 0.912], atol=5e-4)  # the figure
    assert lam_small == pytest.approx(0.02 / 7) and lam_large == pytest.approx(1.0 / 7)

    anchored = gumbel.GumbelParams(transform="anchor", anchor_lambda=0.11)
    small, lam_small = _improved(NOISE_Q, anchored)
    large, lam_large = _improved(POINT_Q, anchored)
    assert lam_small == lam_large == pytest.approx(0.11)
    np.testing.assert_allclose(small, _softmax(np.log(PRIOR) + NOISE_Q / 0.11), atol=1e-5)
    np.testing.assert_allclose(large, _softmax(np.log(PRIOR) + POINT_Q / 0.11), atol=1e-5)
    assert np.abs(small - PRIOR).max() < 0.05  # the anchor holds against noise
    assert int(np.argmax(small)) == 0 and large[2] > 0.95  # a whole point overturns it
    assert np.abs(small - large).max() > 0.5


def test_schedules_reproduce_their_formulas():
    """λ at N = 5, 50, 200 with |A| = 30: constant stays put; "paper" is c·sqrt(N)/(|A|+N);
    "released" (c scaled by sqrt(50/N)) is c·sqrt(50)/(|A|+N): 0.25, 0.11, 0.04."""
    n = np.array([5, 50, 200])
    scaled = 1.25 * np.sqrt(50 / n)
    common = dict(c_puct=1.25, scaled_c_puct=jnp.asarray(scaled), num_legal=jnp.full(3, 30))

    def lam(schedule, sqrt=True):
        out = pibar.schedule_lambda(
            schedule, anchor_lambda=0.11, total_visits=jnp.asarray(n), sqrt=sqrt, **common
        )
        return np.asarray(out, np.float64)

    np.testing.assert_allclose(lam("constant"), [0.11] * 3)
    np.testing.assert_allclose(lam("paper"), [1.25 * math.sqrt(k) / (30 + k) for k in n], rtol=1e-6)
    released = [1.25 * math.sqrt(50) / (30 + k) for k in n]
    np.testing.assert_allclose(lam("released"), released, rtol=1e-6)
    np.testing.assert_allclose(lam("released"), [0.25, 0.11, 0.04], atol=0.006)
    np.testing.assert_allclose(
        lam("released", sqrt=False),
        [s * k / (30 + k) for s, k in zip(scaled, n, strict=True)],
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="lambda_schedule"):
        SearchConfig(lambda_schedule="adaptive")
    with pytest.raises(ValueError, match="anchor_lambda"):
        SearchConfig(anchor_lambda=0.0)


# ----------------------------------------------------------------------- searched toy trees
NUM_ACTIONS = 24
TOY = ToyGame(NUM_ACTIONS, scale=4.0, offset=-2.0, legal_one_in=4)


def _toy_tree(budgets, params: gumbel.GumbelParams | None = None):
    """Batched trees of the toy game: Gumbel (``params``) or pUCT (None) with the given budgets."""
    batch = len(budgets)
    h = jnp.arange(batch, dtype=jnp.uint32) * 7 + 3
    logits, value = TOY.eval(h)
    root = tree_search.NodeEval(logits, value, jnp.zeros(batch, bool), h)
    budgets = jnp.asarray(budgets, jnp.int32)
    tp = tree_search.SearchParams(19652.0, "reduction", 0.0, 64)
    nodes = int(budgets.max()) + 1
    c = jnp.full(budgets.shape, 1.25, jnp.float32)
    if params is None:
        return tree_search.search(root, TOY.expand, budgets, c, num_nodes=nodes, params=tp), None
    noise = gumbel.gumbel_noise(jax.random.split(jax.random.key(3), batch), NUM_ACTIONS)
    table = jnp.asarray(gumbel.considered_visits_table(params.max_considered, nodes - 1))
    tree = gumbel.search(
        root, TOY.expand, budgets, noise, table, num_nodes=nodes, params=tp, gumbel=params, c_puct=c
    )
    return tree, noise


def test_completed_q_is_mctx_mixed_value():
    """``selection.completed_q`` (the one completed Q) equals mctx's own completion."""
    tree, _ = _toy_tree([1, 3, 9, 30])
    ours = jax.vmap(lambda t: selection.completed_q(t, 0))(tree)
    # mctx multiplies by (maxvisit_init + max N) · value_scale: set both to undo it exactly
    theirs = jax.vmap(
        lambda t: mctx.qtransform_completed_by_mix_value(
            t, 0, value_scale=1.0, maxvisit_init=1.0, rescale_values=False
        )
    )(tree)
    theirs = theirs / (1.0 + tree.children_visits[:, 0].max(-1))[:, None]
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_anchored_gumbel_lambda_is_constant_across_budgets_and_support_is_visited():
    """Through a real Gumbel search: the improved policy is softmax(log π + q̂/λ) over the
    visited moves with λ = anchor_lambda at every budget, and the tree selection used the same σ."""
    params = gumbel.GumbelParams(transform="anchor", anchor_lambda=0.2, visited_only=True)
    budgets = [0, 1, 4, 12, 40]
    tree, noise = _toy_tree(budgets, params)
    res = gumbel.improve(tree, noise, params)
    lam = np.asarray(res.effective_lambda)
    assert np.isnan(lam[0]) and np.allclose(lam[1:], 0.2)
    logits = np.asarray(tree.children_prior_logits[:, 0])
    completed = np.asarray(jax.vmap(lambda t: selection.completed_q(t, 0))(tree))
    visits = np.asarray(res.visits)
    np.testing.assert_array_equal(visits.sum(-1), budgets)
    for b, n in enumerate(budgets):
        on = visits[b] > 0 if n > 0 else logits[b] > selection.ILLEGAL_LOGIT / 2
        z = np.where(on, logits[b] + completed[b] / 0.2, -np.inf)
        np.testing.assert_allclose(res.policy[b], _softmax(z), atol=1e-5, err_msg=f"budget {n}")
        assert (np.asarray(res.policy[b])[~on] == 0).all()
    # a different λ changes the tree (σ = q̂/λ drives halving and interior selection)
    loose = params._replace(anchor_lambda=5.0)
    other, _ = _toy_tree(budgets, loose)
    assert not np.array_equal(np.asarray(other.children_visits), np.asarray(tree.children_visits))


def test_pibar_on_visited_moves_never_plays_an_unvisited_move():
    """π̄ with the visited support: zero on unvisited moves, and on the visited ones the float64
    reference π̄ of the anchor conditioned on them; the legal support with root-value Q (the old
    rule) can put its largest mass on an unvisited move, which is what the fix removes."""
    budgets = [1, 2, 3, 6, 20]
    tree, _ = _toy_tree(budgets)
    logits = tree.extra_data[selection.RAW_ROOT_LOGITS]
    legal = selection.legal_from_logits(logits)
    prior = jnp.where(legal, jax.nn.softmax(logits, -1), 0.0)
    visits = tree.children_visits[:, 0]
    q = jax.vmap(lambda t: selection.completed_q(t, 0))(tree)
    lam = jnp.full(len(budgets), 0.11)
    support = pibar.visited_support(legal, visits)
    policy = np.asarray(pibar.pibar(q, prior, support, lam))
    visits, prior, q = np.asarray(visits), np.asarray(prior), np.asarray(q)
    for b in range(len(budgets)):
        on = visits[b] > 0
        assert (policy[b][~on] == 0).all()
        cond = prior[b][on] / prior[b][on].sum()
        np.testing.assert_allclose(policy[b][on], pibar_reference(q[b][on], cond, 0.11), atol=2e-5)
    # the old rule (FPU "reduction": Q(unvisited) = the root's running value) over every legal
    # move puts mass on unvisited moves
    old_q = jax.vmap(lambda t: selection.completed_q(t, 0, fpu_mode="reduction", fpu=0.0))(tree)
    old = np.asarray(pibar.pibar(old_q, jnp.asarray(prior), legal, lam))
    assert old[visits == 0].sum() > 0.1


def pibar_reference(q, prior, lam):
    from allie_jax.search.reference import pibar as reference_pibar

    return reference_pibar(np.asarray(q, np.float64), np.asarray(prior, np.float64), lam)


@pytest.fixture(scope="module")
def tiny_model():
    from flax import nnx

    from allie_jax.model import AllieModel, ModelConfig

    return AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(0))


def test_searcher_pibar_holds_lambda_and_plays_only_visited_moves(tiny_model):
    """Allie's path (``adaptive``, π̄): every searched game reports the user's λ whatever its
    budget, and its policy and move stay on the moves its search visited."""
    from allie_jax.game import Game
    from allie_jax.search import Searcher

    lines = ["e2e4 e7e5 g1f3", "d2d4 d7d5 c2c4 e7e6", "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6"]
    games = [Game(m.split(), 1500, 1500, "180+2", game_id=m) for m in lines]
    config = SearchConfig(mode="search", mean_sims=12, max_sims=32, anchor_lambda=0.3)
    out = Searcher(tiny_model, config).run(games, 5)
    np.testing.assert_array_equal(out.visit_counts.sum(-1), 12)
    np.testing.assert_allclose(out.effective_lambda, 0.3, rtol=1e-6)
    assert (out.policy[out.visit_counts == 0] == 0).all()
    np.testing.assert_allclose(out.policy.sum(-1), 1.0, atol=1e-5)
    assert (out.visit_counts[np.arange(len(games)), out.move_id] > 0).all()
