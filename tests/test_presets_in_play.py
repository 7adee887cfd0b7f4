"""Every search preset as a user plays it: through ``Allie.play``, the UCI engine and
``launch.match``'s runner, with a real (random-init tiny) model. Cheap settings (few
simulations); the point is that each path reaches the search with the preset's settings."""

from __future__ import annotations

import itertools
import time

import chess
import jax
import pytest
from flax import nnx

from allie_jax.engine.api import Allie
from allie_jax.engine.match import MatchConfig, parse_spec, run_match
from allie_jax.engine.uci import UciHandler
from allie_jax.game import Game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.search import SearchConfig, Searcher
from allie_jax.search.decision import as_jax_key

SEARCH_PRESETS = ("search", "adaptive", "gumbel", "gumbel-adaptive")
CHEAP = {"mean_sims": 8, "max_sims": 16}


@pytest.fixture(scope="module")
def model() -> AllieModel:
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def positions(sample_pgn) -> list[Game]:
    from allie_jax.pgn import read_games

    out = []
    for i, g in enumerate(itertools.islice(read_games(sample_pgn), 3)):
        cut = min(len(g.moves) - 1, 6 + 7 * i)
        out.append(Game(g.moves[:cut], g.white_elo, g.black_elo, g.time_control))
    return out


def _board(game: Game) -> chess.Board:
    board = chess.Board()
    for m in game.moves:
        board.push_uci(m)
    return board


@pytest.mark.slow
@pytest.mark.parametrize("preset", SEARCH_PRESETS)
def test_allie_play_is_the_searcher(model, positions, preset):
    """``Allie.play`` under a search preset answers what ``Searcher.run`` does with its key."""
    decisions = Allie(model).play(positions, preset, 5, **CHEAP)
    key_search, _ = jax.random.split(as_jax_key(5))
    out = Searcher(model, SearchConfig(mode=preset, **CHEAP)).run(positions, key_search)
    assert [d.move for d in decisions] == list(out.move)
    assert [d.sims for d in decisions] == out.num_sims.tolist()
    for game, d in zip(positions, decisions, strict=True):
        assert chess.Move.from_uci(d.move) in _board(game).legal_moves
    if preset in ("search", "gumbel"):
        assert all(d.sims == CHEAP["mean_sims"] for d in decisions)


def _uci_move(allie: Allie, preset: str) -> tuple[str, int]:
    lines: list[str] = []
    h = UciHandler(lambda: allie, lines.append, warmup=False)
    for cmd in (
        f"setoption name Mode value {preset}",
        f"setoption name MeanSims value {CHEAP['mean_sims']}",
        f"setoption name MaxSims value {CHEAP['max_sims']}",
        "position startpos moves e2e4 e7e5",
        "go wtime 600000 btime 600000",
    ):
        h.handle(cmd)
    end = time.monotonic() + 600
    while not any(x.startswith("bestmove") for x in lines):
        assert time.monotonic() < end, lines[-5:]
        time.sleep(0.01)
    assert h.close(60)
    return [x for x in lines if x.startswith("bestmove")][-1].split()[1], h.last_decision.sims


@pytest.mark.parametrize("preset", ["adaptive", pytest.param("gumbel", marks=pytest.mark.slow)])
def test_uci_engine_searches_under_the_preset(model, preset):
    move, sims = _uci_move(Allie(model), preset)
    board = chess.Board()
    board.push_uci("e2e4")
    board.push_uci("e7e5")
    assert chess.Move.from_uci(move) in board.legal_moves
    if preset == "gumbel":
        assert sims == CHEAP["mean_sims"]


@pytest.mark.slow
@pytest.mark.parametrize("white,black", [("search", "adaptive"), ("gumbel", "gumbel-adaptive")])
def test_match_runner_plays_search_presets(model, tmp_path, white, black):
    allie = Allie(model)
    cfg = MatchConfig(
        parse_spec(f"allie:tiny:{white}:1500"),
        parse_spec(f"allie:tiny:{black}:1600"),
        games=2,
        max_plies=8,
        time_control="600+5",
    )
    result = run_match(cfg, output=tmp_path / "m.pgn", allie_loader=lambda _: allie)
    assert len(result.games) == 2 and all(len(g.board.move_stack) == 8 for g in result.games)
    assert allie.search_stats["simulations"] > 0
