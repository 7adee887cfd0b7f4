"""``launch.evaluate --systems board[,board+search]``: the board-state transformer as a system.

The checkpoint comes from ``--system_options board_checkpoint=DIR`` (a model dir or a training
workdir); without it, the main ``--checkpoint`` model is used if it is a board model.

- ``board``: the final (refined) move distribution at every position, one batched forward per
  chunk of positions (each game replayed once with python-chess).
- ``board+MODE`` (``board+search``, ``board+gumbel``, ...): ``engine.board.BoardSearcher`` with
  the board model's value and policy on the evaluator's search subsample,
  ``SearchConfig.preset(MODE)`` with any ``--system_options`` SearchConfig field applied.

The board model has no think-time head (``think_time`` stays NaN) and never resigns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from allie_jax.data import board_features
from allie_jax.eval.systems import (
    TOP_K,
    Positions,
    Scores,
    SystemContext,
    position_key,
    search_config,
    search_suffixes,
)

CHUNK = 256  # positions per forward


def board_examples(positions: Positions) -> dict[str, np.ndarray]:
    """Model inputs for every asked position (each game replayed once)."""
    import chess

    wanted: dict[int, dict[int, int]] = {}
    for p, g in enumerate(positions.game):
        wanted.setdefault(int(g), {})[int(positions.ply[p])] = p
    rows: list[dict[str, np.ndarray] | None] = [None] * len(positions)
    for g, by_ply in wanted.items():
        game = positions.games[g]
        final = len(game.moves)
        plies = sorted(k for k in by_ply if k < final)
        for ply, ex in zip(plies, board_features.game_examples(game, plies=plies), strict=True):
            rows[by_ply[ply]] = ex
        if final in by_ply:  # the final board (no human move): features only
            board = chess.Board()
            for uci in game.moves:
                board.push_uci(uci)
            rows[by_ply[final]] = board_features.position_features(
                board, white_elo=game.white_elo, black_elo=game.black_elo
            )
    fields = board_features.FIELDS
    return {
        k: np.stack([np.asarray(r[k], fields[k][1]) for r in rows])
        for k in board_features.INPUT_FIELDS
    }


class BoardSystem:
    """The board model's policy (``board``)."""

    subsample = False

    def __init__(self, model: Any, *, name: str = "board", top_k: int = TOP_K):
        from allie_jax.engine.board import BoardForward

        self.name = name
        self.forward = BoardForward(model)
        self.top_k = top_k
        cfg = model.config
        self.info = {
            "family": "board",
            "refinement": cfg.refinement,
            "mask_illegal": cfg.mask_illegal,
            "flip": cfg.flip,
            "piece_scheme": cfg.piece_scheme,
        }
        self.on_batch: Callable[[int], None] | None = None

    def score(self, positions: Positions) -> Scores:
        out = Scores.empty(len(positions), self.top_k)
        if not len(positions):
            return out
        human = positions.human_move()
        inputs = board_examples(positions)
        for start in range(0, len(positions), CHUNK):
            sl = slice(start, min(start + CHUNK, len(positions)))
            lp, value, _, _ = self.forward.outputs_from_inputs(
                {k: v[sl] for k, v in inputs.items()}
            )
            for j, p in enumerate(range(sl.start, sl.stop)):
                legal = positions.legal_ids(p)
                out.set_from_distribution(p, np.exp(lp[j]), legal, int(human[p]), all_tokens=True)
                out.value[p] = value[j]
            if self.on_batch is not None:
                self.on_batch(sl.stop - sl.start)
        return out


class BoardSearchSystem:
    """``board+search``: MCTS over the board model's value and policy (the search subsample)."""

    subsample = True

    def __init__(
        self,
        model: Any,
        *,
        name: str = "board+search",
        seed: int = 0,
        top_k: int = TOP_K,
        config: Any = None,
    ):
        from allie_jax.engine.board import BoardSearcher
        from allie_jax.search.config import SearchConfig

        self.name = name
        self.config = config if config is not None else SearchConfig.preset("search")
        self.searcher = BoardSearcher(model, self.config)
        self.seed = seed
        self.top_k = top_k
        self.info = {"family": "board", "sims": self.config.mean_sims}
        self.on_batch: Callable[[int], None] | None = None

    def score(self, positions: Positions) -> Scores:
        out = Scores.empty(len(positions), self.top_k)
        human = positions.human_move()
        for p in range(len(positions)):
            if int(positions.ply[p]) >= len(positions.games[int(positions.game[p])].moves):
                continue  # a final board has nothing to search
            game_id = positions.games[int(positions.game[p])].game_id
            key = position_key(self.seed, game_id, int(positions.ply[p]))  # not the row index
            res = self.searcher.run([positions.prefix(p)], key)
            legal = positions.legal_ids(p)
            out.set_from_distribution(p, res.policy[0], legal, int(human[p]), all_tokens=False)
            out.value[p] = res.value_white[0]
            out.num_sims[p] = res.num_sims[0]
            if self.on_batch is not None:
                self.on_batch(1)
        return out


def _load(ctx: SystemContext):
    from allie_jax.engine.board import is_board_model
    from allie_jax.model.checkpoint import load_model

    path = ctx.options.get("board_checkpoint")
    if path:
        return load_model(path)
    model = ctx.allie()
    if not is_board_model(model):
        raise ValueError(
            "the board systems need a board checkpoint: --system_options board_checkpoint=DIR"
        )
    return model


def make_board(name: str, ctx: SystemContext):
    """Factory for ``board`` and ``board+search`` (the registry's ``board`` prefix)."""
    model = _load(ctx)
    if name == "board":
        return BoardSystem(model, name=name, top_k=ctx.get("top_k", TOP_K))
    _, plus, mode = name.partition("+")
    if plus and mode in search_suffixes("board"):
        return BoardSearchSystem(
            model,
            name=name,
            seed=ctx.get("seed", 0),
            top_k=ctx.get("top_k", TOP_K),
            config=search_config(mode, ctx.options),
        )
    raise ValueError(f"unknown board system {name!r}: expected board or board+MODE")
