"""``maia:DIR[:preset[:elo]]`` specs and Maia's moves as a player."""

from __future__ import annotations

import chess
import jax
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.baselines.maia_player import MaiaPlayer, MaiaSpec, parse_maia_spec
from allie_jax.game import Game
from tests.support.maia_support import maia_dir


def test_parse_specs():
    assert parse_maia_spec("maia:/m") == MaiaSpec("/m", "policy", None)
    assert parse_maia_spec("maia:/m:search") == MaiaSpec("/m", "search", None)
    assert parse_maia_spec("maia:/m:gumbel:1900") == MaiaSpec("/m", "gumbel", 1900)
    assert parse_maia_spec("maia:/m::1300") == MaiaSpec("/m", "policy", 1300)
    assert parse_maia_spec("maia:/m:policy:auto").elo is None
    for bad, why in [
        ("maia:", "expected"),
        ("maia:/m:mcts", "preset"),
        ("maia:/m:search:high", "not a number"),
        ("uci:/m", "expected"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_maia_spec(bad)


def test_policy_player_moves_and_maia_star():
    d = str(maia_dir())
    player = MaiaPlayer(MaiaSpec(d, "policy", 1100))
    # maia-1100 at the start: e2e4 0.6606 (lc0's exact softmax over legal moves)
    (dec,) = player.play([Game([], 1100, 1100)], jax.random.key(0))
    assert dec.move == "e2e4" and dec.policy["e2e4"] == pytest.approx(0.6606, abs=1e-3)
    assert dec.note == "maia-1100"
    star = MaiaPlayer(MaiaSpec(d, "policy", None))
    assert star.rating_for(Game(["e2e4"], 1200, 1870)) == 1200  # Black's opponent is White (1200)
    assert star.rating_for(Game([], 1200, 1870)) == 1900
    with pytest.raises(ValueError, match="over"):
        player.play([Game(["f2f3", "e7e5", "g2g4", "d8h4"], 1100, 1100)], jax.random.key(0))


def test_anchor_logits_for_allie_search():
    from allie_jax.baselines.maia import MaiaSet
    from allie_jax.baselines.maia_player import maia_anchor_logits

    maia = MaiaSet(maia_dir())
    games = [Game([], 1100, 1100), Game(["e2e4"], 1900, 1150)]
    logits = maia_anchor_logits(maia, games)
    assert logits.shape == (2, 1968)
    assert (logits[0] > -1e8).sum() == 20 and (logits[1] > -1e8).sum() == 20
    p = np.exp(logits[0] - logits[0].max())
    p /= p.sum()
    assert p[vocab.MOVE_TO_ID["e2e4"]] == pytest.approx(0.6606, abs=1e-3)  # maia-1100 (mover 1100)


def test_match_between_two_maia_networks(tmp_path):
    from allie_jax.engine.match import MatchConfig, parse_spec, run_match

    d = str(maia_dir())
    white, black = parse_spec(f"maia:{d}:policy:1100"), parse_spec(f"maia:{d}:policy:1900")
    assert (white.kind, white.elo, black.elo) == ("maia", 1100, 1900)
    cfg = MatchConfig(white=white, black=black, games=2, max_plies=12, time_control="180+2")
    result = run_match(cfg, output=tmp_path / "m.pgn")
    text = (tmp_path / "m.pgn").read_text()
    assert text.count("[Event") == 2 and "maia-1100-policy" in text and "maia-1900-policy" in text
    assert all(len(g.board.move_stack) >= 12 or g.result != "*" for g in result.games)
    # Maia plays the argmax: the first game's opening is maia-1100's top move, e2e4
    assert result.games[0].board.move_stack[0].uci() == "e2e4"


@pytest.mark.slow  # compiles Maia's search twice (pUCT and Gumbel)
def test_every_preset_through_the_one_search_and_move_rule():
    """policy / greedy / search / gumbel: one Searcher, one move rule. Greedy is the argmax of
    Maia's policy from the host encoder (an independent path); the searches run their budget and
    never play a move they did not visit."""
    from allie_jax.baselines.eval_systems import vocab_policy
    from allie_jax.baselines.lc0_planes import GameEncoder
    from allie_jax.baselines.maia import MaiaSet

    d = str(maia_dir())
    games = [Game("e2e4 e7e5 g1f3".split(), 1500, 1500), Game("d2d4 d7d5 c2c4".split(), 1500, 1500)]
    predictor = MaiaSet(d).predictor(1500)
    for preset in ("policy", "greedy", "search", "gumbel"):
        player = MaiaPlayer(MaiaSpec(d, preset, 1500), num_simulations=6, temperature=1.0)
        decisions = player.play(games, jax.random.key(3))
        for game, dec in zip(games, decisions, strict=True):
            enc = GameEncoder(game.moves)
            pol, _ = predictor(enc.encode(len(game.moves))[None])
            board = chess.Board()
            for m in game.moves:
                board.push_uci(m)
            ids = np.array([vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves])
            probs = vocab_policy(
                pol[0], len(game.moves) % 2 == 1, enc.king_home[len(game.moves)], ids
            )
            assert chess.Move.from_uci(dec.move) in board.legal_moves
            assert sum(dec.policy.values()) == pytest.approx(1.0, abs=1e-3)
            assert not dec.resigned and dec.note == "maia-1500"
            if preset == "greedy":
                assert dec.move == vocab.MOVES[int(np.argmax(probs))] and dec.sims == 0
            elif preset == "policy":
                assert dec.sims == 0 and dec.path == "prior"
                top = vocab.MOVES[int(np.argmax(probs))]
                assert dec.policy[top] == pytest.approx(probs.max(), abs=1e-3)
            else:
                assert dec.sims == 6 and dec.path == "search"
                assert dec.visits.get(dec.move, 0) > 0  # π̄ / Gumbel never play an unvisited move
