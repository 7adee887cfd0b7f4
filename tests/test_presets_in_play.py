"""Every search preset as a user plays it: through ``Allie.play``, the UCI engine and
``launch.match``'s runner, with a real (random-init tiny) model. Cheap settings (few
simulations); the point is that each path reaches the search with the preset's settings."""

from __future__ import annotations

import itertools
import time

import chess
import jax
import numpy as np
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


def _uci_move(allie: Allie, preset: str, *options: str) -> tuple[str, UciHandler, list[str]]:
    lines: list[str] = []
    h = UciHandler(lambda: allie, lines.append, warmup=False)
    for cmd in (
        f"setoption name Mode value {preset}",
        f"setoption name MeanSims value {CHEAP['mean_sims']}",
        f"setoption name MaxSims value {CHEAP['max_sims']}",
        *(f"setoption name {opt}" for opt in options),
        "position startpos moves e2e4 e7e5",
        # a long clock: the search compiles on this move (no warm-up) inside its limit
        "go wtime 60000000 btime 60000000",
    ):
        h.handle(cmd)
    end = time.monotonic() + 600
    while not any(x.startswith("bestmove") for x in lines):
        assert time.monotonic() < end, lines[-5:]
        time.sleep(0.01)
    assert h.close(60)
    return [x for x in lines if x.startswith("bestmove")][-1].split()[1], h, lines


def _reported_lambda(lines: list[str]) -> float | None:
    """The ``lambda L`` of the move's summary ``info string`` (None when absent)."""
    (summary,) = [x for x in lines if x.startswith("info string move ") and " path " in x]
    words = summary.split()
    return float(words[words.index("lambda") + 1]) if "lambda" in words else None


@pytest.mark.parametrize("preset", ["adaptive", pytest.param("gumbel", marks=pytest.mark.slow)])
def test_uci_engine_searches_under_the_preset(model, preset):
    move, h, lines = _uci_move(Allie(model), preset)
    board = chess.Board()
    board.push_uci("e2e4")
    board.push_uci("e7e5")
    assert chess.Move.from_uci(move) in board.legal_moves
    if preset == "gumbel":
        assert h.last_decision.sims == CHEAP["mean_sims"]
    # the effective KL weight of the played policy reaches the user
    lam = _reported_lambda(lines)
    assert lam is not None and lam > 0
    assert lam == pytest.approx(h.last_decision.effective_lambda, rel=1e-5)


def test_uci_gumbel_c_scale_is_the_knob_and_lambda_is_reported(model):
    """``GumbelCScale`` reaches the search, and the ``lambda`` the engine reports is the one the
    search computed for the move it played: the same game through ``Allie.play`` with
    ``gumbel_c_scale`` set gives the same move and λ (the UCI engine's first go draws with
    rng = Seed · 1000003 + 1)."""
    allie = Allie(model)
    move, h, lines = _uci_move(allie, "gumbel", "GumbelCScale value 0.25")
    lam = _reported_lambda(lines)
    assert lam is not None and np.isfinite(lam) and lam > 0
    game = Game(["e2e4", "e7e5"], 1500, 1500, h._tc, game_id="reference")
    ref = Allie(model).play(
        [game],
        "gumbel",
        1,
        temperature=1.0,
        gumbel_c_scale=0.25,
        should_stop=lambda: False,  # chunked, as under the UCI clock: the same programs
        **CHEAP,
    )[0]
    assert (move, h.last_decision.sims) == (ref.move, ref.sims)
    assert lam == pytest.approx(ref.effective_lambda, rel=1e-5)
    # bad values are refused with a message naming the option, and the knob keeps its value
    bad: list[str] = []
    h2 = UciHandler(lambda: allie, bad.append, warmup=False)
    for value in ("0", "-1", "nan", "x"):
        h2.handle(f"setoption name GumbelCScale value {value}")
    assert len(bad) == 4 and all("bad value for GumbelCScale" in x for x in bad)
    assert h2.options.gumbel_c_scale == 0.1


def test_policy_move_reports_no_lambda(model):
    _, h, lines = _uci_move(Allie(model), "policy")
    assert _reported_lambda(lines) is None and np.isnan(h.last_decision.effective_lambda)


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
    # every searched move's PGN comment carries its effective λ
    import chess.pgn

    with open(tmp_path / "m.pgn") as f:
        game = chess.pgn.read_game(f)
    comments = [node.comment for node in game.mainline()]
    assert len(comments) == 8 and all("[%clk " in c for c in comments)
    assert all("[%lambda " in c for c in comments[0::2])  # fixed budgets: every move searched
