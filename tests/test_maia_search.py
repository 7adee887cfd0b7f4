"""Search on Maia: in-jit planes equal the host encoder's, the KL modes behave at their limits, and
the search finds a mate the raw policy already likes (slow: each compiles the rules + network)."""

from __future__ import annotations

import itertools

import chess
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.baselines import lc0_planes_jax as pj
from allie_jax.baselines.eval_systems import vocab_policy
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaPredictor, load_maia
from allie_jax.baselines.maia_search import MaiaSearchConfig, MaiaSearcher
from allie_jax.chess_jax import convert, rules
from allie_jax.pgn import read_games
from allie_jax.search.reference import ReferenceMCTS
from tests.conftest import SAMPLE_PGN
from tests.support.maia_support import maia_dir

pytestmark = pytest.mark.slow

MATE_IN_ONE = ["e2e4", "e7e5", "f1c4", "b8c6", "d1h5", "g8f6"]  # Qxf7#


def test_jax_planes_match_the_host_encoder_at_roots_and_after_a_move():
    games = [g.moves for g in read_games(SAMPLE_PGN) if len(g.moves) > 40][:4]
    rows, plies, encs = [], [], [GameEncoder(m) for m in games]
    for gi, moves in enumerate(games):
        rows += [gi] * len(moves)
        plies += list(range(len(moves)))
    rows, plies = np.array(rows), np.array(plies)
    width = max(len(m) for m in games)
    ids = np.zeros((len(games), width), np.int32)
    for gi, moves in enumerate(games):
        ids[gi, : len(moves)] = convert.uci_to_move_ids(moves)
    state = rules.replay(jnp.asarray(ids[rows]), jnp.asarray(plies))
    hist = [encs[g].history(p) for g, p in zip(rows, plies, strict=True)]
    boards, rep, valid = (jnp.asarray(np.stack([h[k] for h in hist])) for k in range(3))
    want = np.stack([encs[g].encode(p) for g, p in zip(rows, plies, strict=True)])
    np.testing.assert_array_equal(np.asarray(pj.planes(boards, rep, valid, state)), want)
    kh = np.array([encs[g].king_home[p] for g, p in zip(rows, plies, strict=True)])
    np.testing.assert_array_equal(np.asarray(pj.king_home(state)), kh)
    moved = rules.apply(state, jnp.asarray(ids[rows, plies]))
    b2, r2, v2 = pj.push_history(boards, rep, valid, pj.absolute_boards(moved), pj.repeated(moved))
    want = np.stack([encs[g].encode(p + 1) for g, p in zip(rows, plies, strict=True)])
    np.testing.assert_array_equal(np.asarray(pj.planes(b2, r2, v2, moved)), want)


@pytest.fixture(scope="module")
def nets():
    d = maia_dir()
    return load_maia(d / "maia-1100.pb.gz"), load_maia(d / "maia-1900.pb.gz")


@pytest.mark.parametrize("mode", ["pibar", "gumbel"])
def test_kl_limits_and_mate(nets, mode):
    prior_net, anchor_net = nets
    games = [MATE_IN_ONE, ["d2d4", "g8f6"]]
    # λ huge: the final policy is the anchor (here another network than the prior)
    cfg = MaiaSearchConfig(mode=mode, num_simulations=8, pikl_lambda=1e6)
    out = MaiaSearcher(prior_net, cfg, anchor_net=anchor_net, batch_size=2).run(
        games, jax.random.key(0)
    )
    # (the final policy's support is the visited moves: the anchor renormalised over them)
    support = out.policy > 0
    tau = np.where(support, out.anchor, 0.0)
    np.testing.assert_allclose(out.policy, tau / tau.sum(-1, keepdims=True), atol=1e-4)
    assert np.abs(out.anchor - out.prior).max() > 1e-2  # the two networks do differ
    # λ small: the search's values decide, and the mate is the move
    cfg = MaiaSearchConfig(mode=mode, num_simulations=16, pikl_lambda=0.01)
    out = MaiaSearcher(prior_net, cfg, batch_size=2).run(games, jax.random.key(1))
    assert out.move[0] == "h5f7"
    assert out.policy[0, vocab.MOVE_TO_ID["h5f7"]] > 0.99
    assert (out.num_sims == 16).all()
    assert np.allclose(out.policy.sum(-1), 1, atol=1e-5)


def test_finished_game_is_refused(nets):
    fools_mate = ["f2f3", "e7e5", "g2g4", "d8h4"]
    with pytest.raises(ValueError, match="position 0 has no legal move"):
        MaiaSearcher(nets[0], MaiaSearchConfig(num_simulations=2), batch_size=2).run(
            [fools_mate], jax.random.key(0)
        )


def _reference_evaluator(predictor, moves):
    """ReferenceMCTS's leaf evaluator: Maia on host planes (python-chess), one call per node."""

    def evaluate(path):
        full = list(moves) + [vocab.MOVES[p] for p in path]
        board = chess.Board()
        for m in full:
            board.push_uci(m)
        enc = GameEncoder(full)
        pol, wdl = predictor(enc.encode(len(full))[None])
        ids = np.array([vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves], np.int32)
        probs = vocab_policy(pol[0], len(full) % 2 == 1, enc.king_home[len(full)], ids)
        return np.log(np.maximum(probs, 1e-30)), float(wdl[0, 0] - wdl[0, 2])

    return evaluate


def test_maia_search_builds_the_reference_tree_on_real_positions(nets):
    """The one search with Maia's in-jit leaves (planes from the in-jit state) visits exactly
    what the plain-Python ReferenceMCTS with Maia on host-encoded planes visits."""
    net = nets[0]
    games = list(itertools.islice(read_games(SAMPLE_PGN), 4))
    prefixes = [g.moves[:k] for g, k in zip(games, (10, 25, 40, 7), strict=True)]
    out = MaiaSearcher(net, MaiaSearchConfig(mode="visits", num_simulations=12), batch_size=4).run(
        prefixes, jax.random.key(0)
    )
    predictor = MaiaPredictor(net, batch_size=1)
    for i, moves in enumerate(prefixes):
        board = chess.Board()
        for m in moves:
            board.push_uci(m)
        ref = ReferenceMCTS(_reference_evaluator(predictor, moves), final_policy="visits")
        res = ref.run(board, 12)
        np.testing.assert_array_equal(out.visit_counts[i], res.visit_counts.astype(np.int32))
        np.testing.assert_allclose(out.prior[i], res.prior, atol=1e-5)
        assert out.search_value[i] == pytest.approx(res.root_value, abs=1e-5)
