"""Matches: specs, batching, clocks, resignation, PGN output; and a game against Stockfish."""

from __future__ import annotations

import chess
import chess.pgn
import pytest
from flax import nnx

from allie_jax.engine import Allie
from allie_jax.engine.match import MatchConfig, parse_spec, run_match
from allie_jax.model import AllieModel, ModelConfig
from tests.support.stockfish_support import require_stockfish
from tests.test_uci import ScriptedAllie


def read_pgn(path) -> list[chess.pgn.Game]:
    games = []
    with open(path) as f:
        while (g := chess.pgn.read_game(f)) is not None:
            games.append(g)
    return games


def assert_legal_replay(game: chess.pgn.Game) -> int:
    """Replays the PGN with python-chess (read_game records errors on illegal moves)."""
    assert not game.errors, game.errors
    board = game.board()
    n = 0
    for node in game.mainline():
        assert node.move in board.legal_moves
        assert node.clock() is not None and node.clock() >= 0
        board.push(node.move)
        n += 1
    return n


def test_parse_spec():
    a = parse_spec("allie:/ckpt/dir:adaptive:1500")
    assert (a.kind, a.checkpoint, a.preset, a.elo) == ("allie", "/ckpt/dir", "adaptive", 1500)
    assert parse_spec("allie:/c:policy:auto").elo is None
    u = parse_spec("uci:/usr/games/stockfish:UCI_LimitStrength=true,UCI_Elo=1350")
    assert u.kind == "uci" and u.command == "/usr/games/stockfish" and u.elo == 1350
    assert dict(u.options) == {"UCI_LimitStrength": "true", "UCI_Elo": "1350"}
    assert u.name == "stockfish-1350"
    for bad in ["allie:/c:blitz:1500", "allie:/c:policy:abc", "allie:/c:policy:99", "uci:", "x:y",
                "uci:sf:Threads"]:  # fmt: skip
        with pytest.raises(ValueError):
            parse_spec(bad)


@pytest.fixture(scope="module")
def tiny_allie() -> Allie:
    return Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))


def test_self_play_batches_and_writes_pgn(tmp_path, tiny_allie, monkeypatch):
    from allie_jax.search import searcher as searcher_lib

    widths = set()  # the cache widths the games' positions were replayed at
    replay = searcher_lib._replay
    monkeypatch.setattr(
        searcher_lib,
        "_replay",
        lambda move_ids, *a, **k: widths.add(move_ids.shape[1]) or replay(move_ids, *a, **k),
    )
    spec = parse_spec("allie:tiny:policy:1500")
    cfg = MatchConfig(
        spec, spec, games=4, concurrency=4, max_plies=30, time_control="180+2", fixed_shapes=True
    )
    out = tmp_path / "games.pgn"
    result = run_match(cfg, output=out, allie_loader=lambda _: tiny_allie)
    # the engine's closed set of shapes: games growing to 33 tokens never change the search's
    # shapes (with shapes following each batch they crossed 8, 16 and 32, each a compile)
    assert tiny_allie.fixed_shapes and widths == {128}
    games = read_pgn(out)
    assert len(games) == 4 == len(result.games)
    plies = [assert_legal_replay(g) for g in games]
    assert sum(plies) == result.plies
    # all concurrent games share one batched call per step: calls == the longest game's plies
    assert result.allie_calls == max(plies)
    for g in games:
        assert g.headers["TimeControl"] == "180+2" and g.headers["WhiteElo"] == "1500"
        assert g.headers["Result"] in ("1-0", "0-1", "1/2-1/2")


def test_adaptive_presets_fix_the_shapes_by_default():
    from allie_jax.engine.match import _fixes_shapes

    def cfg(white, black, **kw):
        return MatchConfig(parse_spec(white), parse_spec(black), **kw)

    adaptive, search = "allie:a:adaptive:1500", "allie:a:search:1500"
    other = "allie:b:search:1500"
    assert _fixes_shapes(cfg(adaptive, search), parse_spec(search))  # one Allie for both
    assert not _fixes_shapes(cfg(adaptive, other), parse_spec(other))
    assert not _fixes_shapes(cfg(search, search), parse_spec(search))
    assert _fixes_shapes(cfg(search, search, fixed_shapes=True), parse_spec(search))
    assert not _fixes_shapes(cfg(adaptive, adaptive, fixed_shapes=False), parse_spec(adaptive))


def test_colours_alternate_time_forfeit_and_resignation(tmp_path):
    slow = parse_spec("allie:slow:policy:1500")
    quick = parse_spec("allie:quick:policy:1500")
    players = {"slow": ScriptedAllie(think_time_s=50.0), "quick": ScriptedAllie(think_time_s=0.5)}
    cfg = MatchConfig(slow, quick, games=2, time_control="60+0", raw_think_times=True)
    result = run_match(cfg, output=tmp_path / "t.pgn", allie_loader=players.__getitem__)
    g0, g1 = result.games
    assert (g0.white.name, g1.white.name) == (slow.name, quick.name)  # --alternate
    # 60 s and 50 s per move: the slow side flags on its second move, whatever its colour
    assert g0.termination == g1.termination == "time forfeit"
    assert result.score(quick.name)[0] == 2.0
    resigner = {"slow": ScriptedAllie(resign=True), "quick": ScriptedAllie()}
    cfg = MatchConfig(slow, quick, games=1, time_control="60+0")
    result = run_match(cfg, output=tmp_path / "r.pgn", allie_loader=resigner.__getitem__)
    (g,) = result.games
    assert g.termination == "resignation" and g.result == "0-1"
    assert len(g.board.move_stack) == 2  # resignation only counts from the second move on


def test_game_against_stockfish_through_launch_match(tmp_path, capsys):
    sf = require_stockfish()
    from allie_jax.model.checkpoint import save_model
    from launch.match import main

    ckpt = tmp_path / "tiny"
    save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), ckpt)
    out = tmp_path / "sf.pgn"
    rc = main([
        "--white", f"allie:{ckpt}:policy:1500",
        "--black", f"uci:{sf}:UCI_LimitStrength=true,UCI_Elo=1350",
        "--games", "2", "--tc", "180+2", "--output", str(out), "--uci-movetime", "0.01",
        "--max-plies", "120",
    ])  # fmt: skip
    assert rc == 0
    games = read_pgn(out)
    assert len(games) == 2
    for g in games:
        assert assert_legal_replay(g) > 0
        assert "stockfish-1350" in (g.headers["White"], g.headers["Black"])
    text = capsys.readouterr().out
    assert "SCE mean" in text and "allie-tiny-policy-1500" in text  # the calibration table
    # games are written as they finish; every round is there once
    assert sorted(g.headers["Round"] for g in games) == ["1", "2"]


class _LambdaAllie(ScriptedAllie):
    """Scripted moves that report an effective λ (as a searched Decision does)."""

    def play(self, games, preset, rng, **kw):
        import dataclasses

        return [
            dataclasses.replace(d, sims=8, effective_lambda=0.01 + 1e-3 * len(g.moves))
            for d, g in zip(super().play(games, preset, rng, **kw), games, strict=True)
        ]


def test_pgn_comments_carry_each_searched_moves_lambda(tmp_path):
    lam, plain = parse_spec("allie:lam:search:1500"), parse_spec("allie:plain:policy:1500")
    players = {"lam": _LambdaAllie(), "plain": ScriptedAllie()}
    cfg = MatchConfig(lam, plain, games=1, max_plies=6, time_control="180+2")
    run_match(cfg, output=tmp_path / "l.pgn", allie_loader=players.__getitem__)
    (game,) = read_pgn(tmp_path / "l.pgn")
    nodes = list(game.mainline())
    assert len(nodes) == 6
    for ply, node in enumerate(nodes):
        assert node.clock() is not None  # the clock comment survives beside it
        if ply % 2 == 0:  # the λ side (White): its λ for the position it moved in
            assert f"[%lambda {0.01 + 1e-3 * ply:.6g}]" in node.comment
        else:
            assert "%lambda" not in node.comment
