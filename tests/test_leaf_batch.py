"""Several leaves per game per step (``leaf_batch``): the batched search against a plain-Python
reference with the same virtual-loss and collision rules, and K = 1 unchanged.

The reference extends ``reference.ReferenceMCTS`` (python-chess trees, float64 statistics) with
the documented rules of ``tree_search``: K selections per step, each seeing the earlier ones'
pending visits (as lost visits, ``virtual_loss="loss"``, or as visits in the exploration term
only with Q unchanged, ``"visit"``), then every new leaf evaluated, then the K backups in order; a
selection ending on an edge an earlier one of the same step already chose is a second visit of
that edge's new node. Both sides evaluate leaves with the hash evaluator of
test_search_reference, so any difference in the rules shows up as different visit counts.
"""

from __future__ import annotations

import collections
import functools
import math

import chess
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax import chess_jax, vocab
from allie_jax.search import evaluator as evaluator_lib
from allie_jax.search import selection, tree_search
from allie_jax.search.reference import Node, ReferenceMCTS
from tests.test_search_reference import POSITIONS, HashEvaluator, _jax_eval, _mix_jnp


def _expand(payloads, parent, path_nodes, path_len, action, num_active):
    """The hash evaluator for B·K rows: row r is a leaf of game r // K."""
    k = parent.shape[0] // payloads["hash"].shape[0]
    game = jnp.arange(parent.shape[0]) // k
    state = jax.tree.map(lambda x: x[game, parent], payloads["state"])
    h = _mix_jnp(payloads["hash"][game, parent], action.astype(jnp.uint32) + 1)
    return _jax_eval(chess_jax.apply(state, action), h)


class LeafBatchReference(ReferenceMCTS):
    """``ReferenceMCTS`` taking ``k`` leaves per step; ``rule`` "loss": a pending visit is a lost
    visit; "visit": a pending visit counts in N(s) and N(s, a) only (lc0's in-flight visits)."""

    def __init__(self, evaluate, *, k: int, rule: str = "visit", **kwargs) -> None:
        super().__init__(evaluate, **kwargs)
        self.k, self.rule = k, rule

    def _virtual_q(self, node: Node, move: int) -> float:
        child = node.children.get(move)
        visits = child.visits if child is not None else 0
        value_sum = child.value_sum if child is not None else 0.0
        pending = self.pending_edge[(id(node), move)] if self.rule == "loss" else 0
        if visits + pending > 0:  # each pending visit is a win for the child's mover
            return -(value_sum + pending) / (visits + pending)
        return self.fpu if self.fpu_mode == "absolute" else node.value - self.fpu

    def _virtual_select(self, node: Node, c: float) -> int:
        n = node.visits + self.pending_node[id(node)]
        factor = (math.log((n + self.c_base + 1) / self.c_base) + c) * math.sqrt(n)
        best, best_score = -1, -math.inf
        for move in node.legal:
            child = node.children.get(int(move))
            visits = (child.visits if child is not None else 0) + self.pending_edge[
                (id(node), int(move))
            ]
            score = self._virtual_q(node, int(move)) + factor * node.prior[move] / (1 + visits)
            if score > best_score:
                best, best_score = int(move), score
        return best

    def run_tree(self, board: chess.Board, num_sims: int, c: float) -> Node:
        root = Node(board.copy(), ())
        root.value_sum, root.visits = self._expand(root), 1
        done = 0
        while done < num_sims:
            leaves = min(self.k, num_sims - done)
            self.pending_node = collections.Counter()
            self.pending_edge = collections.Counter()
            picks = []  # (path of nodes, move or None for a frozen revisit)
            for _ in range(leaves):
                node, path = root, [root]
                while True:
                    if node.terminal or len(node.path) >= self.max_path:
                        move = None
                        break
                    move = self._virtual_select(node, c)
                    if move not in node.children:
                        break
                    node = node.children[move]
                    path.append(node)
                chosen = path if move is None else path
                for parent, child in zip(chosen[:-1], chosen[1:], strict=False):
                    self.pending_node[id(parent)] += 1
                    self.pending_edge[(id(parent), self._move_to(parent, child))] += 1
                if move is not None:
                    self.pending_node[id(node)] += 1
                    self.pending_edge[(id(node), move)] += 1
                picks.append((path, move))
            new_values = {}
            for path, move in picks:  # evaluate the new leaves (first selection of an edge)
                parent = path[-1]
                if move is not None and move not in parent.children:
                    nb = parent.board.copy(stack=True)
                    nb.push(chess.Move.from_uci(vocab.decode_move(move)))
                    child = parent.children[move] = Node(nb, parent.path + (move,))
                    new_values[id(child)] = self._expand(child)
            for path, move in picks:  # back up in selection order
                if move is None:
                    leaf_value = path[-1].value
                    chain = path
                else:
                    child = path[-1].children[move]
                    leaf_value = new_values[id(child)]
                    chain = path + [child]
                for n in reversed(chain):
                    n.visits += 1
                    n.value_sum += leaf_value
                    leaf_value = -leaf_value
            done += leaves
        return root

    @staticmethod
    def _move_to(parent: Node, child: Node) -> int:
        return child.path[-1]


def _positions():
    boards, moves = [], []
    for line in POSITIONS:
        board = chess.Board()
        for m in line.split():
            board.push_uci(m)
        boards.append(board)
        moves.append([vocab.encode_move(m) for m in line.split()])
    ids, lengths = chess_jax.pad_move_ids(moves)
    return boards, chess_jax.replay(jnp.asarray(ids), jnp.asarray(lengths))


@pytest.mark.parametrize(
    "k, rule",
    [
        pytest.param(4, "loss", marks=pytest.mark.slow),  # the non-default rule: make test-all
        (4, "visit"),
        pytest.param(8, "loss", marks=pytest.mark.slow),
        pytest.param(8, "visit", marks=pytest.mark.slow),
    ],
)
def test_leaf_batch_matches_python_reference(k, rule):
    budgets = np.array([24, 40, 9, 31], np.int32)  # not multiples of K: partial last steps
    c = np.array([1.25, 0.8, 2.0, 1.25], np.float32)
    max_path = 6  # small, so depth-capped revisits are exercised too
    boards, root_state = _positions()
    root_hash = jnp.arange(len(POSITIONS), dtype=jnp.uint32) * 1013 + 17
    params = tree_search.SearchParams(19652.0, "reduction", 0.0, max_path, virtual_loss=rule)

    @jax.jit
    def run(root_state, root_hash, budgets, c):
        root = _jax_eval(root_state, root_hash)
        tree = tree_search.search(
            root, _expand, budgets, c, num_nodes=41, params=params, leaf_batch=k
        )
        return tree.children_visits[:, 0], tree.node_visits[:, 0], tree.node_values[:, 0]

    visits, root_visits, root_value = jax.device_get(
        run(root_state, root_hash, jnp.asarray(budgets), jnp.asarray(c))
    )
    np.testing.assert_array_equal(visits.sum(-1), budgets)  # collisions still count
    np.testing.assert_array_equal(root_visits, budgets + 1)
    for b, board in enumerate(boards):
        ref = LeafBatchReference(
            HashEvaluator(int(root_hash[b])), k=k, rule=rule, max_path=max_path
        )
        root = ref.run_tree(board, int(budgets[b]), float(c[b]))
        expected = np.zeros(vocab.NUM_MOVES, np.int32)
        for move, child in root.children.items():
            expected[move] = child.visits
        np.testing.assert_array_equal(visits[b], expected, err_msg=f"game {b}")
        np.testing.assert_allclose(root_value[b], root.value, atol=1e-5)


@functools.cache
def _simulations(k: int):
    """One jitted ``run_simulations`` per K (chunk bounds and budgets are traced)."""
    params = tree_search.SearchParams(19652.0, "reduction", 0.0, 32)
    return jax.jit(
        lambda t, budgets, a, z: tree_search.run_simulations(
            t, _expand, budgets, a, z, num_nodes=41, params=params, leaf_batch=k
        )
    )


def _toy_tree(k: int, budgets, chunks=None):
    """Trees of the four positions with ``budgets``, run in ``chunks`` (bounds) or at once."""
    _, root_state = _positions()
    root_hash = jnp.arange(len(POSITIONS), dtype=jnp.uint32) * 1013 + 17
    c = jnp.full(len(POSITIONS), 1.25, jnp.float32)
    budgets = jnp.asarray(budgets, jnp.int32)
    tree = tree_search.init_tree(_jax_eval(root_state, root_hash), c, 41, log_prior=True)
    bounds = chunks or [0, int(budgets.max())]
    for a, z in zip(bounds[:-1], bounds[1:], strict=True):
        tree = _simulations(k)(tree, budgets, jnp.int32(a), jnp.int32(z))
    return tree


@pytest.mark.slow  # a KL-selection search per rule (~45 s each to compile and run)
@pytest.mark.parametrize("rule", ["visit", "loss"])
def test_kl_selection_takes_k_leaves_under_either_rule(rule):
    """A selection other than pUCT (KL-regularised; its unvisited edges take the mixed value,
    which the in-flight rule keeps as a pending edge's Q) with K = 4: every game gets its whole
    budget at the root, and the new nodes hang under the parents that chose them."""
    budgets = jnp.asarray([24, 9, 31, 16], jnp.int32)
    _, root_state = _positions()
    root_hash = jnp.arange(len(POSITIONS), dtype=jnp.uint32) * 1013 + 17
    c = jnp.full(len(POSITIONS), 1.25, jnp.float32)
    params = tree_search.SearchParams(19652.0, "reduction", 0.0, 32, 4, rule)
    select = selection.make_kl_selection(anchor_lambda=0.11)

    @jax.jit
    def run(root_state, root_hash):
        root = _jax_eval(root_state, root_hash)
        return tree_search.search(
            root, _expand, budgets, c, num_nodes=32, params=params, select_fn=select
        )

    tree = run(root_state, root_hash)
    np.testing.assert_array_equal(tree.children_visits[:, 0].sum(-1), budgets)
    np.testing.assert_array_equal(tree.node_visits[:, 0], budgets + 1)
    parents, actions = np.asarray(tree.parents), np.asarray(tree.action_from_parent)
    index = np.asarray(tree.children_index)
    for b in range(len(POSITIONS)):
        for node in range(1, int(budgets[b]) + 1):
            if parents[b, node] >= 0:  # a node (collisions leave their slot empty)
                assert index[b, parents[b, node], actions[b, node]] == node


def test_chunks_on_step_bounds_build_the_same_tree():
    """A clocked search runs the loop in chunks; chunk bounds on multiples of K change nothing."""
    budgets = [30, 12, 40, 7]
    whole = _toy_tree(4, budgets)
    chunked = _toy_tree(4, budgets, chunks=[0, 8, 12, 28, 40])
    for name in ("children_visits", "node_visits", "parents", "children_index"):
        np.testing.assert_array_equal(getattr(chunked, name), getattr(whole, name), err_msg=name)
    np.testing.assert_array_equal(chunked.children_visits[:, 0].sum(-1), budgets)


def test_virtual_loss_marks_the_pending_path_lost():
    """One pending leaf: every edge on its path and the chosen edge gain one lost visit."""
    tree = _toy_tree(1, [5, 5, 5, 5])
    b = 0
    # a leaf below root child ``first`` (node 1): path [1], choosing action 0 at node 1
    path = jnp.zeros((4, 3), jnp.int32).at[:, 0].set(1)
    depth = jnp.ones(4, jnp.int32)
    legal = np.flatnonzero(
        np.asarray(selection.legal_from_logits(tree.children_prior_logits[b, 1]))
    )
    action = jnp.full(4, int(legal[0]), jnp.int32)
    active = jnp.asarray([True, False, True, True])
    out = tree_search.virtual_loss(
        tree, path, depth, jnp.ones(4, jnp.int32), action, jnp.zeros(4, bool), active, 41
    )
    first = int(tree.action_from_parent[b, 1])
    n = int(tree.children_visits[b, 0, first])
    assert int(out.children_visits[b, 0, first]) == n + 1
    v = float(tree.children_values[b, 0, first])
    assert float(out.children_values[b, 0, first]) == pytest.approx((v * n + 1) / (n + 1))
    a = int(legal[0])
    n, v = int(tree.children_visits[b, 1, a]), float(tree.children_values[b, 1, a])
    assert int(out.children_visits[b, 1, a]) == n + 1
    assert float(out.children_values[b, 1, a]) == pytest.approx((v * n + 1) / (n + 1))
    np.testing.assert_array_equal(out.node_visits[b, :2], np.asarray(tree.node_visits[b, :2]) + 1)
    np.testing.assert_array_equal(out.node_values, tree.node_values)  # FPU's V(parent) kept
    # an inactive game is untouched
    np.testing.assert_array_equal(out.children_visits[1], tree.children_visits[1])


def test_virtual_visit_counts_the_pending_path_and_keeps_q():
    """lc0's rule: the same visits as the virtual loss, no value moved; an unvisited chosen edge
    keeps the FPU value V(parent) − fpu as its Q (stored as the child value −Q)."""
    tree = _toy_tree(1, [5, 5, 5, 5])
    b, fpu = 0, 0.3
    path = jnp.zeros((4, 3), jnp.int32).at[:, 0].set(1)
    depth = jnp.ones(4, jnp.int32)
    legal = np.asarray(selection.legal_from_logits(tree.children_prior_logits[b, 1]))
    unvisited = np.flatnonzero(legal & (np.asarray(tree.children_visits[b, 1]) == 0))
    action = jnp.full(4, int(unvisited[0]), jnp.int32)
    active = jnp.asarray([True, False, True, True])
    args = (tree, path, depth, jnp.ones(4, jnp.int32), action, jnp.zeros(4, bool), active, 41)
    out = tree_search.virtual_visit(*args, fpu_mode="reduction", fpu=fpu)
    lost = tree_search.virtual_loss(*args)
    for name in ("node_visits", "children_visits"):  # the same counts as the virtual loss
        np.testing.assert_array_equal(getattr(out, name), getattr(lost, name), err_msg=name)
    a = int(unvisited[0])
    changed = np.argwhere(np.asarray(out.children_values != tree.children_values))
    assert {(int(g), int(n), int(m)) for g, n, m in changed} <= {(g, 1, a) for g in (0, 2, 3)}
    want = float(tree.node_values[b, 1]) - fpu  # the Q pUCT gave the edge (its FPU)
    assert float(-out.children_values[b, 1, a]) == pytest.approx(want)
    q_after = selection.completed_q(
        jax.tree.map(lambda x: x[b], out), 1, fpu_mode="reduction", fpu=fpu
    )
    assert float(q_after[a]) == pytest.approx(want)  # now "visited", with the same Q
    np.testing.assert_array_equal(out.node_values, tree.node_values)


# ----------------------------------------------------------------------------- the model's leaves
@pytest.fixture(scope="module")
def tiny_model():
    from flax import nnx

    from allie_jax.model import AllieModel, ModelConfig

    return AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(0))


def test_path_forward_leaf_rows_read_one_root_per_game(tiny_model):
    """K leaf rows per game against one root row each (``leaf_batch``) give what the same rows
    give with the root cache repeated per row (the one-leaf evaluator, K = 1)."""
    from allie_jax.search import evaluator

    model, cfg = tiny_model, tiny_model.config
    rng = np.random.default_rng(1)
    lengths, k, nodes, p = [9, 14], 3, 6, 4
    tokens = np.zeros((2, 16), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(0, vocab.NUM_MOVES, n)
    _, cache = model.extend(jnp.asarray(tokens), model.init_cache(2, 16), jnp.asarray(lengths))
    shape = (2, nodes, cfg.num_layers, cfg.num_heads, cfg.head_dim)
    store_k = jnp.asarray(rng.normal(size=shape), jnp.float32)
    store_v = jnp.asarray(rng.normal(size=shape), jnp.float32)
    action = jnp.asarray(rng.integers(0, vocab.NUM_MOVES, 2 * k), jnp.int32)
    path_nodes = jnp.asarray(rng.integers(1, nodes, (2 * k, p)), jnp.int32)
    path_len = jnp.asarray([0, 1, 3, 2, 4, 1], jnp.int32)
    grouped = evaluator.path_forward(
        model, action, evaluator.heads_first(cache), path_nodes, path_len, store_k, store_v, k
    )
    rep = lambda x: jnp.repeat(x, k, axis=0 if x.ndim < 4 else 1)  # noqa: E731
    per_row = type(cache)(rep(cache.k), rep(cache.v), rep(cache.length))
    plain = evaluator.path_forward(
        model,
        action,
        evaluator.heads_first(per_row),
        path_nodes,
        path_len,
        jnp.repeat(store_k, k, axis=0),
        jnp.repeat(store_v, k, axis=0),
    )
    np.testing.assert_allclose(grouped[0].policy_logits, plain[0].policy_logits, atol=1e-5)
    np.testing.assert_allclose(grouped[0].value, plain[0].value, atol=1e-6)
    np.testing.assert_allclose(grouped[1], plain[1], atol=1e-6)


def _games():
    from allie_jax.game import Game

    lines = ["e2e4 e7e5 g1f3", "d2d4 d7d5 c2c4 e7e6", "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6"]
    return [
        Game(moves=m.split(), white_elo=1500, black_elo=1500, time_control="180+2") for m in lines
    ]


@pytest.mark.slow  # two compiled searches (one call, and the clocked start/chunk/finish)
def test_searcher_leaf_batch_budgets_and_chunks(tiny_model):
    """``SearchConfig.leaf_batch`` through the Searcher: every game gets its whole budget at the
    root, only legal moves are visited, and the chunked (clocked) search builds the same tree."""
    from allie_jax.search import SearchConfig, Searcher

    config = SearchConfig(mode="search", mean_sims=30, max_sims=30, leaf_batch=4)
    games = _games()
    plain = Searcher(tiny_model, config).run(games, 0)
    chunked = Searcher(tiny_model, config).run(games, 0, should_stop=lambda: False)
    np.testing.assert_array_equal(plain.num_sims, [30, 30, 30])
    np.testing.assert_array_equal(plain.visit_counts.sum(-1), 30)
    np.testing.assert_array_equal(chunked.visit_counts, plain.visit_counts)
    for i, g in enumerate(games):
        board = chess.Board()
        for m in g.moves:
            board.push_uci(m)
        legal = np.zeros(vocab.NUM_MOVES, bool)
        legal[[vocab.encode_move(m.uci()) for m in board.legal_moves]] = True
        assert (plain.visit_counts[i][~legal] == 0).all()
        assert legal[plain.move_id[i]]


# ----------------------------------------------------------------------------- agreement
_PIECE_VALUES = jnp.asarray([0.0, 1, 3, 3, 5, 9, 0])  # none, pawn .. king (chess_jax codes)


def _material_eval(state) -> tree_search.NodeEval:
    """A real evaluator without a trained model: uniform prior over the legal moves, value
    tanh(material / 4) for the side to move (chess_jax boards are side-relative), exact values
    at mates and draws."""
    legal = chess_jax.legal_mask(state)
    done, exact = evaluator_lib.terminal_value(state, legal)
    board = state.board.astype(jnp.int32)
    material = jnp.sum(jnp.sign(board) * _PIECE_VALUES[jnp.abs(board)], -1)
    logits = selection.mask_logits(jnp.zeros(legal.shape, jnp.float32), legal)
    value = jnp.where(done, exact, jnp.tanh(material / 4.0))
    return tree_search.NodeEval(logits, value, done, {"state": state})


def _material_expand(payloads, parent, path_nodes, path_len, action, num_active):
    k = parent.shape[0] // payloads["state"].color.shape[0]
    game = jnp.arange(parent.shape[0]) // k
    state = jax.tree.map(lambda x: x[game, parent], payloads["state"])
    return _material_eval(chess_jax.apply(state, action))


@pytest.mark.slow  # compiled chess searches of 32 games (one-leaf, and K = 8 per rule)
@pytest.mark.parametrize("rule", ["visit", "loss"])
def test_leaf_batch_moves_agree_with_one_leaf_search(sample_pgn, rule):
    """On real positions (sample games cut at plies 10..40), the move a K = 8 search draws from
    its final policy π̄ agrees with the move of a one-leaf search of the same budget at least as
    often as the moves of two one-leaf searches with different seeds agree, up to the positions'
    noise (the mean per-position difference is at least −2 standard errors of it). The one-leaf
    tree does not depend on the seed, so those agree with probability sum(π₁²); the K search and
    a one-leaf one with sum(π₈ · π₁) (exact expectations, no sampling noise)."""
    from allie_jax.pgn import read_games
    from allie_jax.search import pibar

    plies = list(range(10, 41, 2))
    moves = []
    for game in read_games(str(sample_pgn)):
        ply = plies[len(moves) % len(plies)]
        if len(game.moves) > ply + 1:
            moves.append([vocab.encode_move(m) for m in game.moves[:ply]])
        if len(moves) == 32:
            break
    ids, lengths = chess_jax.pad_move_ids(moves)
    state = chess_jax.replay(jnp.asarray(ids), jnp.asarray(lengths))
    batch, sims = len(moves), 64
    c = jnp.full(batch, 1.25, jnp.float32)

    @functools.partial(jax.jit, static_argnums=(0, 1))
    def final_policy(k, rule, state):
        params = tree_search.SearchParams(19652.0, "reduction", 0.0, 32, k, rule)
        root = _material_eval(state)
        budgets = jnp.full(batch, sims)
        tree = tree_search.search(
            root, _material_expand, budgets, c, num_nodes=sims + 1, params=params
        )
        q = jax.vmap(lambda t: selection.completed_q(t, 0, fpu_mode="reduction", fpu=0.0))(tree)
        legal = selection.legal_from_logits(root.prior_logits)
        prior = jnp.where(legal, jax.nn.softmax(root.prior_logits, -1), 0.0)
        visits = tree.children_visits[:, 0]
        lam = pibar.kl_lambda(c, visits.sum(-1), legal.sum(-1))
        return pibar.pibar(q, prior, legal, lam), visits

    one, _ = jax.device_get(final_policy(1, "loss", state))
    eight, eight_visits = jax.device_get(final_policy(8, rule, state))
    np.testing.assert_array_equal(eight_visits.sum(-1), sims)
    two_seeds = (one * one).sum(-1)
    diff = (eight * one).sum(-1) - two_seeds
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    assert float(two_seeds.mean()) > 0.1  # the searches choose: not a uniform policy
    assert diff.mean() >= -2.0 * se, (float(diff.mean()), float(se), float(two_seeds.mean()))
