"""lichess-bot's homemade route: a move overhead off every deadline, the game id for the search
cache, and the model's own prior (never an arbitrary legal move) when the search cannot answer."""

from __future__ import annotations

import threading
import time
import types

import chess
import chess.engine
import pytest
from flax import nnx

from allie_jax.engine.api import Allie
from allie_jax.engine.lichess_bot import AllieBot
from allie_jax.engine.pacing import Clock, answer_by, time_budget
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel

pytestmark = pytest.mark.xdist_group("play_web")


@pytest.fixture(scope="module")
def allie() -> Allie:
    """A tiny untrained model with its policy mode compiled (as ``load_allie`` does)."""
    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    allie.warmup("policy", 1)
    return allie


class _Slow:
    """An ``Allie`` whose search takes ``delay_s`` longer (a stalled host) or fails."""

    def __init__(self, allie: Allie, delay_s: float = 0.0, fail: bool = False) -> None:
        self.allie, self.delay_s, self.fail = allie, delay_s, fail
        self.calls: list[dict] = []
        self.finished = threading.Event()

    def play(self, games, preset, rng=0, **kw):
        called = time.monotonic()
        self.calls.append(
            {"game_id": games[0].game_id, "deadline": kw.get("deadline"), "called": called}
        )
        time.sleep(self.delay_s)
        try:
            if self.fail:
                raise RuntimeError("device lost")
            return self.allie.play(games, preset, rng, **kw)
        finally:
            self.finished.set()

    def predict(self, games, **kw):
        return self.allie.predict(games, **kw)


GAME = types.SimpleNamespace(id="lichess123", opponent=types.SimpleNamespace(rating=1650))


def _limit(seconds: float, inc: float = 0.0) -> chess.engine.Limit:
    return chess.engine.Limit(
        white_clock=seconds, black_clock=seconds, white_inc=inc, black_inc=inc
    )


def test_deadline_keeps_the_move_overhead_and_the_game_id(allie):
    slow = _Slow(allie)
    bot = AllieBot({"mode": "policy", "human_pacing": False, "move_overhead_ms": 500}, allie=slow)
    board = chess.Board()
    t0 = time.monotonic()
    result = bot.choose(board, _limit(60.0, 1.0), GAME)
    (call,) = slow.calls
    budget = time_budget(Clock(time_left_s=60.0, increment_s=1.0))
    # the deadline is the move's start (between t0 and the call) plus the budget less 0.5 s
    assert t0 + budget - 0.5 <= call["deadline"] <= call["called"] + budget - 0.5
    assert call["game_id"] == "lichess123"
    assert result.move in board.legal_moves and "decided by search" in result.info["string"]
    with pytest.raises(ValueError, match="move_overhead_ms"):
        AllieBot({"mode": "policy", "move_overhead_ms": -1}, allie=slow)


def _prior_move(allie: Allie, board: chess.Board) -> str:
    """The model's most probable legal move, read from ``Allie.predict`` by the test itself."""
    bot = AllieBot({"mode": "policy"}, allie=allie)
    game, fen = bot.game_for(board, GAME)
    probs = allie.predict([game], start_fens=[fen])[0].move_probs
    assert set(probs) == {m.uci() for m in board.legal_moves}  # python-chess's legal moves
    return max(probs.items(), key=lambda kv: kv[1])[0]


def test_a_search_past_the_hard_limit_answers_with_the_models_prior(allie):
    board = chess.Board()
    board.push_uci("e2e4")
    clock = Clock(time_left_s=2.0)
    hard = answer_by(clock)
    slow = _Slow(allie, delay_s=hard + 5.0)
    bot = AllieBot({"mode": "policy", "human_pacing": False, "move_overhead_ms": 0}, allie=slow)
    result = bot.choose(board, _limit(2.0), GAME)
    assert not slow.finished.is_set()  # answered while the search was still stuck
    assert result.move.uci() == _prior_move(allie, board)
    assert "decided by prior" in result.info["string"] and "hard limit" in result.info["string"]
    assert result.resigned is False
    slow.finished.wait(60)  # the stuck worker ends on its own


def test_a_failed_search_answers_with_the_models_prior(allie):
    board = chess.Board()
    for uci in ("d2d4", "g8f6", "c2c4"):
        board.push_uci(uci)
    bot = AllieBot({"mode": "policy", "human_pacing": False}, allie=_Slow(allie, fail=True))
    for limit in (_limit(30.0), None):  # on the clock, and without one
        result = bot.choose(board, limit, GAME)
        assert result.move.uci() == _prior_move(allie, board)
        assert "the search failed: RuntimeError: device lost" in result.info["string"]
