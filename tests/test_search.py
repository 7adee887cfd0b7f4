"""Batched search: per-game budgets against stock mctx, and the model-backed Searcher."""

from __future__ import annotations

import chess
import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.game import Game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.search import SearchConfig, Searcher, selection, tree_search
from tests.support.toy_game import ToyGame

# ----------------------------------------------------------------------------- a toy game
NUM_ACTIONS = 6


TOY = ToyGame(NUM_ACTIONS, scale=3.0, legal_one_in=5)
_toy_expand = TOY.expand
_toy_recurrent = TOY.recurrent
_toy_root = TOY.root


@pytest.mark.parametrize(
    "fpu_mode", ["reduction", pytest.param("absolute", marks=pytest.mark.slow)]
)
def test_per_game_budgets_equal_stock_mctx(fpu_mode):
    budgets = np.array([0, 7, 19, 7], np.int32)
    batch = len(budgets)
    h, logits, value = _toy_root(batch)
    c = jnp.asarray(np.linspace(0.5, 2.0, batch), jnp.float32)
    params = tree_search.SearchParams(19652.0, fpu_mode, 0.1, 64)
    root = tree_search.NodeEval(logits, value, jnp.zeros(batch, bool), h)
    ours = jax.jit(
        lambda r, b, c: tree_search.search(r, _toy_expand, b, c, num_nodes=20, params=params)
    )(root, jnp.asarray(budgets), c)
    np.testing.assert_array_equal(np.asarray(ours.children_visits[:, 0].sum(-1)), budgets)
    select = selection.make_puct_selection(c_base=19652.0, fpu_mode=fpu_mode, fpu=0.1)
    for b, sims in enumerate(budgets):
        stock = mctx.search(
            params=(),
            rng_key=jax.random.key(0),
            root=mctx.RootFnOutput(prior_logits=logits, value=value, embedding=h),
            recurrent_fn=_toy_recurrent,
            root_action_selection_fn=select,
            interior_action_selection_fn=select,
            num_simulations=int(sims),
            extra_data={"c_puct": c},
        )
        n = int(sims) + 1
        np.testing.assert_array_equal(ours.children_visits[b, 0], stock.children_visits[b, 0])
        np.testing.assert_array_equal(ours.node_visits[b, :n], stock.node_visits[b])
        np.testing.assert_array_equal(ours.parents[b, :n], stock.parents[b])
        np.testing.assert_allclose(ours.node_values[b, :n], stock.node_values[b], atol=1e-6)
        assert (np.asarray(ours.node_visits[b, n:]) == 0).all()  # nothing written past the budget


# ----------------------------------------------------------------------------- the Searcher
@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def searcher(tiny_model):
    return Searcher(tiny_model, SearchConfig(mode="search", mean_sims=64, max_sims=64))


def _game(moves: str, **kw) -> Game:
    return Game(moves=moves.split(), white_elo=1500, black_elo=1500, time_control="180+2", **kw)


# Scholar's mate threat: White to move, Qxf7# (h5f7) mates; Black's f6/Nc6 setup.
MATE_IN_ONE = "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6"


def test_searcher_budgets_visits_and_legality(searcher):
    games = [_game("e2e4 e7e5 g1f3"), _game("d2d4 d7d5 c2c4 e7e6"), _game(MATE_IN_ONE)]
    out = searcher.run(games, jax.random.key(0))
    _check_budgets_and_legality(out, games)


def _check_budgets_and_legality(out, games):
    np.testing.assert_array_equal(out.num_sims, [64, 64, 64])
    np.testing.assert_array_equal(out.visit_counts.sum(-1), 64)
    for i, g in enumerate(games):
        board = chess.Board()
        for m in g.moves:
            board.push_uci(m)
        legal = np.zeros(vocab.NUM_MOVES, bool)
        legal[[vocab.encode_move(m.uci()) for m in board.legal_moves]] = True
        assert (out.visit_counts[i][~legal] == 0).all()
        assert (out.policy[i][~legal] == 0).all() and (out.prior[i][~legal] == 0).all()
        assert out.policy[i].sum() == pytest.approx(1.0, abs=1e-5)
        assert legal[out.move_id[i]] and out.move[i] == vocab.decode_move(out.move_id[i])


def test_mate_in_one_found_with_exact_terminal_values(searcher):
    """Value head zeroed: every non-terminal leaf is worth 0, the mating move's child −1 for
    Black, so only a correct sign convention (−V(child) for the mover) puts π̄ on Qxf7#."""
    model = AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(0))
    model.value_head.value = jnp.zeros_like(model.value_head.value)
    model.value_bias.value = jnp.zeros_like(model.value_bias.value)
    zero_value = Searcher(model, searcher.config)  # same graph: reuses the compiled search
    games = [_game("e2e4 e7e5 g1f3"), _game("d2d4 d7d5 c2c4 e7e6"), _game(MATE_IN_ONE)]
    out = zero_value.run(games, jax.random.key(0))
    _check_budgets_and_legality(out, games)
    # the mating move (its child is terminal: exact value −1 for Black) dominates π̄
    mate = vocab.encode_move("h5f7")
    assert out.visit_counts[2, mate] == out.visit_counts[2].max(), out.visit_counts[2, mate]
    assert out.policy[2, mate] > 0.5, out.policy[2, mate]
    assert out.policy[2, mate] > out.prior[2, mate]


def test_cache_reuse_matches_fresh_prefill(tiny_model, searcher):
    # batches shaped like the other tests' (3 games, prefix bucket 16): no recompilation
    others = [_game("d2d4 d7d5 c2c4 e7e6", game_id="o1"), _game(MATE_IN_ONE, game_id="o2")]
    searcher.run([_game("e2e4 e7e5 g1f3", game_id="reuse"), *others], 0)
    before = searcher.stats["prefill_tokens"]
    g2 = _game("e2e4 e7e5 g1f3 b8c6 f1b5", game_id="reuse")
    out = searcher.run([g2, *others], 0)
    # only the two new plies, plus the last token of each unchanged game (its root outputs)
    assert searcher.stats["prefill_tokens"] - before == 2 + 2
    fresh = Searcher(tiny_model, searcher.config).run(
        [_game("e2e4 e7e5 g1f3 b8c6 f1b5"), *others], 0
    )
    np.testing.assert_allclose(out.prior, fresh.prior, atol=1e-5)
    np.testing.assert_allclose(out.value_white, fresh.value_white, atol=1e-5)
    np.testing.assert_array_equal(out.visit_counts, fresh.visit_counts)


def test_finished_game_is_rejected(searcher):
    fools_mate = _game("f2f3 e7e5 g2g4 d8h4")
    with pytest.raises(ValueError, match="already over"):
        searcher.run([fools_mate], 0)


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        SearchConfig(mode="fast")
    with pytest.raises(ValueError, match="mean_sims"):
        SearchConfig(mean_sims=300, max_sims=200)
    assert SearchConfig.preset("greedy").move_rule == "argmax"
    assert SearchConfig.preset("policy").move_rule == "sample"


# ----------------------------------------------------------------------------- the leaf evaluator
def test_path_forward_equals_full_pass(tiny_model, monkeypatch):
    """Root prefix from the cache + path tokens from per-node stores + the new token, attended
    in three groups, equals the model's plain causal pass over the concatenated sequence."""
    from allie_jax.search import evaluator

    model = tiny_model
    cfg = model.config
    rng = np.random.default_rng(0)
    lengths = [11, 7, 16]
    prefixes = [rng.integers(0, vocab.NUM_MOVES, n) for n in lengths]
    paths = [rng.integers(0, vocab.NUM_MOVES, 4) for _ in lengths]  # 3 path moves + the leaf
    b, nodes = len(lengths), 5
    tokens = np.zeros((b, 16), np.int32)
    for i, t in enumerate(prefixes):
        tokens[i, : len(t)] = t
    _, cache = model.extend(
        jnp.asarray(tokens), model.init_cache(b, 16), jnp.asarray(lengths, jnp.int32)
    )
    root = evaluator.heads_first(cache)
    shape = (b, nodes, cfg.num_layers, cfg.num_heads, cfg.head_dim)
    store_k, store_v = jnp.zeros(shape), jnp.zeros(shape)
    graphdef, params = nnx.split(model)
    step = jax.jit(lambda p, *a: evaluator.path_forward(nnx.merge(graphdef, p), *a))
    full_pass = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
    path_nodes = np.zeros((b, 6), np.int32)  # P = 6 slots, only the first ``depth`` real
    for depth in range(4):
        action = jnp.asarray([p[depth] for p in paths], jnp.int32)
        out, k, v = step(
            params, action, root, jnp.asarray(path_nodes), jnp.full(b, depth), store_k, store_v
        )
        # the root cut into position blocks of 4: the first row (11 tokens) skips the last block
        monkeypatch.setattr(evaluator, "ROOT_BLOCK", 4)
        blocked = evaluator.heads_first(cache)
        monkeypatch.undo()
        assert [len(layer) for layer in blocked.k] == [4] * cfg.num_layers
        for rows in (3, 1):
            out_b, k_b, _ = step(
                params,
                action[:rows],
                blocked,
                jnp.asarray(path_nodes[:rows]),
                jnp.full(rows, depth),
                store_k,
                store_v,
            )
            np.testing.assert_allclose(out_b.policy_logits, out.policy_logits[:rows], atol=1e-5)
            np.testing.assert_allclose(out_b.value, out.value[:rows], atol=1e-6)
            np.testing.assert_allclose(k_b, k[:rows], atol=1e-6)
        store_k = store_k.at[:, depth + 1].set(k)
        store_v = store_v.at[:, depth + 1].set(v)
        path_nodes[:, depth] = depth + 1
        # the plain causal pass over prefix + path (padding after the sequence is never seen)
        seqs = np.full((b, 24), vocab.PAD, np.int32)
        for i in range(b):
            seq = np.concatenate([prefixes[i], paths[i][: depth + 1]])
            seqs[i, : len(seq)] = seq
        full = full_pass(params, jnp.asarray(seqs))
        for i in range(b):
            last = lengths[i] + depth
            np.testing.assert_allclose(
                out.policy_logits[i, 0], full.policy_logits[i, last], atol=2e-4, rtol=1e-4
            )
            np.testing.assert_allclose(out.value[i, 0], full.value[i, last], atol=2e-5)


def test_adaptive_sorted_row_buckets_change_nothing(tiny_model, monkeypatch):
    """Sorting rows by budget and running the model only on the still-active prefix (row
    buckets), reading only the first ``SHORT_PATHS`` path slots when every path fits, gives the
    same trees, policies and moves as evaluating every row and every slot every step."""
    from allie_jax.search import evaluator
    from allie_jax.search import searcher as searcher_module

    config = SearchConfig(mode="adaptive", max_sims=64)
    games = [
        _game("e2e4 e7e5 g1f3", game_id="a"),
        _game("d2d4 d7d5 c2c4 e7e6", game_id="b"),
        _game(MATE_IN_ONE, game_id="c"),
        _game("c2c4 e7e5 b1c3 g8f6 g2g3", game_id="d"),
    ]
    bucketed = Searcher(tiny_model, config).run(games, 3)
    assert len(set(bucketed.num_sims.tolist())) > 2, bucketed.num_sims  # budgets really differ
    assert searcher_module.row_buckets(4, "adaptive") == (4, 2, 1)
    monkeypatch.setattr(searcher_module, "row_buckets", lambda batch, mode: (batch,))
    monkeypatch.setattr(evaluator, "SHORT_PATHS", ())  # always every slot
    plain = Searcher(tiny_model, config).run(games, 3)
    np.testing.assert_array_equal(bucketed.num_sims, plain.num_sims)
    np.testing.assert_array_equal(bucketed.visit_counts, plain.visit_counts)
    np.testing.assert_array_equal(bucketed.visit_counts.sum(-1), bucketed.num_sims)
    np.testing.assert_allclose(bucketed.policy, plain.policy, atol=1e-5)
    np.testing.assert_array_equal(bucketed.move_id, plain.move_id)


def test_log_prior_trees_store_the_softmax_as_log_priors():
    """pUCT trees keep log-priors (one exp per visit); illegal moves and terminal nodes stay out."""
    logits = jnp.asarray(
        [[2.0, -1.0, 0.5, selection.ILLEGAL_LOGIT], [selection.ILLEGAL_LOGIT] * 4], jnp.float32
    )
    stored = selection.log_prior(logits)
    legal = selection.legal_from_logits(logits)
    np.testing.assert_array_equal(selection.legal_from_logits(stored), legal)  # all-illegal row too
    np.testing.assert_allclose(
        np.exp(np.asarray(stored[0, :3])), np.asarray(jax.nn.softmax(logits[0, :3])), rtol=1e-6
    )
    h, root_logits, value = _toy_root(2)
    root = tree_search.NodeEval(root_logits, value, jnp.zeros(2, bool), h)
    tree = tree_search.init_tree(root, jnp.ones(2), 4, log_prior=True)
    # the root's logits as given are kept for the final policy; the tree holds log-priors
    np.testing.assert_array_equal(tree.extra_data[selection.RAW_ROOT_LOGITS], root_logits)
    np.testing.assert_array_equal(
        tree.children_prior_logits[:, 0], selection.log_prior(root_logits)
    )
    assert selection.RAW_ROOT_LOGITS not in tree_search.init_tree(root, jnp.ones(2), 4).extra_data
