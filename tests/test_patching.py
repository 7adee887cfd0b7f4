"""Activation patching on a hand-built case whose answer is known exactly.

Clean and corrupted positions differ in one knight (f3 vs g1), so exactly two square tokens
differ at the embeddings (step 0), where a square token's residual depends on its square alone:
- patching those two squares at step 0 turns the clean run into the corrupted run exactly;
- patching squares that hold the same thing in both changes nothing;
- at the last step the policy reads only the CLS token: patching every square changes nothing,
  patching CLS alone gives the corrupted policy.
The model leaves illegal moves unmasked so the policy is a function of the residual stream only
(the legal sets of the two positions differ).
"""

from __future__ import annotations

import chess
import numpy as np
import pytest
from flax import nnx

from allie_jax.eval.patching import Patcher, num_steps, square_tokens
from allie_jax.model.board_transformer import BoardConfig, BoardTransformer

CLEAN = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
CORRUPT = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 2 3")


@pytest.fixture(scope="module")
def patcher():
    cfg = BoardConfig.named("board_tiny", num_layers=2, refinement=False, mask_illegal=False)
    return Patcher(BoardTransformer(cfg, rngs=nnx.Rngs(5)))


def test_patching_the_differing_squares_at_the_embeddings(patcher):
    res_clean, clean_lp = patcher.residuals(CLEAN)
    res_corrupt, corrupt_lp = patcher.residuals(CORRUPT)
    assert np.abs(clean_lp - corrupt_lp).max() > 1e-4  # the two positions do differ
    diff = np.abs(res_clean[0, 0] - res_corrupt[0, 0]).max(-1)
    assert set(np.flatnonzero(diff > 0)) == {1 + chess.F3, 1 + chess.G1}

    tokens = square_tokens(patcher.model, [chess.F3, chess.G1], True)
    patched = patcher.patched_log_probs(CLEAN, res_corrupt, 0, tokens)
    np.testing.assert_allclose(patched, corrupt_lp, atol=1e-5)

    both = patcher.patch(CLEAN, CORRUPT, 0, [chess.F3, chess.G1])
    assert both.kl > 0
    assert both.patched_prob == pytest.approx(
        float(np.exp(corrupt_lp[clean_lp.argmax()])), rel=1e-4
    )
    same = patcher.patch(CLEAN, CORRUPT, 0, [chess.A1, chess.E4])
    assert same.kl == pytest.approx(0.0, abs=1e-7)
    assert same.patched_move == same.clean_move and same.logit_drop == pytest.approx(0, abs=1e-5)


@pytest.mark.slow  # a few more compiles; run by make test-all
def test_last_step_reads_only_cls(patcher):
    steps = num_steps(patcher.model)
    assert steps == 3  # embeddings + 2 blocks
    res_corrupt, corrupt_lp = patcher.residuals(CORRUPT)
    _, clean_lp = patcher.residuals(CLEAN)
    squares = patcher.patch(CLEAN, CORRUPT, steps - 1, list(range(64)))
    assert squares.kl == pytest.approx(0.0, abs=1e-7)
    cls = patcher.patched_log_probs(CLEAN, res_corrupt, steps - 1, [0])
    np.testing.assert_allclose(cls, corrupt_lp, atol=1e-5)
    # one block earlier the squares do reach CLS
    assert patcher.patch(CLEAN, CORRUPT, steps - 2, list(range(64))).kl > 0
    sweep = patcher.sweep(CLEAN, CORRUPT)
    assert sweep.shape == (steps, 64)
    assert np.all(sweep[-1] == 0) and np.all(np.delete(sweep[0], [chess.F3, chess.G1]) == 0)
    with pytest.raises(ValueError, match="same side to move"):
        patcher.patch(CLEAN, chess.Board(CORRUPT.fen().replace(" w ", " b ")), 0, [0])


def test_square_tokens_follow_the_flip():
    model = BoardTransformer(
        BoardConfig.named("board_tiny", num_layers=1, flip=True, piece_scheme="9_tokens")
    )
    assert list(square_tokens(model, [chess.E2], True)) == [1 + chess.E2, 65 + chess.E2]
    assert list(square_tokens(model, [chess.E2], False)) == [1 + chess.E7, 65 + chess.E7]
    with pytest.raises(ValueError, match="square 64"):
        square_tokens(model, [64], True)
