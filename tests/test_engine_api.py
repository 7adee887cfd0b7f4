"""The inference API against independent references: python-chess's legal moves and an unpadded,
unbatched forward pass of the same model."""

from __future__ import annotations

import collections
import dataclasses
import itertools

import chess
import chess.engine
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.engine import Allie, Decision, Prediction
from allie_jax.engine import api as api_mod
from allie_jax.game import Game, denormalize_think_time, header_tokens
from allie_jax.model import AllieModel, ModelConfig


@pytest.fixture(scope="module")
def model() -> AllieModel:
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def allie(model) -> Allie:
    return Allie(model)


@pytest.fixture(scope="module")
def real_positions(sample_pgn) -> list[Game]:
    """Partial games cut at varied plies from real Lichess games."""
    from allie_jax.pgn import read_games

    games = list(itertools.islice(read_games(sample_pgn), 4))
    rng = np.random.default_rng(0)
    out = []
    for g in games:
        cut = int(rng.integers(0, len(g.moves)))
        out.append(
            Game(
                moves=g.moves[:cut],
                white_elo=g.white_elo,
                black_elo=g.black_elo,
                time_control=g.time_control,
            )
        )
    return out


def _reference(model: AllieModel, game: Game, board: chess.Board):
    """Unpadded single-game forward; softmax over python-chess's legal moves."""
    tokens = header_tokens(game.white_elo, game.black_elo, game.time_control)
    tokens += [vocab.encode_move(m) for m in game.moves]
    out = model(jnp.asarray([tokens], dtype=jnp.int32), deterministic=True)
    logits = np.asarray(out.policy_logits[0, -1], dtype=np.float64)
    legal = [m.uci() for m in board.legal_moves]
    x = np.array([logits[vocab.MOVE_TO_ID[m]] for m in legal])
    p = np.exp(x - x.max())
    p /= p.sum()
    return dict(zip(legal, p, strict=True)), float(out.time[0, -1]), float(out.value[0, -1])


def _board(game: Game) -> chess.Board:
    b = chess.Board()
    for m in game.moves:
        b.push_uci(m)
    return b


def test_predict_matches_unbatched_reference(allie, model, real_positions):
    preds = allie.predict(real_positions)
    assert len(preds) == len(real_positions)
    for game, pred in zip(real_positions[:3], preds, strict=False):
        assert isinstance(pred, Prediction)
        board = _board(game)
        ref_probs, ref_time, ref_value = _reference(model, game, board)
        assert set(pred.move_probs) == set(ref_probs)  # exactly python-chess's legal moves
        for m, p in ref_probs.items():
            assert pred.move_probs[m] == pytest.approx(p, abs=2e-5)
        assert sum(pred.move_probs.values()) == pytest.approx(1.0, abs=1e-6)
        assert pred.value_white == pytest.approx(ref_value, abs=2e-5)
        expected_t = float(np.clip(denormalize_think_time(ref_time), 0, 60))
        assert pred.think_time_s == pytest.approx(expected_t, abs=1e-3)
        assert -1.0 <= pred.value_white <= 1.0


def test_batch_composition_does_not_change_answers(allie, real_positions):
    together = allie.predict(real_positions)
    alone = [allie.predict([g])[0] for g in real_positions[:3]]
    for a, b in zip(together, alone, strict=False):
        assert a.move_probs.keys() == b.move_probs.keys()
        np.testing.assert_allclose(
            list(a.move_probs.values()), list(b.move_probs.values()), atol=2e-5
        )


def test_long_game_keeps_header_and_latest_moves(allie):
    board, moves = chess.Board(), []
    rng = np.random.default_rng(1)
    while len(moves) < 600:
        legal = list(board.legal_moves)
        if not legal or board.can_claim_draw():
            board, moves = chess.Board(), []  # restart until a long enough game
            continue
        mv = legal[int(rng.integers(len(legal)))]
        board.push(mv)
        moves.append(mv.uci())
    game = Game(moves=moves, white_elo=1500, black_elo=1500, time_control="180+2")
    tokens = api_mod.game_tokens(game)
    assert len(tokens) == vocab.MAX_SEQ_LEN
    assert list(tokens[:3]) == header_tokens(1500, 1500, "180+2")
    assert vocab.decode_move(int(tokens[-1])) == moves[-1]
    pred = allie.predict([game])[0]
    assert set(pred.move_probs) == {m.uci() for m in board.legal_moves}


def test_play_returns_legal_decisions_and_is_seeded(allie, real_positions):
    games = [g for g in real_positions if not _board(g).is_game_over()]
    d1 = allie.play(games, "policy", 7)
    d2 = allie.play(games, "policy", 7)
    assert [d.move for d in d1] == [d.move for d in d2]
    for g, d in zip(games, d1, strict=True):
        assert isinstance(d, Decision)
        assert chess.Move.from_uci(d.move) in _board(g).legal_moves
        assert d.think_time_s >= 0
        assert sum(d.policy.values()) == pytest.approx(1.0, abs=1e-4)


def test_greedy_is_argmax_at_2500(allie, real_positions):
    games = [g for g in real_positions if not _board(g).is_game_over()]
    decisions = allie.play(games, "greedy", 0)
    at_2500 = [dataclasses.replace(g, white_elo=2500, black_elo=2500) for g in games]
    preds = allie.predict(at_2500)
    for d, p in zip(decisions, preds, strict=True):
        assert d.move == max(p.move_probs, key=p.move_probs.get)


@pytest.mark.slow
def test_policy_sampling_follows_probabilities(allie):
    game = Game(moves=["e2e4", "e7e5"], white_elo=1200, black_elo=1200, time_control="300+0")
    probs = allie.predict([game])[0].move_probs
    moves = [d.move for d in allie.play([game] * 256, "policy", 3)]
    counts = {m: moves.count(m) / len(moves) for m in probs}
    # total variation between the empirical and the model distribution is small
    tv = 0.5 * sum(abs(counts[m] - probs[m]) for m in probs)
    assert tv < 0.2


def test_start_fen_uses_that_position(allie):
    fen = "8/8/8/8/8/4k3/8/4K2R w K - 0 1"
    game = Game(moves=["e1g1"], white_elo=1500, black_elo=1500)
    pred = allie.predict([game], start_fens=[fen])[0]
    board = chess.Board(fen)
    board.push_uci("e1g1")
    assert set(pred.move_probs) == {m.uci() for m in board.legal_moves}
    d = allie.play([game], "policy", 0, start_fens=[fen])[0]
    assert d.move in pred.move_probs


def test_resign_rule(allie, monkeypatch):
    """Resign iff the termination logit beats every legal move AND the mover's value < −0.9."""
    game = Game(moves=["e2e4"], white_elo=1500, black_elo=1500)  # black to move

    def fake_raw(logit_term: float, value_white: float):
        def raw(games, boards):
            logits = np.zeros((len(games), vocab.VOCAB_SIZE), np.float32)
            logits[:, vocab.TERMINATION] = logit_term
            n = len(games)
            return logits, np.zeros(n, np.float32), np.full(n, value_white, np.float32)

        return raw

    cases = [(5.0, 0.95, True), (5.0, 0.5, False), (-5.0, 0.95, False), (5.0, -0.95, False)]
    for term, value_white, expected in cases:
        monkeypatch.setattr(allie, "_raw", fake_raw(term, value_white))
        assert allie.predict([game])[0].resign is expected, (term, value_white)


def test_bad_input_names_the_problem(allie):
    with pytest.raises(ValueError, match="illegal"):
        allie.predict([Game(moves=["e2e5"])])
    with pytest.raises(ValueError, match="preset"):
        allie.play([Game(moves=[])], "blitz", 0)
    mate = Game(moves=["f2f3", "e7e5", "g2g4", "d8h4"])
    with pytest.raises(ValueError, match="over"):
        allie.play([mate], "policy", 0)


def test_load_round_trip(tmp_path, model):
    from allie_jax.model.checkpoint import save_model

    save_model(model, tmp_path / "ckpt")
    loaded = Allie.load(tmp_path / "ckpt")
    game = Game(moves=["d2d4"], white_elo=1800, black_elo=1700, time_control="180+2")
    a = Allie(model).predict([game])[0]
    b = loaded.predict([game])[0]
    assert a.move_probs.keys() == b.move_probs.keys()
    np.testing.assert_allclose(list(a.move_probs.values()), list(b.move_probs.values()), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Allie.load(tmp_path / "missing")


@pytest.mark.slow
def test_direct_greedy_agrees_with_the_searcher(model, real_positions):
    """The policy/greedy fast path and the Searcher's budget-0 path pick the same argmax."""
    from allie_jax.search import SearchConfig, Searcher

    games = [g for g in real_positions if not _board(g).is_game_over()]
    direct = Allie(model).play(games, "greedy", 0)
    out = Searcher(model, SearchConfig.preset("greedy")).run(games, api_mod.as_jax_key(0))
    assert [d.move for d in direct] == list(out.move)
    for d, t in zip(direct, out.think_time_s, strict=True):
        assert d.think_time_s == pytest.approx(float(t), abs=1e-3)


def test_lichess_bot_homemade_logic(allie):
    """lichess-bot's game object supplies the opponent's rating and the clock; moves are legal."""
    import datetime
    import types

    from allie_jax.engine.lichess_bot import AllieBot

    game = types.SimpleNamespace(
        id="abc",
        opponent=types.SimpleNamespace(rating=1730, title=None, name="x"),
        clock_initial=datetime.timedelta(seconds=180),
        clock_increment=datetime.timedelta(seconds=2),
    )
    bot = AllieBot({"mode": "policy", "self_elo": 1400, "human_pacing": False}, allie=allie)
    board = chess.Board()
    board.push_uci("e2e4")
    g, fen = bot.game_for(board, game)
    assert (g.white_elo, g.black_elo, g.time_control, fen) == (1730, 1400, "180+2", None)
    result = bot.choose(board, chess.engine.Limit(white_clock=170, black_clock=170), game)
    assert result.move in board.legal_moves and result.resigned is False
    with pytest.raises(ValueError, match="mode"):
        AllieBot({"mode": "fast"}, allie=allie)


@pytest.mark.slow
def test_deferred_warmup_covers_long_games(model, sample_pgn):
    """With ``defer_long_shapes`` warmup returns before the wide cache's programs are compiled;
    once its background thread is done, a searched move in a short game and in a game past the
    short cache width (a real 140-ply game) trace and compile nothing."""
    import jax

    from allie_jax.pgn import read_games

    long_game = next(g for g in read_games(sample_pgn) if len(g.moves) >= 140)
    long_game = dataclasses.replace(long_game, moves=long_game.moves[:140], game_id="long")
    short_game = Game(["e2e4", "e7e5"], 1500, 1500, "180+2", game_id="short")
    a = Allie(model, defer_long_shapes=True)
    a.warmup("search", 1, mean_sims=4, max_sims=4)
    assert a.long_warmup is not None
    a.long_warmup.join()
    events: list[str] = []
    listening = [True]
    jax.monitoring.register_event_duration_secs_listener(
        lambda e, s, **k: (
            events.append(e) if listening[0] and e.startswith("/jax/core/compile") else None
        )
    )
    try:
        for game in (short_game, long_game):
            d = a.play([game], "search", 0, mean_sims=4, max_sims=4, should_stop=lambda: False)[0]
            assert d.path == "search" and d.sims == 4
            assert chess.Move.from_uci(d.move) in api_mod.replay_board(game).legal_moves
    finally:
        listening[0] = False
    assert events == []


def test_engine_leaf_batch_default_applies_where_the_caller_sets_none(model):
    """``Allie(leaf_batch=K)`` (launch.uci's play default) is the K of preset names without
    one; an explicit ``leaf_batch`` (UCI ``LeafBatch``) and a SearchConfig given whole win."""
    from allie_jax.search import SearchConfig

    a = Allie(model, leaf_batch=api_mod.PLAY_LEAF_BATCH)
    assert a._config("adaptive", {}).leaf_batch == api_mod.PLAY_LEAF_BATCH
    assert a._config("adaptive", {"leaf_batch": 1}).leaf_batch == 1
    assert a._config(SearchConfig(mode="search"), {}).leaf_batch == 1
    assert Allie(model)._config("adaptive", {}).leaf_batch == 1
    # a family with its own searcher (the board model) keeps SearchConfig's default
    assert Allie(model, searcher_factory=object, leaf_batch=8).leaf_batch is None


def test_temper_draws_searched_moves_at_the_temperature():
    """UCI's Temperature on a searched move: T = 0 plays the final policy's mode, T > 0 draws
    with probability p^(1/T) / Z (counted over seeds against numpy's formula, not our rule)."""
    from allie_jax.engine.api import temper

    policy = {"e2e4": 0.5, "d2d4": 0.3, "g1f3": 0.15, "c2c4": 0.05}
    d = Decision("d2d4", 0.0, 0.0, False, 16, policy, path="search")
    assert temper(d, 0.0, 0).move == "e2e4"
    assert temper(d, 1.0, 0) is d
    assert (
        temper(dataclasses.replace(d, path="prior"), 0.0, 0).move == "d2d4"
    )  # budget-0: left alone
    moves = list(policy)
    for t in (0.5, 2.0):
        want = np.asarray([policy[m] ** (1 / t) for m in moves])
        want /= want.sum()
        counts = collections.Counter(temper(d, t, seed).move for seed in range(600))
        got = np.asarray([counts[m] / 600 for m in moves])
        assert np.abs(got - want).max() < 0.06, (t, got, want)
