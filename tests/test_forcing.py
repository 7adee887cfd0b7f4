"""Forcing positions: the selection rule (scripted engine answers) and real Stockfish on a known
mate, the candidate rule on a real checkmate game, and the set's file round trip."""

from __future__ import annotations

import chess
import chess.engine
import pytest

from allie_jax.eval import forcing
from allie_jax.game import Game
from tests.support.stockfish_support import require_stockfish


class _Scripted:
    def __init__(self, infos):
        self.infos = infos

    def analyse(self, board, limit, multipv):
        assert multipv == 2
        return self.infos


def _info(mate=None, cp=None, move="h1h8"):
    score = chess.engine.Mate(mate) if mate is not None else chess.engine.Cp(cp)
    return {"score": chess.engine.PovScore(score, chess.WHITE), "pv": [chess.Move.from_uci(move)]}


def test_classify_rule():
    cfg = forcing.ForcingConfig()
    board = chess.Board()
    assert forcing.classify(_Scripted([_info(3), _info(cp=50)]), board, cfg) == ("h1h8", 3)
    assert forcing.classify(_Scripted([_info(1), _info(cp=50)]), board, cfg) is None  # too short
    assert forcing.classify(_Scripted([_info(5), _info(cp=50)]), board, cfg) is None  # too long
    assert forcing.classify(_Scripted([_info(2), _info(4)]), board, cfg) is None  # not unique
    assert forcing.classify(_Scripted([_info(2), _info(6)]), board, cfg) == ("h1h8", 2)
    assert forcing.classify(_Scripted([_info(2), _info(-3)]), board, cfg) == ("h1h8", 2)
    assert forcing.classify(_Scripted([_info(cp=900)]), board, cfg) is None
    assert forcing.classify(_Scripted([_info(2)]), board, cfg) == ("h1h8", 2)  # one legal move


def test_stockfish_finds_a_known_mate():
    path = require_stockfish()
    cfg = forcing.ForcingConfig(stockfish=path, nodes=50_000, min_mate=1, max_mate=1)
    engine = chess.engine.SimpleEngine.popen_uci(path)
    try:
        board = chess.Board("k7/8/1K6/8/8/8/8/7R w - - 0 1")  # Rh8# is the only mate in 1
        assert forcing.classify(engine, board, cfg) == ("h1h8", 1)
        cfg2 = forcing.ForcingConfig(stockfish=path, nodes=50_000)  # mates in 2..4 only
        assert forcing.classify(engine, board, cfg2) is None
    finally:
        engine.quit()


def test_candidates_are_near_the_end_of_mated_games():
    mate = Game(moves="f2f3 e7e5 g2g4 d8h4".split(), termination="Normal")  # fool's mate
    timeout = Game(moves="f2f3 e7e5 g2g4".split(), termination="Time forfeit")
    plies = [p for _, p in forcing.candidates([mate, timeout], forcing.ForcingConfig())]
    assert plies == [1]  # 7 and 5 plies before the end do not exist; 3 before: Black to move
    cfg = forcing.ForcingConfig(skip_games=1)
    assert list(forcing.candidates([mate], cfg)) == []


def test_positions_round_trip(tmp_path):
    pos = forcing.ForcingPosition(
        "g1", 4, ("e2e4", "e7e5"), chess.STARTING_FEN, "d1h5", 2, 1500, None
    )
    forcing.write_positions(tmp_path / "f.jsonl", [pos, pos])
    assert forcing.read_positions(tmp_path / "f.jsonl") == [pos, pos]
    (tmp_path / "bad.jsonl").write_text('{"game_id": 1}\n')
    with pytest.raises(ValueError, match="line 1"):
        forcing.read_positions(tmp_path / "bad.jsonl")
    assert forcing.wilson(0, 0)[0] != forcing.wilson(0, 0)[0]  # NaN
    lo, hi = forcing.wilson(5, 10)
    assert 0.2 < lo < 0.5 < hi < 0.8
