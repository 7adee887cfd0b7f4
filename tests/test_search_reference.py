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
        lam = pibar.kl_lambda(c, visits.sum(-1), legal.sum(-1), sqrt=lambda_sqrt)
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
