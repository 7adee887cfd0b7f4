"""Metric functions and position records against hand-computed values on crafted inputs."""

from __future__ import annotations

import math

import chess
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.eval import metrics
from allie_jax.eval.positions import game_positions, random_game
from allie_jax.game import Game


def test_wilson_interval_hand_computed():
    # p = 0.8, n = 10, z = 1.96: centre = (0.8 + 0.19208) / 1.38416, half = 1.96·√0.025604 / 1.38416
    lo, hi = metrics.wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4)
    assert hi == pytest.approx(0.9433, abs=1e-4)
    # 0 / 10: [0, z²/(n + z²)] = [0, 3.8415 / 13.8415]
    lo, hi = metrics.wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / 13.8415, abs=1e-4)
    assert all(math.isnan(v) for v in metrics.wilson_interval(0, 0))
    with pytest.raises(ValueError, match="successes"):
        metrics.wilson_interval(3, 2)


def test_rate_dict():
    r = metrics.rate([True, False, True, True])
    assert r["value"] == 0.75 and r["n"] == 4 and r["successes"] == 3
    assert r["ci95"][0] < 0.75 < r["ci95"][1]


def test_pearson_hand_computed():
    # dx = [-1.5, -.5, .5, 1.5], dy = [-3, -1, 0, 4]: r = 11 / (√5 · √26)
    r = metrics.pearson([1, 2, 3, 4], [2, 4, 5, 9])
    assert r["r"] == pytest.approx(11 / math.sqrt(130), abs=1e-12)
    assert r["n"] == 4
    # Fisher z with se = 1/√(n−3) = 1
    z = math.atanh(11 / math.sqrt(130))
    assert r["ci95"][0] == pytest.approx(math.tanh(z - 1.959964), abs=1e-6)
    assert r["ci95"][1] == pytest.approx(math.tanh(z + 1.959964), abs=1e-6)
    assert metrics.pearson([1, 2, 3], [-1, -2, -3])["r"] == pytest.approx(-1.0)
    assert math.isnan(metrics.pearson([1, 1, 1, 1], [1, 2, 3, 4])["r"])


def test_bootstrap_mean_ci():
    m = metrics.mean_with_ci([0.25] * 7)
    assert m["value"] == 0.25 and m["ci95"] == [0.25, 0.25]
    values = np.random.default_rng(1).normal(size=400)
    a = metrics.mean_with_ci(values, seed=3)
    assert a == metrics.mean_with_ci(values, seed=3)  # seeded: reproducible
    se = values.std() / math.sqrt(values.size)  # bootstrap ≈ normal interval here
    assert a["ci95"][0] == pytest.approx(values.mean() - 1.96 * se, abs=0.25 * se)
    assert a["ci95"][1] == pytest.approx(values.mean() + 1.96 * se, abs=0.25 * se)


def test_rate_by_elo_bin():
    elos = [1499, 1500, 1599, 1600, 2250]
    assert list(metrics.elo_bin(elos)) == [1400, 1500, 1500, 1600, 2200]
    out = metrics.rate_by_bin([1, 1, 0, 0, 1], metrics.elo_bin(elos))
    assert list(out) == ["1400", "1500", "1600", "2200"]
    assert out["1500"]["value"] == 0.5 and out["1500"]["n"] == 2


def test_quantiles_by_bin():
    human = [0.5, 0.7, 1.5, 1.2, 1.9, 60.0]
    pred = [1.0, 3.0, 2.0, 4.0, 6.0, 9.0]
    rows = metrics.quantiles_by_bin(pred, human, [0, 1, 2, 60])
    assert [r["n"] for r in rows] == [2, 3, 1]  # the last bin is closed: 60 counts
    assert rows[0]["median"] == 2.0 and rows[0]["q25"] == 1.5 and rows[0]["q75"] == 2.5
    assert rows[1]["median"] == 4.0 and rows[1]["q25"] == 3.0 and rows[1]["q75"] == 5.0


def test_progress_decile_and_group_pearson():
    assert list(metrics.progress_decile([0, 9, 10, 5, 19], [10, 10, 10, 20, 20])) == [0, 9, 9, 2, 9]
    x = np.array([1.0, 2, 3, 1, 2, 3])
    y = np.array([1.0, 2, 3, 3, 2, 1])
    g = np.array([0, 0, 0, 1, 1, 1])
    rows = metrics.pearson_by_group(x, y, g, [0, 1])
    assert rows[0]["r"] == pytest.approx(1.0) and rows[1]["r"] == pytest.approx(-1.0)


def test_resign_rule():
    term = np.array([5.0, 5.0, 1.0, 5.0])
    best = np.array([4.0, 4.0, 4.0, 5.0])
    value = np.array([-0.95, -0.5, -0.99, -0.99])
    # only the first: termination beats the moves (strictly) and the mover's value < -0.9
    assert list(metrics.resign_decisions(term, best, value)) == [True, False, False, False]


def test_legal_move_stats_and_masked_argmax():
    logits = np.full((2, vocab.VOCAB_SIZE), -50.0)
    logits[0, [10, 20]] = [2.0, 1.0]  # top move 10 is legal
    logits[1, [10, 30]] = [1.0, 2.0]  # top move 30 is illegal
    logits[:, vocab.TERMINATION] = 3.0  # not a move: neither legal nor invalid
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    mask = np.zeros((2, vocab.NUM_MOVES), bool)
    mask[:, [10, 20]] = True
    top_legal, invalid = metrics.legal_move_stats(logp, mask)
    assert list(top_legal) == [True, False]
    z0 = math.exp(2) + math.exp(1) + math.exp(3)
    z1 = math.exp(1) + math.exp(2) + math.exp(3)
    # the mass on the other 1,965 moves (logit -50) is included: e^-50 each
    tiny = (vocab.NUM_MOVES - 2) * math.exp(-50)
    assert invalid[0] == pytest.approx(tiny / z0, rel=1e-4)
    assert invalid[1] == pytest.approx((math.exp(2) + tiny) / z1, rel=1e-6)
    assert list(metrics.masked_argmax(logits, mask)) == [10, 10]


def _game(sans: list[str], **kw) -> Game:
    board = chess.Board()
    moves = []
    for san in sans:
        m = board.parse_san(san)
        moves.append(m.uci())
        board.push(m)
    return Game(moves=moves, **kw)


def test_game_positions_special_moves():
    # castling, en passant, promotion in one crafted game
    sans = "e4 d5 e5 f5 exf6 Nc6 fxg7 Bd7 gxh8=Q e6 Nf3 Qe7 Bc4 O-O-O O-O".split()
    clocks = [170.0] * len(sans)
    clocks[10] = 20.0  # white's clock after Nf3: white's next move (Bc4, ply 12) is under pressure
    g = _game(sans, white_elo=1520, black_elo=1480, time_control="180+0", clocks=clocks)
    gp = game_positions(g)
    n = len(sans)
    assert gp.num_moves == n
    assert list(np.flatnonzero(gp.special["en_passant"])) == [4]
    assert list(np.flatnonzero(gp.special["promotion"])) == [8]
    assert list(np.flatnonzero(gp.special["castling"])) == [13, 14]
    assert gp.move_ids[14] == vocab.MOVE_TO_ID["e1g1"]
    assert list(gp.mover_elo[:2]) == [1520.0, 1480.0]
    assert gp.clock_before[0] == 180.0 and gp.clock_before[12] == 20.0
    mask = gp.accuracy_mask()
    assert list(np.flatnonzero(mask)) == [10, 11, 13, 14]  # plies >= 10, ply 12 under 30 s
    # legal ids match python-chess on every position
    board = chess.Board()
    for i, uci in enumerate(g.moves):
        assert sorted(gp.legal_ids[i]) == sorted(
            vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves
        )
        assert gp.in_check[i] == board.is_check()
        board.push_uci(uci)
    assert gp.legal_mask().shape == (n + 1, vocab.NUM_MOVES)


def test_game_positions_threefold_and_resignation():
    shuffle = "Nf3 Nf6 Ng1 Ng8 Nf3 Nf6 Ng1 Ng8".split()
    g = _game(["e4", "e5", *shuffle], result=-1.0, termination="Normal")
    gp = game_positions(g)
    # the start-after-1.e4 e5 position recurs after plies 5 and 9: the third occurrence is ply 9
    assert list(np.flatnonzero(gp.special["threefold"])) == [9]
    assert gp.resigned and not gp.final_checkmate
    assert gp.loser_to_move  # White lost and is to move at the final board
    g.result = 1.0  # Black resigned with White to move: the mover's resign rule cannot fire
    assert not game_positions(g).loser_to_move
    mate = _game("f3 e5 g4 Qh4#".split(), result=-1.0, termination="Normal")
    gm = game_positions(mate)
    assert gm.final_checkmate and not gm.resigned and len(gm.legal_ids[-1]) == 0


def test_game_positions_rejects_illegal_move():
    with pytest.raises(ValueError, match="illegal move 'e2e5' at ply 0"):
        game_positions(Game(moves=["e2e5"], game_id="x"))


def test_random_game_is_legal_and_seeded():
    a = random_game(np.random.default_rng(0))
    b = random_game(np.random.default_rng(0))
    assert a.moves == b.moves and len(a.moves) >= 1
    game_positions(a)  # replays without error
