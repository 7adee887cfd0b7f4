"""Parity: the jitted batched search against the plain-Python reference MCTS (python-chess).

Both use the same deterministic fake evaluator: logits and value are hashes of the move path
(uint32 arithmetic, exact in numpy and JAX), so any difference in selection, FPU, value signs,
terminal handling, legality masking or π̄ shows up as different visit counts.
"""

from __future__ import annotations

import chess
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax import chess_jax, vocab
from allie_jax.search import evaluator, pibar, selection, tree_search
from allie_jax.search.reference import ReferenceMCTS

SEED_LOGIT, SEED_VALUE = 7919, 1_000_003


def _mix_np(x, y):
    x = np.uint32(x)
    with np.errstate(over="ignore"):
        x = (x ^ (np.uint32(y) * np.uint32(0x9E3779B1))) * np.uint32(0x85EBCA6B)
    return x ^ (x >> np.uint32(13))


def _mix_jnp(x, y):
    x = (x ^ (y * jnp.uint32(0x9E3779B1))) * jnp.uint32(0x85EBCA6B)
    return x ^ (x >> 13)


def _unit(x):
    return (x >> 8).astype(np.float32) / np.float32(2**24)


class HashEvaluator:
    """Reference side: value for the side to move and logits from the path's hash."""

    def __init__(self, root_hash: int):
        self.root_hash = np.uint32(root_hash)

    def node_hash(self, path):
        h = self.root_hash
        for move in path:
            h = _mix_np(h, np.uint32(move + 1))
        return h

    def __call__(self, path):
        h = self.node_hash(path)
        moves = np.arange(vocab.NUM_MOVES, dtype=np.uint32)
        logits = 4.0 * _unit(_mix_np(h, moves + np.uint32(SEED_LOGIT)))
        value = 2.0 * _unit(_mix_np(h, np.uint32(SEED_VALUE))) - 1.0
        return logits.astype(np.float64), float(value)


def _jax_eval(state, h):
    moves = jnp.arange(vocab.NUM_MOVES, dtype=jnp.uint32)
    logits = 4.0 * _unit(_mix_jnp(h[:, None], moves[None] + SEED_LOGIT))
    value = 2.0 * _unit(_mix_jnp(h, jnp.uint32(SEED_VALUE))) - 1.0
    legal = chess_jax.legal_mask(state)
    done, exact = evaluator.terminal_value(state, legal)
    return tree_search.NodeEval(
        selection.mask_logits(logits, legal),
        jnp.where(done, exact, value),
        done,
        {"state": state, "hash": h},
    )


def _expand(payloads, parent, path_nodes, path_len, action, num_active):
    rows = jnp.arange(parent.shape[0])
    state = jax.tree.map(lambda x: x[rows, parent], payloads["state"])
    h = _mix_jnp(payloads["hash"][rows, parent], action.astype(jnp.uint32) + 1)
    return _jax_eval(chess_jax.apply(state, action), h)


POSITIONS = [
    "e2e4 e7e5 g1f3 b8c6 f1b5 a7a6",
    "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6",  # mate in one (h5f7)
    "d2d4 g8f6 c2c4 e7e6 g1f3 d7d5 b1c3 f8e7 c1g5 e8g8",
    "e2e4 d7d5 e4d5 d8d5 b1c3 d5a5 d2d4 c7c6 g1f3 c8f5 f3e5 e7e6 g2g4 f5g6 h2h4",
]


@pytest.mark.parametrize(
    ("fpu_mode", "fpu", "lambda_sqrt"),
    [
        ("reduction", 0.0, True),
        pytest.param("absolute", 0.0, False, marks=pytest.mark.slow),  # the released rules
        pytest.param("reduction", 0.2, True, marks=pytest.mark.slow),
    ],
)
def test_batched_search_matches_python_reference(fpu_mode, fpu, lambda_sqrt):
    budgets = np.array([24, 40, 9, 31], np.int32)
    c = np.array([1.25, 0.8, 2.0, 1.25], np.float32)
    max_path = 6  # small, so depth-capped revisits are exercised too
    boards, moves = [], []
    for line in POSITIONS:
        board = chess.Board()
        for m in line.split():
            board.push_uci(m)
        boards.append(board)
        moves.append([vocab.encode_move(m) for m in line.split()])
    ids, lengths = chess_jax.pad_move_ids(moves)
    root_state = chess_jax.replay(jnp.asarray(ids), jnp.asarray(lengths))
    root_hash = jnp.arange(len(POSITIONS), dtype=jnp.uint32) * 1013 + 17
    params = tree_search.SearchParams(19652.0, fpu_mode, fpu, max_path)

    @jax.jit
    def run(root_state, root_hash, budgets, c):
        root = _jax_eval(root_state, root_hash)
        tree = tree_search.search(root, _expand, budgets, c, num_nodes=41, params=params)
        q = jax.vmap(lambda t: selection.completed_q(t, 0, fpu_mode=fpu_mode, fpu=fpu))(tree)
        legal = selection.legal_from_logits(root.prior_logits)
        prior = jnp.where(legal, jax.nn.softmax(root.prior_logits, -1), 0.0)
        visits = tree.children_visits[:, 0]
        # the reference's λ_N with the per-game c: the "released" schedule, named explicitly
        lam = pibar.schedule_lambda(
            "released",
            anchor_lambda=0.0,  # unused by "released"
            c_puct=1.25,  # unused by "released"
            scaled_c_puct=c,
            total_visits=visits.sum(-1),
            num_legal=legal.sum(-1),
            sqrt=lambda_sqrt,
        )
        return visits, pibar.pibar(q, prior, legal, lam), q, tree.node_values[:, 0]

    visits, policy, q, root_value = jax.device_get(
        run(root_state, root_hash, jnp.asarray(budgets), jnp.asarray(c))
    )
    for b, board in enumerate(boards):
        ref = ReferenceMCTS(
            HashEvaluator(int(root_hash[b])),
            fpu_mode=fpu_mode,
            fpu=fpu,
            lambda_sqrt=lambda_sqrt,
            max_path=max_path,
        ).run(board, int(budgets[b]), c=float(c[b]))
        np.testing.assert_array_equal(
            visits[b], ref.visit_counts.astype(np.int32), err_msg=f"game {b}"
        )
        np.testing.assert_allclose(root_value[b], ref.root_value, atol=1e-5)
        legal = ref.prior > 0
        np.testing.assert_allclose(q[b][legal], ref.q[legal], atol=1e-5)
        np.testing.assert_allclose(policy[b], ref.policy, atol=2e-5)
    mate = vocab.encode_move("h5f7")
    if visits[1][mate] > 0:  # exact mate value, from the mover's view
        assert q[1][mate] == pytest.approx(1.0)


# ------------------------------------------------- KL-regularised selection at every node
# A hand-made two-level tree (two moves everywhere; a node's code c has children 2c + a + 1):
# root (code 0): prior [0.6, 0.4]; child 0 (code 1) value +0.5 for its mover, so Q(root, 0) =
# −0.5; child 1 (code 2) value −0.5, Q(root, 1) = +0.5, prior [0.7, 0.3] over its children code 5
# (value +0.2 for its mover, the root's side) and code 6 (value −0.3). λ = 0.11 everywhere.
_HAND_PRIOR = np.array([[0.6, 0.4], [0.5, 0.5], [0.7, 0.3]] + [[0.5, 0.5]] * 4, np.float32)
_HAND_VALUE = np.array([0.0, 0.5, -0.5, 0.1, -0.1, 0.2, -0.3], np.float32)


def _hand_eval(code):
    logits = jnp.log(jnp.asarray(_HAND_PRIOR))[code]
    return tree_search.NodeEval(
        logits, jnp.asarray(_HAND_VALUE)[code], jnp.zeros_like(code, bool), code
    )


def _hand_expand(payloads, parent, path_nodes, path_len, action, num_active):
    rows = jnp.arange(parent.shape[0])
    return _hand_eval(2 * payloads[rows, parent] + action.astype(jnp.int32) + 1)


def test_kl_selection_on_a_hand_worked_two_level_tree():
    """Budgets 1..5 of one search, against the choices worked by hand (π̄ solved in closed form:
    with two moves Σ λ·p_a/(α − q_a) = 1 is a quadratic in α).

    1. No child visited: π̄ = prior → move 0 (expands code 1, Q = −0.5).
    2. Q = [−0.5, mixed (0 + 1·(−0.5))/2 = −0.25]: α² + 0.14α − 0.011 = 0, α = 0.0561,
       π̄ = [0.216, 0.784]; scores π̄ − N/(1+ΣN) = [−0.284, 0.784] → move 1 (code 2).
    3. Q = [−0.5, 0.5]: π̄ = [0.063, 0.937], scores [−0.270, 0.604] → 1; at code 2 nothing is
       visited: its prior's argmax, code 5 (code 2's mean becomes (−0.5 − 0.2)/2 = −0.35).
    4. Q = [−0.5, 0.35]: π̄ = [0.074, 0.926], scores [−0.176, 0.426] → 1; at code 2,
       Q = [−0.2, mixed (−0.5 + 1·(−0.2))/2 = −0.35]: π̄ = [0.862, 0.138], scores
       [0.362, 0.138] → code 5 again (depth 2 = max_path: its value is backed up again).
    5. Q = [−0.5, 0.3]: π̄ = [0.078, 0.922], scores [−0.122, 0.322] → 1; at code 2,
       Q = [−0.2, mixed (−0.5 + 2·(−0.2))/3 = −0.3]: α² − 0.01α − 0.0077 = 0, α = 0.0929,
       π̄ = [0.829, 0.171], scores [0.162, 0.171] → code 6.
    """
    budgets = jnp.arange(1, 6, dtype=jnp.int32)
    root = _hand_eval(jnp.zeros(5, jnp.int32))
    select = selection.make_kl_selection(anchor_lambda=0.11)
    params = tree_search.SearchParams(19652.0, "reduction", 0.0, 2)
    tree = tree_search.search(
        root, _hand_expand, budgets, jnp.ones(5), num_nodes=6, params=params, select_fn=select
    )
    root_visits = np.asarray(tree.children_visits[:, 0])
    np.testing.assert_array_equal(root_visits, [[1, 0], [1, 1], [1, 2], [1, 3], [1, 4]])
    child1 = np.asarray(tree.children_index[:, 0, 1])
    below = np.asarray(tree.children_visits[jnp.arange(5), jnp.maximum(child1, 0)])
    np.testing.assert_array_equal(below[2:], [[1, 0], [2, 0], [2, 1]])


@pytest.mark.slow
def test_kl_selection_matches_python_reference():
    """KL-regularised selection at every node: the batched search against ``ReferenceMCTS``
    (selection="kl", float64 π̄) on real chess trees, visit for visit."""
    budgets = np.array([24, 40, 9, 31], np.int32)
    boards, moves = [], []
    for line in POSITIONS:
        board = chess.Board()
        for m in line.split():
            board.push_uci(m)
        boards.append(board)
        moves.append([vocab.encode_move(m) for m in line.split()])
    ids, lengths = chess_jax.pad_move_ids(moves)
    root_state = chess_jax.replay(jnp.asarray(ids), jnp.asarray(lengths))
    root_hash = jnp.arange(len(POSITIONS), dtype=jnp.uint32) * 1013 + 17
    params = tree_search.SearchParams(19652.0, "reduction", 0.0, 6)
    select = selection.make_kl_selection(anchor_lambda=0.11)

    @jax.jit
    def run(root_state, root_hash, budgets):
        root = _jax_eval(root_state, root_hash)
        c = jnp.ones(budgets.shape, jnp.float32)
        tree = tree_search.search(
            root, _expand, budgets, c, num_nodes=41, params=params, select_fn=select
        )
        return tree.children_visits[:, 0], tree.node_values[:, 0]

    visits, root_value = jax.device_get(run(root_state, root_hash, jnp.asarray(budgets)))
    for b, board in enumerate(boards):
        ref = ReferenceMCTS(
            HashEvaluator(int(root_hash[b])), max_path=6, selection="kl", anchor_lambda=0.11
        ).run(board, int(budgets[b]))
        np.testing.assert_array_equal(visits[b], ref.visit_counts.astype(np.int32), err_msg=f"{b}")
        np.testing.assert_allclose(root_value[b], ref.root_value, atol=1e-5)
