"""``NotebookGame``: warmed before its clocks start, on the clock with a deadline, one game id."""

from __future__ import annotations

import time

import chess
import pytest
from flax import nnx

from allie_jax.engine.api import Allie
from allie_jax.engine.pacing import Clock, time_budget
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel
from allie_jax.notebook import NotebookGame

pytestmark = pytest.mark.xdist_group("play_web")  # the tiny model compiles once per worker


class _Recording:
    """An ``Allie`` that records what the game asks of it, in order."""

    def __init__(self, allie: Allie) -> None:
        self.allie = allie
        self.events: list[tuple] = []

    def warmup(self, mode, batch_size=1, **kw):
        self.events.append(("warmup", mode, batch_size))
        return self.allie.warmup(mode, batch_size, **kw)

    def play(self, games, preset="policy", rng=0, **kw):
        self.events.append(("play", games[0].game_id, kw.get("deadline"), time.monotonic()))
        return self.allie.play(games, preset, rng, **kw)

    def predict(self, games, **kw):
        self.events.append(("predict",))
        return self.allie.predict(games, **kw)


@pytest.fixture(scope="module")
def allie() -> Allie:
    """A tiny untrained model, its policy mode compiled once for the module (the games below
    warm up again: that call finds every program compiled)."""
    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    allie.warmup("policy", 1)
    return allie


def test_notebook_game_warms_first_and_plays_on_the_clock(allie):
    rec = _Recording(allie)
    game = NotebookGame(
        rec, human_colour="black", mode="policy", show=False, base_s=600.0, increment_s=2.0
    )
    # compiled before anything else, and before the clocks started: the engine's first move
    # was charged only its own thinking, within its budget
    assert rec.events[0] == ("warmup", "policy", 1) and allie.fixed_shapes
    budget = time_budget(Clock(time_left_s=600.0, increment_s=2.0))
    first = game.log[0]
    assert first["budget_s"] == pytest.approx(budget, abs=0.5)
    assert first["spent_s"] <= first["budget_s"]
    for reply in ("e7e5", "b8c6"):
        game.move(
            reply
            if chess.Move.from_uci(reply) in game.board.legal_moves
            else sorted(m.uci() for m in game.board.legal_moves)[0]
        )
    plays = [e for e in rec.events if e[0] == "play"]
    assert len(plays) == 3
    ids = {e[1] for e in plays}
    assert len(ids) == 1 and ids != {""}  # one id for the whole game: the cache is reused
    for _, _, deadline, called in plays:  # each move's deadline comes from the engine's clock
        assert deadline is not None and called < deadline <= called + budget + 2.0
    replay = chess.Board()
    for m in game.board.move_stack:
        replay.push(m)  # python-chess accepts every move
    assert len(replay.move_stack) == 5 and game.session.time_left(chess.WHITE) <= 600 + 3 * 2

    game.takeback()  # the engine's last answer and our last move
    assert len(game.board.move_stack) == 3
    agreed = game.offer_draw()
    assert ("predict",) in rec.events and isinstance(agreed, bool)
    assert ("accepts" if agreed else "declines") in game.session.notice


def test_untimed_notebook_game_has_no_deadline(allie):
    rec = _Recording(allie)
    game = NotebookGame(rec, human_colour="white", mode="policy", show=False)
    game.move("e2e4")
    plays = [e for e in rec.events if e[0] == "play"]
    assert len(plays) == 1 and plays[0][2] is None and game.log[0]["budget_s"] is None
    with pytest.raises(Exception, match="illegal"):
        game.move("e2e5")
