"""KL-regularised selection at every node (``SearchConfig.selection="kl"``) through the product.

The rule itself is checked against a hand-worked two-level tree and ``ReferenceMCTS`` on hashed
trees in tests/test_search_reference.py; here it runs where a user reaches it: the ``Searcher``
with a real (tiny, random) Allie on real positions, against ``ReferenceMCTS(selection="kl")``
fed by the model's whole-sequence forward (no KV cache, python-chess boards), and the setting
through UCI and ``--system_options``.
"""

from __future__ import annotations

import itertools

import chess
import numpy as np
import pytest
from flax import nnx

from allie_jax import vocab
from allie_jax.game import Game, encode_game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import read_games
from allie_jax.search import SearchConfig, Searcher
from allie_jax.search.reference import (
    FullSequenceEvaluator,
    ReferenceMCTS,
    whole_sequence_forward,
)

SIMS = 14


@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(3))


def _positions(sample_pgn) -> list[Game]:
    games = list(itertools.islice(read_games(sample_pgn), 3))
    return [
        Game(g.moves[:k], g.white_elo, g.black_elo, g.time_control)
        for g, k in zip(games, (9, 22, 35), strict=True)
    ]


def _board(game: Game) -> chess.Board:
    board = chess.Board()
    for m in game.moves:
        board.push_uci(m)
    return board


@pytest.mark.slow  # compiles the decoder's search twice (about a minute on 2 loaded cores)
def test_kl_searcher_builds_the_reference_tree_on_real_positions(tiny_model, sample_pgn):
    """selection="kl" in the Searcher (KV-cached leaves, batched, in jit) visits exactly what the
    plain-Python ReferenceMCTS with the same KL rule visits, leaf by leaf through the model's
    whole-sequence forward; the tree is legal and not the pUCT tree."""
    games = _positions(sample_pgn)
    config = SearchConfig(
        mode="search", mean_sims=SIMS, max_sims=SIMS, selection="kl", anchor_lambda=0.11
    )
    kl = Searcher(tiny_model, config).run(games, 0)
    puct = Searcher(tiny_model, SearchConfig(mode="search", mean_sims=SIMS, max_sims=SIMS)).run(
        games, 0
    )
    forward = whole_sequence_forward(tiny_model)
    for i, game in enumerate(games):
        board = _board(game)
        legal = {vocab.encode_move(m.uci()) for m in board.legal_moves}
        for out in (kl, puct):
            visited = set(np.flatnonzero(out.visit_counts[i]).tolist())
            assert visited <= legal and out.visit_counts[i].sum() == SIMS
            assert out.move_id[i] in legal
        root = encode_game(game, partial=True).tokens.tolist()
        evaluate = FullSequenceEvaluator(forward, root, board.turn == chess.WHITE)
        ref = ReferenceMCTS(evaluate, selection="kl", anchor_lambda=0.11).run(board, SIMS)
        np.testing.assert_array_equal(
            kl.visit_counts[i], ref.visit_counts.astype(np.int32), err_msg=f"position {i}"
        )
        assert kl.search_value[i] == pytest.approx(ref.root_value, abs=1e-4)
    # KL selection spreads visits by π̄ (no exploration bonus): not the pUCT tree
    assert (kl.visit_counts != puct.visit_counts).any()


@pytest.mark.slow  # compiles the decoder's KL search with an anchor (about a minute)
def test_kl_searcher_regularises_the_root_towards_a_separate_anchor(tiny_model, sample_pgn):
    """Prior and anchor apart: a second model's root policy as the anchor (as Allie's prior with
    Maia's anchor) holds the root's KL selection, and the tree is again ReferenceMCTS's with that
    root anchor (deeper nodes keep the searching model's prior)."""
    games = _positions(sample_pgn)
    config = SearchConfig(mode="search", mean_sims=SIMS, max_sims=SIMS, selection="kl")
    other = whole_sequence_forward(
        AllieModel(ModelConfig.named("tiny", dropout=0.0), rngs=nnx.Rngs(11))
    )
    roots = [encode_game(g, partial=True).tokens.tolist() for g in games]
    anchor = np.stack([other(r)[0][: vocab.NUM_MOVES] for r in roots])
    searcher = Searcher(tiny_model, config)
    anchored = searcher.run(games, 0, anchor_logits=anchor)
    plain = searcher.run(games, 0)
    forward = whole_sequence_forward(tiny_model)
    for i, game in enumerate(games):
        board = _board(game)
        evaluate = FullSequenceEvaluator(forward, roots[i], board.turn == chess.WHITE)
        ref = ReferenceMCTS(evaluate, selection="kl", root_anchor=anchor[i]).run(board, SIMS)
        np.testing.assert_array_equal(
            anchored.visit_counts[i], ref.visit_counts.astype(np.int32), err_msg=f"position {i}"
        )
    assert (anchored.visit_counts != plain.visit_counts).any()


def test_selection_setting_is_checked():
    assert SearchConfig().selection == "puct"  # today's trees unless asked
    assert SearchConfig(mode="adaptive", selection="kl").selection == "kl"
    with pytest.raises(ValueError, match=r"selection='kll': expected one of \['puct', 'kl'\]"):
        SearchConfig(selection="kll")
    with pytest.raises(ValueError, match="Gumbel modes select by sequential halving"):
        SearchConfig(mode="gumbel", selection="kl")


def test_selection_through_system_options():
    """``--system_options selection=kl`` reaches the search systems' SearchConfig; a misspelt
    value is one line naming the field, the value and the choices."""
    from allie_jax.eval.systems import search_config

    assert search_config("search", {"selection": "kl"}).selection == "kl"
    assert search_config("adaptive", {"selection": "kl", "lambda": "0.3"}).anchor_lambda == 0.3
    assert search_config("search", {}).selection == "puct"
    with pytest.raises(ValueError) as err:
        search_config("search", {"selection": "kll"})
    assert str(err.value) == "selection='kll': expected one of ['puct', 'kl']"


def test_selection_through_uci():
    """``setoption name Selection value kl`` reaches the search's config (not the Gumbel
    presets'); a misspelt value is one ``info string`` naming it."""
    from tests.test_uci import ScriptedAllie, make_handler, wait_for

    allie = ScriptedAllie()
    h, lines = make_handler(allie)
    h.handle("uci")
    assert any(line.startswith("option name Selection type combo default puct") for line in lines)
    h.handle("setoption name Mode value search")
    h.handle("setoption name Selection value kl")
    h.handle("position startpos moves e2e4")
    h.handle("go nodes 8")
    wait_for(lines, "bestmove")
    assert allie.calls[-1][2] == "search" and allie.calls[-1][3]["selection"] == "kl"
    h.handle("setoption name Selection value kll")
    assert lines[-1] == "info string bad value for Selection: 'kll' is not one of puct, kl"
    calls = len(allie.calls)
    h.handle("setoption name Mode value gumbel")
    h.handle("position startpos moves e2e4 e7e5")
    h.handle("go nodes 8")
    _wait_calls(allie, calls + 1)
    assert allie.calls[-1][2] == "gumbel"
    assert "selection" not in allie.calls[-1][3]  # Gumbel presets select by halving


def _wait_calls(allie, n: int, timeout: float = 30.0) -> None:
    import time

    end = time.monotonic() + timeout
    while len(allie.calls) < n and time.monotonic() < end:
        time.sleep(0.01)
    assert len(allie.calls) >= n


def test_selection_through_launch_match(tmp_path, capsys):
    """``launch.match --system_options`` (launch.evaluate's spelling) reaches Allie's SearchConfig
    in every batched call; a misspelt value or key is one line, before any game starts."""
    from allie_jax.engine.match import MatchConfig, parse_spec, run_match
    from launch.match import main
    from tests.test_uci import ScriptedAllie

    spec = parse_spec("allie:a:search:1500")
    options = (("selection", "kl"), ("lambda", "0.2"), ("lambda_schedule", "paper"))
    cfg = MatchConfig(
        spec, spec, games=1, max_plies=2, time_control="180+2", search_options=options
    )
    allie = ScriptedAllie()
    run_match(cfg, output=tmp_path / "m.pgn", allie_loader=lambda _: allie)
    assert len(allie.calls) == 2
    for _, _, config, _ in allie.calls:
        assert (config.mode, config.selection) == ("search", "kl")
        assert (config.anchor_lambda, config.lambda_schedule) == (0.2, "paper")
    side = "allie:a:search:1500"
    for option, line in (
        ("selection=kll", "selection='kll': expected one of ['puct', 'kl']"),
        ("selction=kl", "--system_options selction='kl': not a SearchConfig field"),
    ):
        argv = ["--white", side, "--black", side, "--system_options", option]
        assert main([*argv, "--output", str(tmp_path / "x.pgn")]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"launch.match: error: {line}"]
    assert not (tmp_path / "x.pgn").exists()
