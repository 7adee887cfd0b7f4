"""The board family behind Allie's interfaces: Allie.load / predict / play, the board searcher,
and the evaluator's ``board`` system. References: the model's own forward on python-chess boards
(an independent path from the engine's batching) and python-chess's legal moves."""

from __future__ import annotations

import itertools

import chess
import numpy as np
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.data import board_features as bf
from allie_jax.engine.api import Allie
from allie_jax.engine.board import BoardForward, BoardSearcher
from allie_jax.eval import systems as sysmod
from allie_jax.eval.positions import game_positions
from allie_jax.game import Game
from allie_jax.model.board_transformer import BoardConfig, BoardTransformer
from allie_jax.model.checkpoint import save_model
from allie_jax.pgn import read_games
from allie_jax.search.config import SearchConfig
from allie_jax.search.reference import ReferenceMCTS


@pytest.fixture(scope="module")
def board_dir(tmp_path_factory):
    model = BoardTransformer(BoardConfig.named("board_tiny", num_layers=2), rngs=nnx.Rngs(7))
    return save_model(model, tmp_path_factory.mktemp("board") / "model")


def _reference(model, board, game):
    batch = bf.board_inputs([board], white_elos=[game.white_elo], black_elos=[game.black_elo])
    out = nnx.jit(lambda m, x: m(x))(model, {k: batch[k] for k in bf.INPUT_FIELDS})
    return np.exp(np.asarray(out.final_log_probs[0])), float(out.value[0])


@pytest.mark.slow  # the board family through Allie.play is in test_product's default set
def test_allie_predict_and_play_with_a_board_checkpoint(board_dir):
    allie = Allie.load(board_dir)
    game = Game(moves="e2e4 e7e5 g1f3 b8c6 f1b5".split(), white_elo=1600, black_elo=1400)
    board = chess.Board()
    for m in game.moves:
        board.push_uci(m)
    (pred,) = allie.predict([game])
    probs, value = _reference(allie.model, board, game)
    assert set(pred.move_probs) == {m.uci() for m in board.legal_moves}
    for uci, p in pred.move_probs.items():
        assert p == pytest.approx(probs[vocab.MOVE_TO_ID[uci]], rel=1e-4, abs=1e-7)
    assert pred.value_white == pytest.approx(value, abs=1e-6)
    assert pred.think_time_s == 0.0 and not pred.resign

    (greedy,) = allie.play([game], "greedy")
    # greedy conditions both sides on 2500: the reference with those Elos
    g2500 = Game(moves=game.moves, white_elo=2500, black_elo=2500)
    p2500, _ = _reference(allie.model, board, g2500)
    assert greedy.move == vocab.MOVES[int(np.argmax(p2500))]

    (searched,) = allie.play([game], "search", 0, mean_sims=6)
    assert searched.sims == 6 and chess.Move.from_uci(searched.move) in board.legal_moves
    assert sum(searched.policy.values()) == pytest.approx(1.0, abs=1e-6)
    assert -1.0 <= searched.value <= 1.0


def _reference_evaluator(forward, board, game):
    """ReferenceMCTS's leaf evaluator: the model on python-chess boards (the host feature
    builder), one forward per node: independent of the in-jit features and batching."""

    def evaluate(path):
        b = board.copy(stack=True)
        for move in path:
            b.push_uci(vocab.MOVES[move])
        lp, value, _, _ = forward.outputs([b], [game.white_elo], [game.black_elo])
        return lp[0], float(value[0]) if b.turn == chess.WHITE else -float(value[0])

    return evaluate


@pytest.mark.slow  # compiles the board search (about a minute and a half on 2 loaded cores)
def test_board_search_builds_the_reference_tree_on_real_positions(board_dir, sample_pgn):
    """The one search with the board model's in-jit leaves visits exactly what the plain-Python
    ReferenceMCTS (python-chess boards, one forward per node) visits, on real positions."""
    allie = Allie.load(board_dir)
    games = list(itertools.islice(read_games(sample_pgn), 4))
    prefixes = [
        Game(moves=g.moves[:k], white_elo=g.white_elo, black_elo=g.black_elo)
        for g, k in zip(games, (10, 25, 40, 7), strict=True)
    ]
    config = SearchConfig.preset("search", mean_sims=12, final_policy="visits")
    out = BoardSearcher(allie.model, config).run(prefixes, 0)
    forward = BoardForward(allie.model)
    for i, game in enumerate(prefixes):
        board = chess.Board()
        for m in game.moves:
            board.push_uci(m)
        ref = ReferenceMCTS(
            _reference_evaluator(forward, board, game), c_puct=config.c_puct, final_policy="visits"
        ).run(board, 12)
        np.testing.assert_array_equal(out.visit_counts[i], ref.visit_counts.astype(np.int32))
        np.testing.assert_allclose(out.prior[i], ref.prior, atol=1e-6)
        assert out.search_value[i] == pytest.approx(ref.root_value, abs=1e-5)
        assert out.num_sims[i] == 12 and not out.resign[i]


@pytest.mark.slow  # compiles the board search with 4 leaves per step (once per rule)
@pytest.mark.parametrize("rule", ["loss", "visit"])
def test_board_leaf_batch_builds_the_virtual_loss_reference_tree(board_dir, sample_pgn, rule):
    """With ``leaf_batch`` 4 the board model's leaves (4 rows per game, one forward for the
    step) give exactly the visits of the plain-Python reference with the same pending-leaf rule
    (``virtual_loss``: lost visits, or lc0's in-flight visits; python-chess boards, one forward
    per node), on real positions."""
    from tests.test_leaf_batch import LeafBatchReference

    allie = Allie.load(board_dir)
    games = list(itertools.islice(read_games(sample_pgn), 3))
    prefixes = [
        Game(moves=g.moves[:k], white_elo=g.white_elo, black_elo=g.black_elo)
        for g, k in zip(games, (12, 25, 40), strict=True)
    ]
    config = SearchConfig.preset(
        "search", mean_sims=14, final_policy="visits", leaf_batch=4, virtual_loss=rule
    )
    out = BoardSearcher(allie.model, config).run(prefixes, 0)
    forward = BoardForward(allie.model)
    for i, game in enumerate(prefixes):
        board = chess.Board()
        for m in game.moves:
            board.push_uci(m)
        ref = LeafBatchReference(
            _reference_evaluator(forward, board, game), k=4, rule=rule, c_puct=config.c_puct
        )
        root = ref.run_tree(board, 14, config.c_puct)
        expected = np.zeros(vocab.NUM_MOVES, np.int32)
        for move, child in root.children.items():
            expected[move] = child.visits
        np.testing.assert_array_equal(out.visit_counts[i], expected, err_msg=f"game {i}")
        assert out.num_sims[i] == 14


@pytest.mark.slow  # compiles the Gumbel search
def test_board_gumbel_and_policy_modes(board_dir):
    """The Gumbel preset runs the board model's search (budget, visited move); the policy preset
    draws from the model's own (reference) distribution with no tree."""
    allie = Allie.load(board_dir)
    game = Game(moves="e2e4 c7c5 g1f3".split(), white_elo=1500, black_elo=1700)
    board = chess.Board()
    for m in game.moves:
        board.push_uci(m)
    out = BoardSearcher(allie.model, SearchConfig.preset("gumbel", mean_sims=8)).run([game], 2)
    assert out.num_sims[0] == 8 and out.visit_counts[0].sum() == 8
    assert out.visit_counts[0, out.move_id[0]] > 0 and not out.resign[0]
    assert chess.Move.from_uci(out.move[0]) in board.legal_moves
    probs, _ = _reference(allie.model, board, game)
    policy = BoardSearcher(allie.model, SearchConfig.preset("policy")).run([game], 2)
    legal = [vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves]
    np.testing.assert_allclose(
        policy.policy[0][legal], probs[legal] / probs[legal].sum(), rtol=1e-4
    )
    assert policy.num_sims[0] == 0


def test_board_search_refuses_adaptive_modes(board_dir):
    allie = Allie.load(board_dir)
    with pytest.raises(ValueError, match="think time"):
        BoardSearcher(allie.model, SearchConfig.preset("adaptive"))


def test_board_eval_system_matches_the_model(board_dir, sample_pgn):
    games = list(itertools.islice(read_games(sample_pgn), 2))
    gps = [game_positions(g) for g in games]
    game = np.concatenate([np.full(gp.num_moves + 1, i) for i, gp in enumerate(gps)])
    ply = np.concatenate([np.arange(gp.num_moves + 1) for gp in gps])
    positions = sysmod.Positions(games, gps, game, ply)
    ctx = sysmod.SystemContext(options={"board_checkpoint": str(board_dir)})
    (system,) = sysmod.make_systems(["board"], ctx)
    scores = system.score(positions)
    assert scores.scored.all()
    model = system.forward
    human = positions.human_move()
    for p in (0, 5, gps[0].num_moves, len(positions) - 2):
        prefix = positions.prefix(p)
        board = chess.Board()
        for m in prefix.moves:
            board.push_uci(m)
        lp, value, _, _ = model.outputs([board], [prefix.white_elo], [prefix.black_elo])
        if human[p] >= 0:
            assert scores.p_human[p] == pytest.approx(float(np.exp(lp[0, human[p]])), rel=1e-4)
        assert scores.value[p] == pytest.approx(float(value[0]), abs=1e-6)
        legal = positions.legal_ids(p)
        assert scores.top1[p] == legal[np.argmax(lp[0, legal])]
    with pytest.raises(ValueError, match="board_checkpoint"):
        sysmod.make_systems(["board"], sysmod.SystemContext(model=object()))
