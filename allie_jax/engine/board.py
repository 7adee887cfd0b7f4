"""The board-state transformer (seed 001) behind Allie's interfaces, searched by the one search.

``Allie.load`` / ``predict`` / ``play`` accept a board checkpoint: ``Allie`` asks ``BoardForward``
for the raw outputs (the model reads python-chess boards, not token rows) and builds its searcher
with ``BoardSearcher``, which is the package's ``Searcher`` (per-game budgets, chunks, deadline,
fixed shapes, warm-up, π̄ / Gumbel, the move and resignation rules of search/decision.py) with
the board family's roots and leaves: a node carries its ``chess_jax`` state, and a new node is one
rules step, the board features built inside jit (``data/board_features_jax.py``) and one forward
pass for the whole batch. ``search/reference.py``'s plain-Python MCTS is only the tests' oracle.

What the board model does not have: a think-time head (``think_time_s`` is 0, so the adaptive
modes are refused: their budget is the predicted think time) and a resignation token (the
termination-token rule never fires, so it never resigns).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import chess
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import aot, chess_jax, vocab
from allie_jax.data import board_features, board_features_jax
from allie_jax.game import Game, normalize_think_time
from allie_jax.model.board_transformer import BoardTransformer
from allie_jax.search import decision, leaves
from allie_jax.search.config import ADAPTIVE_MODES, SearchConfig
from allie_jax.search.searcher import Searcher, SearchOutput
from allie_jax.search.tree_search import NodeEval

NO_TOKEN = leaves.NO_TOKEN  # log-prob of the non-move tokens (time controls, termination, ...)


def is_board_model(model: Any) -> bool:
    """Whether ``model`` (any object: a caller's checkpoint may be anything) is the board
    family's model."""
    return isinstance(model, BoardTransformer)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class BoardForward:
    """A jitted forward over batches of boards (batch sizes bucketed to powers of two)."""

    max_len = 1 << 30  # no context limit: the model reads the board
    reads_boards = True  # ``raw`` reads the boards (the decoder's forward reads the games)
    lengths: tuple[int, ...] = ()  # no token lengths to warm: one board shape per batch bucket

    def fix_shapes(self) -> None:
        """Nothing to close: batches are already bucketed to powers of two (``Allie.warmup``
        calls this on every family's forward)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        graphdef, state = nnx.split(model)
        self._state = state

        def fwd(state, inputs, refine):
            out = nnx.merge(graphdef, state)(inputs, deterministic=True, refine=refine)
            return out.final_log_probs, out.value, out.candidates, out.choice_logits

        self._fwd = jax.jit(fwd, static_argnums=2)

    def outputs(
        self,
        boards: Sequence[chess.Board],
        white_elos: Sequence[int | None] | None = None,
        black_elos: Sequence[int | None] | None = None,
        *,
        refine: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(final log-probs [n, 1968], value White's view [n], candidates [n, 3], choice [n, 3])."""
        batch = board_features.board_inputs(boards, white_elos=white_elos, black_elos=black_elos)
        return self.outputs_from_inputs(batch, refine=refine)

    def outputs_from_inputs(
        self, batch: dict[str, np.ndarray], *, refine: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``outputs`` for examples already built (``board_features.stack``)."""
        n = len(batch["side"])
        size = _pow2(n)
        if size > n:  # pad by repeating the last row (one compiled shape per bucket)
            batch = {
                k: np.concatenate([v, np.repeat(v[-1:], size - n, 0)]) for k, v in batch.items()
            }
        inputs = {k: jnp.asarray(batch[k]) for k in board_features.INPUT_FIELDS}
        lp, value, cand, choice = self._fwd(self._state, inputs, refine)
        return (
            np.asarray(lp)[:n],
            np.asarray(value)[:n],
            np.asarray(cand)[:n],
            np.asarray(choice)[:n],
        )

    def raw(
        self, games: Sequence[Game], boards: Sequence[chess.Board]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What ``Allie._raw`` returns for the decoder: logits over the vocabulary, time, value."""
        lp, value, _, _ = self.outputs(
            boards, [g.white_elo for g in games], [g.black_elo for g in games]
        )
        logits = np.full((len(boards), vocab.VOCAB_SIZE), NO_TOKEN, np.float32)
        logits[:, : vocab.NUM_MOVES] = lp
        time = np.full(len(boards), float(normalize_think_time(np.float32(0.0))), np.float32)
        return logits, time, value


# ----------------------------------------------------------------------------- inside jit
def _forward(model: Any, state, legal, white_elo, black_elo, refine: bool):
    """(final log-probs [B, 1968], value White's view [B]) at ``state``, features built in jit."""
    inputs = board_features_jax.features(state, white_elo, black_elo, legal)
    out = model(inputs, deterministic=True, refine=refine)
    return out.final_log_probs, out.value


@dataclasses.dataclass(frozen=True)
class BoardLeaves(leaves.PositionLeaves):
    """The board family's ``leaves.Leaves``: a node carries its state; the context the Elos."""

    refine: bool = True  # the final (refined) distribution is the prior, as ``BoardForward``

    def root_eval(self, model: Any, state, root_out, context) -> NodeEval:
        del model, context
        value = leaves.mover_value(root_out.value, state.color == 0)
        return leaves.node_eval(state, root_out.policy_logits, value, {"state": state})

    def child(self, model: Any, node, action, context) -> NodeEval:
        child = chess_jax.apply(node["state"], action)
        legal = chess_jax.legal_mask(child)
        lp, value_white = _forward(model, child, legal, *context, self.refine)
        value = leaves.mover_value(value_white, child.color == 0)
        return leaves.node_eval(child, lp, value, {"state": child}, legal)


@functools.partial(aot.jit, static_argnames=("graphdef", "refine"))
def _root(graphdef, params, state, legal, white_elo, black_elo, *, refine: bool):
    model = nnx.merge(graphdef, params)
    lp, value = _forward(model, state, legal, white_elo, black_elo, refine)
    return leaves.move_root_outputs(lp, value)


class BoardRoots(leaves.PositionRoots):
    """``leaves.Roots`` of the board family: the games' Elos (Elo-conditioned) as context."""

    def __init__(self, model: Any, config: SearchConfig, *, fixed_shapes: bool = False):
        super().__init__(model, fixed_shapes=fixed_shapes)
        self.config = config
        self.leaves = BoardLeaves(refine=bool(model.config.refinement))

    def games(self, games: Sequence[Game]) -> list[Game]:
        return [decision.conditioned_game(self.config, g) for g in games]

    def host_context(self, games: Sequence[Game], batch: int) -> np.ndarray:
        elos = np.zeros((2, batch), np.int32)  # (white, black) per row; padding rows unknown
        for i, g in enumerate(games):
            elos[:, i] = (g.white_elo or 0, g.black_elo or 0)
        return elos

    def root_outputs(self, state, legal, context) -> leaves.RootOutputs:
        return _root(self.graphdef, self.params, state, legal, *context, refine=self.leaves.refine)


class BoardSearcher(Searcher):
    """``Searcher(model, config)`` for the board family (``model``: a board model or its
    ``BoardForward``); ``run`` has ``Searcher.run``'s contract (no FEN starts)."""

    def __init__(self, model: Any, config: SearchConfig, *, fixed_shapes: bool = False) -> None:
        model = model.model if isinstance(model, BoardForward) else model
        if config.mode in ADAPTIVE_MODES:
            raise ValueError(
                f"mode {config.mode!r} sets each budget from a predicted think time, which the "
                "board model does not have: use search or gumbel"
            )
        roots = BoardRoots(model, config, fixed_shapes=fixed_shapes)
        super().__init__(model, config, fixed_shapes=fixed_shapes, roots=roots)


BoardSearchOutput = SearchOutput  # the name earlier callers imported
