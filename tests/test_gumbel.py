"""Gumbel MuZero mode: per-game budgets against stock ``mctx.gumbel_muzero_policy``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from allie_jax.search import gumbel, selection, tree_search
from tests.support.toy_game import ToyGame

# ----------------------------------------------------------------------------- a toy game
# A deterministic game shared by both sides: the state is a uint32 hash, prior logits and value
# are hashes of it, and some moves are illegal at every node (prior logit ILLEGAL_LOGIT).
NUM_ACTIONS = 24
# stock mctx compiles once per budget (~3-10 s each on 2 busy cores): a sample by default (small
# budgets, the first halving boundaries, two few-legal roots last), every budget 0..48 in `slow`
BUDGETS = (0, 1, 2, 3, 5, 8, 17, 32)
ALL_BUDGETS = tuple(range(49))


TOY = ToyGame(NUM_ACTIONS, scale=4.0, offset=-2.0, legal_one_in=4)
_toy_eval = TOY.eval
_toy_expand = TOY.expand
_toy_recurrent = TOY.recurrent


def _toy_root(batch):
    h = jnp.arange(batch, dtype=jnp.uint32) * 7 + 3
    logits, value = _toy_eval(h)
    # two roots with few legal moves: fewer considered actions than 16, all of them visited
    few_h = h[:2] + 1000
    few_logits, _ = _toy_eval(few_h, legal_one_in=2)
    keep = jnp.arange(NUM_ACTIONS) < 5
    few_logits = jnp.where(keep[None], few_logits, selection.ILLEGAL_LOGIT)
    logits = logits.at[-2:].set(few_logits)
    return h, logits, value


def _stock(h, logits, value, key, budget, params: gumbel.GumbelParams):
    legal = selection.legal_from_logits(logits)
    qtransform = lambda tree, node: mctx.qtransform_completed_by_mix_value(  # noqa: E731
        tree, node, value_scale=params.c_scale, maxvisit_init=params.c_visit
    )
    return mctx.gumbel_muzero_policy(
        params=(),
        rng_key=key,
        root=mctx.RootFnOutput(prior_logits=logits, value=value, embedding=h),
        recurrent_fn=_toy_recurrent,
        num_simulations=budget,
        invalid_actions=~legal,
        qtransform=qtransform,
        max_num_considered_actions=params.max_considered,
        gumbel_scale=params.noise_scale,
    )


@pytest.mark.parametrize(
    "params,budgets",
    [
        pytest.param(gumbel.GumbelParams(), BUDGETS, id="default"),
        pytest.param(
            gumbel.GumbelParams(c_visit=20.0, c_scale=0.5, max_considered=8),
            BUDGETS,
            id="knobs",
            marks=pytest.mark.slow,
        ),
        pytest.param(gumbel.GumbelParams(), ALL_BUDGETS, id="every-budget", marks=pytest.mark.slow),
    ],
)
def test_mixed_budgets_equal_stock_gumbel_muzero(params, budgets):
    """One batch, one budget per game; each game equals stock mctx run with its budget alone:
    visit counts, action weights (within 1e-5), the chosen action, tree shape and values."""
    budgets = np.array(budgets, np.int32)
    batch = len(budgets)
    h, logits, value = _toy_root(batch)
    keys = jax.random.split(jax.random.key(7), batch)
    noise = gumbel.gumbel_noise(keys, NUM_ACTIONS, params.noise_scale)
    table = jnp.asarray(gumbel.considered_visits_table(params.max_considered, int(budgets.max())))
    tree_params = tree_search.SearchParams(19652.0, "reduction", 0.0, 64)
    root = tree_search.NodeEval(logits, value, jnp.zeros(batch, bool), h)

    nodes = int(budgets.max()) + 1

    @jax.jit
    def ours(root, budgets, noise, table):
        tree = gumbel.search(
            root,
            _toy_expand,
            budgets,
            noise,
            table,
            num_nodes=nodes,
            params=tree_params,
            gumbel=params,
        )
        return tree, gumbel.improve(tree, noise, params)

    tree, res = ours(root, jnp.asarray(budgets), noise, table)
    np.testing.assert_array_equal(np.asarray(res.visits.sum(-1)), budgets)
    legal = np.asarray(selection.legal_from_logits(logits))
    assert (np.asarray(res.visits)[~legal] == 0).all()  # illegal moves never visited
    assert (np.asarray(res.policy)[~legal] == 0).all()
    deep, worst = 0, 0.0
    for b, n in enumerate(budgets.tolist()):
        if n == 0:
            # budget 0: the prior, untouched; the action is a Gumbel-max sample from it
            np.testing.assert_allclose(res.policy[b], jax.nn.softmax(logits[b]), atol=1e-6)
            assert int(res.action[b]) == int(jnp.argmax(noise[b] + logits[b]))
            assert np.isnan(res.effective_lambda[b])
            continue
        stock = _stock(h[b : b + 1], logits[b : b + 1], value[b : b + 1], keys[b], n, params)
        stock_visits = np.asarray(stock.search_tree.summary().visit_counts[0])
        np.testing.assert_array_equal(res.visits[b], stock_visits, err_msg=f"budget {n}")
        np.testing.assert_allclose(
            res.policy[b], stock.action_weights[0], atol=1e-5, err_msg=f"budget {n}"
        )
        worst = max(worst, float(np.abs(res.policy[b] - stock.action_weights[0]).max()))
        assert int(res.action[b]) == int(stock.action[0]), n
        np.testing.assert_array_equal(
            tree.parents[b, : n + 1], stock.search_tree.parents[0], err_msg=f"budget {n}"
        )
        np.testing.assert_allclose(
            tree.node_values[b, : n + 1], stock.search_tree.node_values[0], atol=1e-5
        )
        deep += int((np.asarray(tree.parents[b, : n + 1]) > 0).sum())
        # λ: σ's slope, so softmax(logits + (q - q_min) / λ) is the improved policy
        completed = np.asarray(jax.vmap(gumbel.completed_qvalues, (0, None))(tree, 0)[b])
        lam = float(res.effective_lambda[b])
        expect = max(completed.max() - completed.min(), 1e-8) / (
            (params.c_visit + stock_visits.max()) * params.c_scale
        )
        np.testing.assert_allclose(lam, expect, rtol=1e-5)
        z = np.where(legal[b], np.asarray(logits[b]) + (completed - completed.min()) / lam, -np.inf)
        np.testing.assert_allclose(
            res.policy[b], np.exp(z - z.max()) / np.exp(z - z.max()).sum(), atol=1e-5
        )
    print(f"gumbel parity: budgets {budgets.min()}..{budgets.max()}, max |Δ weights| = {worst:.2e}")
    assert deep > 20  # interior selection really ran (nodes below depth 1)
    # the few-legal roots visited every legal move (min/max of completed Q over all visited)
    assert (np.asarray(res.visits[-1])[legal[-1]] > 0).all()


def test_anchor_replaces_the_prior_in_the_kl_term():
    """An anchor policy enters π' = softmax(anchor + σ(q)); the search itself is unchanged."""
    params = gumbel.GumbelParams()
    batch = 3
    h, logits, value = _toy_root(batch)
    budgets = jnp.asarray([0, 8, 20], jnp.int32)
    noise = gumbel.gumbel_noise(jax.random.split(jax.random.key(1), batch), NUM_ACTIONS)
    table = jnp.asarray(gumbel.considered_visits_table(16, 20))
    anchor = jax.random.normal(jax.random.key(2), (batch, NUM_ACTIONS))
    tp = tree_search.SearchParams(19652.0, "reduction", 0.0, 64)
    root = tree_search.NodeEval(logits, value, jnp.zeros(batch, bool), h)
    tree = gumbel.search(
        root, _toy_expand, budgets, noise, table, num_nodes=21, params=tp, gumbel=params
    )
    plain = gumbel.improve(tree, noise, params)
    anchored = gumbel.improve(tree, noise, params, anchor_logits=anchor)
    np.testing.assert_array_equal(plain.visits, anchored.visits)
    legal = selection.legal_from_logits(logits)
    # budget 0 plays the anchor itself
    np.testing.assert_allclose(
        anchored.policy[0], jax.nn.softmax(jnp.where(legal[0], anchor[0], -jnp.inf)), atol=1e-6
    )
    for r in (1, 2):  # π'_anchored / π'_plain ∝ exp(anchor − prior) on the legal moves
        on = np.asarray(legal[r])
        ratio = np.log(np.asarray(anchored.policy[r])[on]) - np.log(np.asarray(plain.policy[r])[on])
        d = ratio - np.asarray(anchor[r] - logits[r])[on]
        np.testing.assert_allclose(d, d[0], atol=1e-4)


def test_table_matches_mctx():
    table = gumbel.considered_visits_table(16, 40)
    from allie_jax.compat import mctx_seq_halving

    seq_halving = mctx_seq_halving()

    for n in (1, 2, 7, 16, 17, 40):
        stock = np.asarray(seq_halving.get_table_of_considered_visits(16, n))
        np.testing.assert_array_equal(table[:, n, :n], stock)


# ----------------------------------------------------------------------------- through the Searcher
@pytest.fixture(scope="module")
def tiny_model():
    from flax import nnx

    from allie_jax.model import AllieModel, ModelConfig

    return AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(0))


def _games():
    from allie_jax.game import Game

    lines = ["e2e4 e7e5 g1f3", "d2d4 d7d5 c2c4 e7e6", "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6"]
    return [
        Game(moves=m.split(), white_elo=1500, black_elo=1500, time_control="180+2", game_id=m)
        for m in lines
    ]


def _legal(game):
    import chess

    from allie_jax import vocab

    board = chess.Board()
    for m in game.moves:
        board.push_uci(m)
    legal = np.zeros(vocab.NUM_MOVES, bool)
    legal[[vocab.encode_move(m.uci()) for m in board.legal_moves]] = True
    return legal


def test_searcher_gumbel_modes_and_anchor(tiny_model):
    """``gumbel`` through the Searcher: budgets, legality, λ logged, seeded; an anchor steers the
    final policy without changing the search; the chunked (clocked) path equals the one-call."""
    from allie_jax.search import SearchConfig, Searcher

    games = _games()
    config = SearchConfig(mode="gumbel", mean_sims=12, max_sims=32)
    searcher = Searcher(tiny_model, config)
    out = searcher.run(games, 5)
    np.testing.assert_array_equal(out.num_sims, 12)
    np.testing.assert_array_equal(out.visit_counts.sum(-1), 12)
    for i, g in enumerate(games):
        legal = _legal(g)
        assert (out.visit_counts[i][~legal] == 0).all() and (out.policy[i][~legal] == 0).all()
        assert out.policy[i].sum() == pytest.approx(1.0, abs=1e-5) and legal[out.move_id[i]]
    # the default human-anchored mode: λ is the user's constant, and π' lives on visited moves
    np.testing.assert_allclose(out.effective_lambda, config.anchor_lambda, rtol=1e-6)
    assert (out.policy[out.visit_counts == 0] == 0).all()
    assert (out.visit_counts[np.arange(len(games)), out.move_id] > 0).all()
    # the chunked path (UCI play: a deadline or stop) builds the same trees and moves
    again = searcher.run(games, 5, should_stop=lambda: False)
    np.testing.assert_array_equal(again.visit_counts, out.visit_counts)
    np.testing.assert_array_equal(again.move_id, out.move_id)
    np.testing.assert_allclose(again.policy, out.policy, atol=1e-6)

    # a human anchor strongly preferring one visited move (the least visited, highest id): π'
    # follows it, the tree does not change
    anchor = np.zeros((len(games), 1968), np.float32)
    picks = [int(np.flatnonzero(v == v[v > 0].min())[-1]) for v in out.visit_counts]
    anchor[np.arange(len(games)), picks] = 40.0
    steered = searcher.run(games, 5, anchor_logits=anchor)
    np.testing.assert_array_equal(steered.visit_counts, out.visit_counts)
    assert (steered.policy[np.arange(len(games)), picks] > 0.99).all()
    np.testing.assert_array_equal(steered.move_id, picks)
    with pytest.raises(ValueError, match="anchor_logits has shape"):
        searcher.run(games, 5, anchor_logits=anchor[:2])


@pytest.mark.slow
def test_searcher_gumbel_adaptive_mixed_budgets(tiny_model):
    from allie_jax.search import SearchConfig, Searcher

    config = SearchConfig(mode="gumbel-adaptive", mean_sims=12, max_sims=32)
    adaptive = Searcher(tiny_model, config).run(_games(), 1)
    np.testing.assert_array_equal(adaptive.visit_counts.sum(-1), adaptive.num_sims)
    assert np.isnan(adaptive.effective_lambda[adaptive.num_sims == 0]).all()
    assert np.isfinite(adaptive.effective_lambda[adaptive.num_sims > 0]).all()


def test_allie_play_reaches_gumbel(tiny_model):
    """``Allie.play`` (hence UCI and launch.match) selects the mode by name (same shapes as the
    Searcher test above, so nothing recompiles)."""
    from allie_jax import vocab
    from allie_jax.engine import Allie

    games = _games()
    decisions = Allie(tiny_model).play(games, "gumbel", 3, mean_sims=12, max_sims=32)
    assert [d.sims for d in decisions] == [12, 12, 12]
    for d, g in zip(decisions, games, strict=True):
        assert sum(d.policy.values()) == pytest.approx(1.0, abs=1e-5)
        assert _legal(g)[vocab.encode_move(d.move)]
