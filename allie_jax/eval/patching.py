"""Activation patching on the board-state transformer (seed 001's "implicit search" question).

Following "Evidence of Learned Look-Ahead in a Chess-Playing Neural Network" (Jenner et al.),
run the model on a *clean* position, but at one residual-stream step replace the activations
of chosen square tokens with those the same model computed on a *corrupted* position (usually
the clean one with one piece moved or removed); the rest of the forward pass proceeds normally.
If the policy moves a lot, those squares carried information the output depends on at that
depth. ``patching_sweep`` does every square × every step, the seed's planned experiment (e.g.
compare the target squares of the 1st, 2nd and 3rd moves of a forcing line).

Step ``s`` is the input of the ``s``-th block run (0: the embeddings; the last step is the
last block's output), as ``BoardTransformer.encode`` counts them. Patching acts on pass 1 and the
effect is measured on the pass-1 policy (the refinement pass is not run).

Squares are absolute (a1 = 0 .. h8 = 63); for a colour-relative (``flip``) model with Black to
move the token of square ``sq`` is that of ``sq ^ 56``, which ``square_tokens`` handles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import chess
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import vocab
from allie_jax.data import board_features
from allie_jax.model.board_transformer import BoardTransformer


@dataclasses.dataclass(frozen=True)
class PatchEffect:
    """How the clean policy moved when the squares were patched at ``step``."""

    step: int
    squares: tuple[int, ...]
    clean_move: str  # the clean run's most probable move
    clean_prob: float  # its probability in the clean run
    patched_prob: float  # its probability in the patched run
    patched_move: str  # the patched run's most probable move
    kl: float  # KL(clean || patched) over the 1,968 moves, nats

    @property
    def logit_drop(self) -> float:
        """log p_clean(move) − log p_patched(move): how much the clean move lost."""
        return float(np.log(self.clean_prob) - np.log(max(self.patched_prob, 1e-30)))


def _inputs(board: chess.Board) -> dict[str, jax.Array]:
    batch = board_features.board_inputs([board])
    return {k: jnp.asarray(batch[k]) for k in board_features.INPUT_FIELDS}


def num_steps(model: BoardTransformer) -> int:
    """Residual steps that can be patched: embeddings + one per block run."""
    return len(model.block_order()) + 1


def square_tokens(
    model: BoardTransformer, squares: Sequence[int], white_to_move: bool
) -> np.ndarray:
    """Token indices holding the given absolute squares (both tokens under ``9_tokens``)."""
    cfg = model.config
    out = []
    for sq in squares:
        if not 0 <= sq < 64:
            raise ValueError(f"square {sq} is not in 0..63")
        s = sq ^ 56 if (cfg.flip and not white_to_move) else sq
        out.append(1 + s)
        if cfg.piece_scheme == "9_tokens":
            out.append(1 + 64 + s)
    return np.asarray(out, np.int32)


class Patcher:
    """Jitted clean / corrupted / patched runs of one model (pass 1, log-probs)."""

    def __init__(self, model: BoardTransformer):
        self.model = model
        graphdef, state = nnx.split(model)

        def residuals(state, inputs):
            m = nnx.merge(graphdef, state)
            captured: list = []
            out = m(inputs, refine=False, capture=captured)
            return jnp.stack(captured), jax.nn.log_softmax(out.policy_logits, -1)

        def patched(state, inputs, step, mask, values):
            m = nnx.merge(graphdef, state)
            out = m(inputs, refine=False, patch=(step, mask, values))
            return jax.nn.log_softmax(out.policy_logits, -1)

        self._state = state
        self._residuals = jax.jit(residuals)
        self._patched = jax.jit(patched, static_argnums=2)

    def residuals(self, board: chess.Board) -> tuple[np.ndarray, np.ndarray]:
        """(residual stream ``[steps, 1, T, d]``, pass-1 log-probs ``[1968]``) of one position."""
        res, lp = self._residuals(self._state, _inputs(board))
        return np.asarray(res), np.asarray(lp)[0]

    def patch(
        self, clean: chess.Board, corrupt: chess.Board, step: int, squares: Sequence[int]
    ) -> PatchEffect:
        """The clean run with ``squares``' residual at ``step`` taken from the corrupted run."""
        if clean.turn != corrupt.turn:
            raise ValueError("clean and corrupted positions must have the same side to move")
        steps = num_steps(self.model)
        if not 0 <= step < steps:
            raise ValueError(f"step {step} is not in 0..{steps - 1}")
        _, clean_lp = self.residuals(clean)
        corrupt_res, _ = self.residuals(corrupt)
        return self._effect(clean, clean_lp, corrupt_res, step, squares)

    def patched_log_probs(
        self, clean: chess.Board, corrupt_res: np.ndarray, step: int, tokens: Sequence[int]
    ) -> np.ndarray:
        """Pass-1 log-probs ``[1968]`` of the clean run with token rows ``tokens`` at ``step``
        taken from ``corrupt_res`` (``residuals(corrupt)[0]``); any tokens, e.g. CLS = 0."""
        mask = np.zeros(self.model.config.num_tokens, bool)
        mask[np.asarray(tokens, np.int64)] = True
        lp = self._patched(self._state, _inputs(clean), step, jnp.asarray(mask), corrupt_res[step])
        return np.asarray(lp)[0]

    def _effect(self, clean, clean_lp, corrupt_res, step, squares) -> PatchEffect:
        tokens = square_tokens(self.model, squares, clean.turn == chess.WHITE)
        lp = self.patched_log_probs(clean, corrupt_res, step, tokens)
        top = int(clean_lp.argmax())
        p_clean = np.exp(clean_lp)
        kl = float(np.sum(p_clean * (clean_lp - lp)))
        return PatchEffect(
            step=step,
            squares=tuple(int(s) for s in squares),
            clean_move=vocab.MOVES[top],
            clean_prob=float(p_clean[top]),
            patched_prob=float(np.exp(lp[top])),
            patched_move=vocab.MOVES[int(lp.argmax())],
            kl=kl,
        )

    def sweep(self, clean: chess.Board, corrupt: chess.Board) -> np.ndarray:
        """``[steps, 64]`` logit drop of the clean top move, patching one square at a time."""
        _, clean_lp = self.residuals(clean)
        corrupt_res, _ = self.residuals(corrupt)
        out = np.zeros((num_steps(self.model), 64), np.float32)
        for step in range(out.shape[0]):
            for sq in range(64):
                out[step, sq] = self._effect(clean, clean_lp, corrupt_res, step, [sq]).logit_drop
        return out


def patching_sweep(model: BoardTransformer, clean: chess.Board, corrupt: chess.Board) -> np.ndarray:
    """``Patcher(model).sweep(clean, corrupt)``."""
    return Patcher(model).sweep(clean, corrupt)
