"""Maia as a UCI engine (``launch.uci --checkpoint maia:DIR:preset``), against python-chess."""

from __future__ import annotations

import sys
import time

import chess
import chess.engine
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.baselines import lc0_moves
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaSet
from allie_jax.engine.uci import UciHandler
from allie_jax.game import Game
from tests.support import maia_support

MAIA_DIR = maia_support.DEFAULT_MAIA_DIR.resolve()

pytestmark = pytest.mark.skipif(
    not (MAIA_DIR / "maia-1100.pb.gz").exists(),
    reason=f"Maia nets not found at {MAIA_DIR} (GPL: never bundled)",
)

MOVES = ["e2e4", "c7c5", "g1f3", "d7d6", "d2d4", "c5d4", "f3d4", "g8f6"]


@pytest.fixture(scope="module")
def engine():
    """One Maia-1500 UCI engine for the module (loading it is most of each test's time)."""
    from allie_jax.baselines.maia_uci import load_maia_uci

    return load_maia_uci(f"maia:{MAIA_DIR}:policy:1500")


def test_predict_top_move_is_maia_argmax(engine):
    games = [Game(moves=MOVES[:n]) for n in (0, 3, 8)]
    preds = engine.predict(games, start_fens=[None] * 3)
    predictor = MaiaSet(str(MAIA_DIR)).predictor(1500)
    for g, pred in zip(games, preds, strict=True):
        board = chess.Board()
        for m in g.moves:
            board.push_uci(m)
        pol, wdl = predictor(GameEncoder(g.moves).encode(len(g.moves))[None])
        legal = list(board.legal_moves)
        logits = [pol[0, lc0_moves.lc0_move_index(board, m)] for m in legal]
        assert max(pred.move_probs, key=pred.move_probs.get) == legal[int(np.argmax(logits))].uci()
        assert set(pred.move_probs) == {m.uci() for m in legal}
        assert sum(pred.move_probs.values()) == pytest.approx(1.0, abs=1e-6)
        sign = 1.0 if board.turn == chess.WHITE else -1.0
        assert pred.value_white == pytest.approx(sign * float(wdl[0, 0] - wdl[0, 2]), abs=1e-5)
        assert pred.think_time_s == 0.0 and pred.resign is False
    # play at temperature 0 agrees with predict's argmax
    d = engine.play(
        games[1:2], "adaptive", 0, start_fens=[None], temperature=1.0, sampling="argmax"
    )
    assert d[0].move == max(preds[1].move_probs, key=preds[1].move_probs.get)
    assert vocab.MOVE_TO_ID[d[0].move] >= 0
    # the greedy preset plays that argmax at any temperature, with the standard start or a FEN
    fen = chess.Board()
    for m in games[1].moves:
        fen.push_uci(m)
    for start in (None, fen.fen()):
        game = games[1] if start is None else Game(moves=[])
        for seed in range(3):
            g = engine.play([game], "greedy", seed, start_fens=[start], temperature=1.0)
            assert g[0].move == d[0].move, (start, seed)


def test_maia_plays_from_a_fen_with_the_history_filled(engine):
    """A FEN start: the planes repeat the position in the 7 missing history steps (lc0's
    FEN_ONLY fill), built here by hand from python-chess, and Maia's move is their argmax."""
    from allie_jax.baselines.lc0_planes import _piece_masks, _unpack

    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    board = chess.Board(fen)
    planes = GameEncoder([], board).encode(0)
    one = _unpack(np.asarray(_piece_masks(board, chess.WHITE), np.uint64))
    for step in range(8):  # every history step is the position itself, from White's view
        np.testing.assert_array_equal(planes[step * 13 : step * 13 + 12], one)
        assert not planes[step * 13 + 12].any()
    pol, _ = MaiaSet(str(MAIA_DIR)).predictor(1500)(planes[None])
    legal = list(board.legal_moves)
    best = legal[int(np.argmax([pol[0, lc0_moves.lc0_move_index(board, m)] for m in legal]))]
    pred = engine.predict([Game(moves=[])], start_fens=[fen])[0]
    assert max(pred.move_probs, key=pred.move_probs.get) == best.uci()
    d = engine.play([Game(moves=[])], "policy", 0, start_fens=[fen], temperature=0.0)[0]
    assert d.move == best.uci() and d.path == "prior" and "FEN" in d.note


def test_fen_move_follows_the_one_move_rule_at_a_temperature(engine):
    """From a FEN at Temperature T, Maia's move is drawn from p^(1/T) (p: Maia's legal softmax,
    recomputed here from the raw network, not from the engine) by ``decision.draw_moves`` with
    the play's key: the reported policy is that distribution and each seed's move is the rule's
    draw from it, so the moves have the rule's distribution."""
    import jax

    from allie_jax.search import decision

    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    board = chess.Board(fen)
    legal = list(board.legal_moves)
    pol, _ = MaiaSet(str(MAIA_DIR)).predictor(1500)(GameEncoder([], board).encode(0)[None])
    logits = np.array([pol[0, lc0_moves.lc0_move_index(board, m)] for m in legal], np.float64)
    ucis = [m.uci() for m in legal]
    game = Game(moves=[])
    for t in (0.5, 2.0):
        w = np.exp((logits - logits.max()) / t)
        expected = dict(zip(ucis, w / w.sum(), strict=True))
        ids = np.array([vocab.MOVE_TO_ID[m] for m in ucis])
        policy = np.zeros((1, vocab.NUM_MOVES), np.float32)
        policy[0, ids] = [expected[m] for m in ucis]
        moves = set()
        for seed in range(6):
            d = engine.play([game], "policy", seed, start_fens=[fen], temperature=t)[0]
            assert d.policy == pytest.approx(expected, abs=1e-5)
            assert d.path == "prior" and "FEN" in d.note
            key = jax.random.fold_in(decision.as_jax_key(seed), 0)  # the play's key for row 0
            drawn = decision.draw_moves(policy, policy > 0, np.zeros(1, bool), key)
            assert d.move == vocab.MOVES[int(drawn[0])], (t, seed)
            moves.add(d.move)
        assert len(moves) > 1  # drawn, not the argmax
    # Temperature 0: the argmax, whatever the seed
    best = ucis[int(np.argmax(logits))]
    for seed in range(3):
        d = engine.play([game], "policy", seed, start_fens=[fen], temperature=0.0)[0]
        assert d.move == best
    # through the UCI handler: its Temperature reaches the rule (the decision's policy is the
    # distribution at T) and the move is one the rule could draw
    lines: list[str] = []
    handler = UciHandler(lambda: engine, lines.append, warmup=False)
    for command in ("uci", "isready", "setoption name Temperature value 2", f"position fen {fen}"):
        handler.handle(command)
    handler.handle("go movetime 60000")
    end = time.monotonic() + 120
    while handler.thinking and time.monotonic() < end:
        time.sleep(0.01)
    w = np.exp((logits - logits.max()) / 2.0)
    assert handler.last_decision is not None
    assert handler.last_decision.policy == pytest.approx(
        dict(zip(ucis, w / w.sum(), strict=True)), abs=1e-5
    )
    best_line = [line for line in lines if line.startswith("bestmove ")]
    assert len(best_line) == 1 and best_line[0].split()[1] in ucis
    assert any(" path prior " in line for line in lines)


def test_uci_plays_legal_moves_and_multipv():
    spec = f"maia:{MAIA_DIR}:policy"
    cmd = [sys.executable, "-m", "launch.uci", "--checkpoint", spec, "--compile-cache", "none"]
    engine = chess.engine.SimpleEngine.popen_uci(cmd, cwd=str(maia_support.REPO), timeout=600)
    try:
        board = chess.Board()
        for _ in range(4):
            result = engine.play(board, chess.engine.Limit(time=20), info=chess.engine.INFO_ALL)
            assert result.move in board.legal_moves
            assert " path prior " in result.info["string"]  # Maia decided, no fallback
            board.push(result.move)
        infos = engine.analyse(board, chess.engine.Limit(time=20), multipv=2)
        assert len(infos) == 2
        assert all(i["pv"][0] in board.legal_moves for i in infos)
        assert infos[0]["pv"][0] != infos[1]["pv"][0]
        # a FEN start: Maia reads the board (history filled) and decides the move itself
        fen_board = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
        result = engine.play(fen_board, chess.engine.Limit(time=20), info=chess.engine.INFO_ALL)
        assert result.move in fen_board.legal_moves
        assert " path prior " in result.info.get("string", "")
    finally:
        engine.quit()


def test_bad_maia_spec_is_one_clear_error(capsys):
    from launch.uci import main

    with pytest.raises(SystemExit):
        main(["--checkpoint", "maia:/no/such/dir:policy"])
    assert "/no/such/dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--checkpoint", f"maia:{MAIA_DIR}:blitz"])
    assert "blitz" in capsys.readouterr().err
