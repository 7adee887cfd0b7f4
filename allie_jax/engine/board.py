"""Inference and search for the board-state transformer (seed 001), behind Allie's interfaces.

``Allie.load`` / ``predict`` / ``play`` accept a board checkpoint: ``Allie`` asks ``BoardForward``
for the raw outputs (the model reads python-chess boards, not token rows) and builds its searcher
with ``BoardSearcher``. The batched Searcher of ``allie_jax.search`` walks a KV-cached decoder, so
the board model searches through the plain-Python ``ReferenceMCTS`` (same pUCT / FPU / π̄
equations) with a leaf evaluator that calls the model once per new node: slow but exact, and the
same value + policy interface a batched evaluator would use.

What the board model does not have: a think-time head (``think_time_s`` is 0, so ``adaptive``
spends ``mean_sims`` on every move) and a resignation token (it never resigns on the policy rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import chess
import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import vocab
from allie_jax.data import board_features
from allie_jax.game import Game, normalize_think_time

NO_TOKEN = -1e9  # log-prob of the non-move tokens (time controls, termination, ...)


def is_board_model(model: Any) -> bool:
    return getattr(getattr(model, "config", None), "family", None) == "board"


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class BoardForward:
    """A jitted forward over batches of boards (batch sizes bucketed to powers of two)."""

    max_len = 1 << 30  # no context limit: the model reads the board

    def __init__(self, model: Any) -> None:
        from flax import nnx

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


class BoardLeafEvaluator:
    """``ReferenceMCTS``'s evaluator: (policy log-probs [1968], value for the side to move)."""

    def __init__(self, forward: BoardForward, root: chess.Board, game: Game) -> None:
        self.forward, self.root, self.game = forward, root, game
        self.calls = 0

    def __call__(self, path: Sequence[int]) -> tuple[np.ndarray, float]:
        board = self.root.copy(stack=True)
        for move in path:
            board.push(chess.Move.from_uci(vocab.MOVES[move]))
        lp, value, _, _ = self.forward.outputs(
            [board], [self.game.white_elo], [self.game.black_elo]
        )
        self.calls += 1
        v = float(value[0])
        return lp[0], v if board.turn == chess.WHITE else -v


@dataclasses.dataclass
class BoardSearchOutput:
    """The fields of ``allie_jax.search.SearchOutput`` that ``Allie.play`` reads."""

    move: list[str]
    move_id: np.ndarray
    policy: np.ndarray  # [B, 1968]
    prior: np.ndarray
    visit_counts: np.ndarray
    num_sims: np.ndarray
    value_white: np.ndarray
    think_time_s: np.ndarray
    resign: np.ndarray
    search_value: np.ndarray


class BoardSearcher:
    """``Searcher(model, config).run(games, rng)`` for the board family (plain-Python MCTS)."""

    def __init__(self, model: Any, config: Any) -> None:
        self.forward = model if isinstance(model, BoardForward) else BoardForward(model)
        self.config = config

    def forget(self) -> None:  # the evaluator's SearchSystem calls this between chunks
        pass

    def run(
        self,
        games: Sequence[Game],
        rng: Any = 0,
        *,
        deadline: float | None = None,
        should_stop: Any = None,
        budgets: Sequence[int] | None = None,
        anchor_logits: Any = None,
        progress: Any = None,
    ) -> BoardSearchOutput:
        """``Searcher.run``'s contract. ``budgets`` sets each game's simulations (clipped to
        ``max_sims``); ``deadline`` / ``should_stop`` are checked between games (a game not yet
        searched when time is up plays from its prior: ``num_sims`` 0); ``progress(sims, moves)``
        is called once at the end. ``greedy`` conditions both Elos on ``greedy_elo``."""
        import dataclasses as dc
        import time

        from allie_jax.engine.api import as_jax_key, replay_board
        from allie_jax.search.reference import ReferenceMCTS

        if anchor_logits is not None:
            raise ValueError("the board searcher has no anchor_logits (piKL) support")
        cfg = self.config
        key = as_jax_key(rng)
        gen = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
        default = 0 if cfg.mode in ("policy", "greedy") else int(cfg.mean_sims)
        if budgets is not None and len(budgets) != len(games):
            raise ValueError(f"budgets has {len(budgets)} entries for {len(games)} games")
        rows = []
        for i, game in enumerate(games):
            sims = default if budgets is None else int(np.clip(budgets[i], 0, cfg.max_sims))
            late = deadline is not None and time.monotonic() >= deadline
            if late or (should_stop is not None and should_stop()):
                sims = 0
            if cfg.mode == "greedy":
                game = dc.replace(game, white_elo=cfg.greedy_elo, black_elo=cfg.greedy_elo)
            board = replay_board(game)
            evaluator = BoardLeafEvaluator(self.forward, board, game)
            mcts = ReferenceMCTS(
                evaluator,
                c_puct=cfg.c_puct,
                c_base=cfg.c_base,
                fpu_mode=cfg.fpu_mode,
                fpu=cfg.fpu,
                lambda_sqrt=cfg.lambda_sqrt,
                final_policy=cfg.final_policy,
                max_path=cfg.max_path,
                rules=cfg.rules,
            )
            res = mcts.run(board, sims)
            policy = res.policy / res.policy.sum()
            if cfg.mode == "greedy" or cfg.temperature <= 0 or cfg.sampling == "argmax":
                move = int(np.argmax(policy))
            else:
                move = int(gen.choice(vocab.NUM_MOVES, p=policy))
            v_mover = res.root_value
            white = board.turn == chess.WHITE
            rows.append((move, policy, res, v_mover if white else -v_mover, sims))
        n = len(rows)
        if progress is not None:
            progress(max(r[4] for r in rows), [vocab.MOVES[r[0]] for r in rows])
        return BoardSearchOutput(
            move=[vocab.MOVES[r[0]] for r in rows],
            move_id=np.asarray([r[0] for r in rows], np.int32),
            policy=np.stack([r[1] for r in rows]),
            prior=np.stack([r[2].prior for r in rows]),
            visit_counts=np.stack([r[2].visit_counts for r in rows]),
            num_sims=np.asarray([r[4] for r in rows], np.int32),
            value_white=np.asarray([r[3] for r in rows], np.float32),
            think_time_s=np.zeros(n, np.float32),
            resign=np.zeros(n, bool),
            search_value=np.asarray([r[3] for r in rows], np.float32),
        )
