"""Maia as evaluation systems: the registry resolves the names, the raw policy agrees with the
network read directly, and Maia* picks the network nearest each mover's rating."""

from __future__ import annotations

import chess
import numpy as np
import pytest

from allie_jax.baselines import eval_systems, lc0_moves
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaPredictor, load_maia, nearest_rating
from allie_jax.eval.positions import game_positions
from allie_jax.eval.systems import Positions, SystemContext, make_systems, resolve
from allie_jax.pgn import read_games
from tests.conftest import SAMPLE_PGN
from tests.support.maia_support import maia_dir


def test_names_and_nearest_rating():
    assert eval_systems.parse_name("maia") == (None, None)
    assert eval_systems.parse_name("maia-1500+gumbel") == (1500, "gumbel")
    assert eval_systems.parse_name("maia+search") == (None, "pibar")
    with pytest.raises(ValueError, match="unknown suffix"):
        eval_systems.parse_name("maia+mcts")
    assert resolve("maia-1900+search") is eval_systems.make_maia
    assert [nearest_rating(r) for r in (600, 1149, 1150, 1151, 1549, 2500)] == [
        1100,
        1100,
        1100,
        1200,
        1500,
        1900,
    ]
    with pytest.raises(ValueError, match="--maia_dir"):
        make_systems(["maia"], SystemContext(options={}))


def _positions(n_games: int) -> Positions:
    """Real games whose two players fall to different Maia networks."""
    games = [
        g
        for g in read_games(SAMPLE_PGN)
        if len(g.moves) >= 30
        and g.white_elo
        and g.black_elo
        and nearest_rating(g.white_elo) != nearest_rating(g.black_elo)
    ][:n_games]
    gps = [game_positions(g) for g in games]
    game = np.concatenate([np.full(len(g.moves), i) for i, g in enumerate(games)])
    ply = np.concatenate([np.arange(len(g.moves)) for g in games])
    return Positions(games, gps, game, ply)


def test_raw_policy_matches_the_network_and_maia_star_switches_nets(monkeypatch):
    monkeypatch.setenv("MAIA_DIR", str(maia_dir()))
    positions = _positions(1)
    fixed, star = make_systems(["maia-1500", "maia"], SystemContext(options={}))
    scores = fixed.score(positions)
    # reference: the network's raw logits over python-chess's legal moves, argmax by lc0 index
    pred = MaiaPredictor(load_maia(maia_dir() / "maia-1500.pb.gz"))
    for g, game in enumerate(positions.games):
        enc = GameEncoder(game.moves)
        pol, wdl = pred(enc.encode_many(range(len(game.moves))))
        board = chess.Board()
        for i, uci in enumerate(game.moves):
            p = int(np.flatnonzero((positions.game == g) & (positions.ply == i))[0])
            legal = list(board.legal_moves)
            best = max(legal, key=lambda m: pol[i, lc0_moves.lc0_move_index(board, m)])
            assert scores.top1[p] == positions.gps[g].legal_ids[i][legal.index(best)]
            v = wdl[i, 0] - wdl[i, 2]
            assert scores.value[p] == pytest.approx(
                v if board.turn == chess.WHITE else -v, abs=1e-5
            )
            board.push_uci(uci)
    assert (
        np.isfinite(scores.p_human).all()
        and (scores.top_probs[:, 0] >= scores.top_probs[:, 1]).all()
    )
    # Maia*: each row equals the fixed network nearest its mover's rating
    star_scores = star.score(positions)
    by_rating = {}
    for p in range(len(positions)):
        game = positions.games[int(positions.game[p])]
        r = nearest_rating(eval_systems.mover_rating(game, int(positions.ply[p])))
        by_rating.setdefault(r, []).append(p)
    assert len(by_rating) >= 2
    for r, rows in by_rating.items():
        (sys_r,) = make_systems([f"maia-{r}"], SystemContext(options={"maia_dir": str(maia_dir())}))
        want = sys_r.score(positions)
        np.testing.assert_array_equal(star_scores.top1[rows], want.top1[rows])
