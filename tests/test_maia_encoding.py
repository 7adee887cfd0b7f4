"""lc0 inputs and move labels against python-chess (an independent reference), and, when the parity
extra is installed, plane-for-plane against lc0's own encoder."""

from __future__ import annotations

import chess
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.baselines import lc0_moves
from allie_jax.baselines.lc0_planes import AUX, GameEncoder
from allie_jax.pgn import read_games
from tests.conftest import SAMPLE_PGN
from tests.support.maia_support import lczero_backends, maia_dir


def _has_repetition(moves) -> bool:
    board, seen = chess.Board(), set()
    for uci in moves:
        seen.add(board._transposition_key())
        board.push_uci(uci)
        if board._transposition_key() in seen:
            return True
    return False


def _games(n: int, *, repetitions: int = 0):
    """``n`` real games of 20+ moves, the first ``repetitions`` of them with a repeated position."""
    games, reps = [], []
    for g in read_games(SAMPLE_PGN):
        if len(g.moves) < 20:
            continue
        if len(reps) < repetitions and _has_repetition(g.moves):
            reps.append(g.moves)
        elif len(games) < n - repetitions:
            games.append(g.moves)
        if len(games) + len(reps) == n:
            break
    return reps + games


def test_policy_index_order():
    moves = lc0_moves.lc0_moves()
    assert len(moves) == 1858 and len(set(moves)) == 1858
    # spot checks written out by hand from the rules in the module docstring
    assert moves[:8] == ("a1b1", "a1c1", "a1d1", "a1e1", "a1f1", "a1g1", "a1h1", "a1a2")
    assert moves[1791] == "h8g8"
    assert moves[1792:1798] == ("a7a8q", "a7a8r", "a7a8b", "a7b8q", "a7b8r", "a7b8b")
    assert moves[-1] == "h7h8b"
    assert lc0_moves.lc0_index()["e1h1"] < lc0_moves.lc0_index()["e2e4"]


def test_conv_policy_map_is_a_bijection_with_known_cells():
    table = lc0_moves.conv_policy_map()
    idx = lc0_moves.lc0_index()
    assert (table >= 0).sum() == 1858
    e2 = chess.E2
    assert table[0 * 64 + e2] == idx["e2e3"]  # plane 0: north, distance 1
    assert table[1 * 64 + e2] == idx["e2e4"]  # north, distance 2
    assert table[56 * 64 + chess.G1] == idx["g1h3"]  # first knight plane: (+1 file, +2 ranks)
    assert table[(64 + 3 * 1 + 2) * 64 + chess.A7] == idx["a7a8q"]  # promotion N, queen
    assert table[(64 + 0) * 64 + chess.B7] == idx["b7a8r"]  # promotion NW, rook
    assert (table[73 * 64 :] == -1).all()


def test_labels_by_hand():
    b = chess.Board()
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("e2e4")) == "e2e4"
    b.push_uci("e2e4")
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("e7e5")) == "e2e4"  # Black mirrored
    b = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1")
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("e8g8")) == "e1h1"
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("e8c8")) == "e1a1"
    b = chess.Board("8/1P6/8/8/8/8/k6p/4K3 w - - 0 1")
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("b7b8n")) == "b7b8"
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("b7a8q")) == "b7a8q"
    b.turn = chess.BLACK
    assert lc0_moves.lc0_label(b, chess.Move.from_uci("h2h1r")) == "h7h8r"


def _every_position(games):
    for moves in games:
        board = chess.Board()
        for ply, uci in enumerate(moves):
            yield moves, ply, board
            board.push_uci(uci)


def test_vocab_table_matches_the_per_move_rule_on_real_games():
    table = lc0_moves.vocab_to_lc0()
    checked = castles = 0
    for _, _, board in _every_position(_games(60)):
        king = board.king(board.turn)
        home = int(king == (chess.E1 if board.turn == chess.WHITE else chess.E8))
        for move in board.legal_moves:
            vid = vocab.MOVE_TO_ID[move.uci()]
            assert table[int(board.turn == chess.BLACK), home, vid] == lc0_moves.lc0_move_index(
                board, move
            )
            checked += 1
            castles += board.is_castling(move)
    assert checked > 10_000 and castles > 20


def test_vocab_logits_gather():
    board = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1")
    logits = np.arange(1858, dtype=np.float32)[None]
    legal = np.zeros((1, vocab.NUM_MOVES), bool)
    for m in board.legal_moves:
        legal[0, vocab.MOVE_TO_ID[m.uci()]] = True
    out = lc0_moves.lc0_to_vocab_logits(logits, np.array([1]), np.array([1]), legal)
    assert out[0, vocab.MOVE_TO_ID["e8g8"]] == lc0_moves.lc0_index()["e1h1"]
    assert np.isneginf(out[0, vocab.MOVE_TO_ID["e2e4"]])
    assert np.isfinite(out[0]).sum() == board.legal_moves.count()


def _reference_planes(moves, ply):
    """The 112 planes rebuilt independently with python-chess's board API (square by square)."""
    board = chess.Board()
    boards, keys = [board.copy()], [board._transposition_key()]
    for uci in moves[:ply]:
        board.push_uci(uci)
        boards.append(board.copy())
        keys.append(board._transposition_key())
    us = board.turn
    planes = np.zeros((112, 8, 8), np.float32)
    for step in range(8):
        i = ply - step
        if i < 0:
            break
        b = boards[i]
        for sq, piece in b.piece_map().items():
            rank, file = divmod(sq, 8)
            if us == chess.BLACK:
                rank = 7 - rank
            offset = (0 if piece.color == us else 6) + piece.piece_type - 1
            planes[step * 13 + offset, rank, file] = 1
        if keys[i] in keys[:i]:
            planes[step * 13 + 12] = 1
    flags = [
        board.has_queenside_castling_rights(us),
        board.has_kingside_castling_rights(us),
        board.has_queenside_castling_rights(not us),
        board.has_kingside_castling_rights(not us),
        us == chess.BLACK,
    ]
    for j, flag in enumerate(flags):
        planes[AUX + j] = float(flag)
    planes[AUX + 5] = board.halfmove_clock
    planes[AUX + 7] = 1
    return planes


def test_planes_against_python_chess():
    repeated = 0
    for moves in _games(8, repetitions=3):
        enc = GameEncoder(moves)
        got = enc.encode_many(range(len(moves) + 1))
        for ply in range(len(moves) + 1):
            np.testing.assert_array_equal(
                got[ply], _reference_planes(moves, ply), err_msg=f"ply {ply}"
            )
            repeated += got[ply, 12].any()
    assert repeated > 0


def test_illegal_history_is_one_clear_error():
    with pytest.raises(ValueError, match="illegal move e2e5 at ply 0"):
        GameEncoder(["e2e5"])


def test_planes_and_move_indices_against_lc0():
    lb = lczero_backends()
    weights = lb.Weights(str(maia_dir() / "maia-1100.pb.gz"))
    backend = lb.Backend(weights=weights, backend="eigen")
    n = 0
    for moves in _games(6, repetitions=2):
        enc = GameEncoder(moves)
        board = chess.Board()
        for ply in range(len(moves) + 1):
            state = lb.GameState(moves=moves[:ply])
            inp = state.as_input(backend)
            ref = (
                np.array(
                    [[(inp.mask(p) >> s) & 1 for s in range(64)] for p in range(112)], np.float32
                )
                * np.array([inp.val(p) for p in range(112)], np.float32)[:, None]
            )
            np.testing.assert_array_equal(
                enc.encode(ply).reshape(112, 64), ref, err_msg=f"ply {ply}"
            )
            if ply < len(moves):
                ours = sorted(lc0_moves.lc0_move_index(board, m) for m in board.legal_moves)
                assert ours == sorted(state.policy_indices())
                board.push_uci(moves[ply])
            n += 1
    assert n > 300
