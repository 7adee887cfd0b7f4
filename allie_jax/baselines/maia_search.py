"""Search on Maia-1 through the package's one search: Maia's policy as the prior, its WDL as the value.

``MaiaSearcher`` is the ``Searcher`` of ``allie_jax.search`` (pUCT with first-play urgency and
per-budget c_puct, the path limit, π̄ or Gumbel, per-game budgets, chunks, the deadline, the move
and resignation rules) with Maia's roots and leaves: a node carries its ``ChessState`` and the 8
newest boards (``lc0_planes_jax``), so expanding a node is one rules step, one plane build and one
Maia forward pass for the whole batch, inside the search's jit. ``MaiaSearchConfig`` keeps the
names the evaluator and the player use and maps onto a ``SearchConfig``:

- ``pibar`` (``maia+search``): pUCT search, then π̄ = argmax_π q·π − λ KL(τ ‖ π) over completed
  Q (mctx's mixed value for unvisited moves, so π̄ never plays a move the search did not visit).
- ``gumbel`` (``maia+gumbel``): Gumbel MuZero (sequential halving over ``gumbel_considered``
  moves) with the human-anchored improved policy softmax(log τ + q̂/λ).
- ``visits``: the visit distribution, for reference.

λ is ``SearchConfig``'s human-anchor strength: ``anchor_lambda`` (value units) under
``lambda_schedule``; ``pikl_lambda`` is the older name of a constant λ and, when set, wins.

The prior that guides the tree and the anchor τ of the KL term may be different networks
(``anchor_net``), as piKL allows. Maia has no think-time head, so the adaptive modes are not
offered (their budget is a predicted think time) and every game gets ``num_simulations``.
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
from allie_jax.baselines import lc0_moves
from allie_jax.baselines import lc0_planes_jax as pj
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaNet
from allie_jax.game import Game
from allie_jax.search import leaves
from allie_jax.search.config import DEFAULT_ANCHOR_LAMBDA, SearchConfig
from allie_jax.search.searcher import Searcher
from allie_jax.search.tree_search import NodeEval

MODES = ("pibar", "gumbel", "visits")


# SearchConfig fields search_config() sets from this config's own (not overridable by name)
_SET_HERE = ("mode", "mean_sims", "max_sims", "anchor_lambda", "final_policy", "resign", "max_path")


@dataclasses.dataclass(frozen=True)
class MaiaSearchConfig:
    """Search on Maia (see the module docstring); ``search_config()`` is the one search's config."""

    mode: str = "pibar"
    num_simulations: int = 32
    c_puct: float = 1.25
    c_base: float = 19652.0
    pikl_lambda: float | None = None  # a constant λ (the older name of anchor_lambda)
    anchor_lambda: float = DEFAULT_ANCHOR_LAMBDA
    lambda_schedule: str = "constant"
    gumbel_considered: int = 16
    max_depth: int | None = None  # the path limit (None: SearchConfig's max_path)
    temperature: float = 1.0
    sampling: str = "argmax"  # Maia plays / predicts the mode of its final policy
    leaf_batch: int = 1  # leaves per position per step (SearchConfig.leaf_batch)
    virtual_loss: str = "visit"  # how pending leaves steer a step (SearchConfig.virtual_loss)
    # any other SearchConfig field, as (name, value) pairs (``selection``, ``fpu``, ...): the
    # evaluator's and the match's --system_options reach Maia's search like the decoder's
    search_overrides: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"maia search mode {self.mode!r}: expected one of {MODES}")
        if self.num_simulations < 1:
            raise ValueError(f"num_simulations={self.num_simulations} must be at least 1")
        if self.pikl_lambda is not None and not self.pikl_lambda > 0:
            raise ValueError(f"pikl_lambda={self.pikl_lambda} must be > 0 (or None)")
        named = {f.name for f in dataclasses.fields(self)} | set(_SET_HERE)
        clash = sorted(k for k, _ in self.search_overrides if k in named)
        if clash:
            raise ValueError(f"search_overrides {clash}: set them as MaiaSearchConfig fields")

    def search_config(self) -> SearchConfig:
        """The one search's config for this Maia search (``search_overrides`` added last)."""
        lam, schedule = self.anchor_lambda, self.lambda_schedule
        if self.pikl_lambda is not None:
            lam, schedule = float(self.pikl_lambda), "constant"
        extra = {} if self.max_depth is None else {"max_path": int(self.max_depth)}
        extra.update(self.search_overrides)  # fields this config does not name
        return SearchConfig(
            mode="gumbel" if self.mode == "gumbel" else "search",
            mean_sims=self.num_simulations,
            max_sims=self.num_simulations,
            c_puct=self.c_puct,
            c_base=self.c_base,
            anchor_lambda=lam,
            lambda_schedule=schedule,
            final_policy="visits" if self.mode == "visits" else "pibar",
            gumbel_considered=self.gumbel_considered,
            temperature=self.temperature,
            sampling=self.sampling,
            resign=False,
            leaf_batch=self.leaf_batch,
            virtual_loss=self.virtual_loss,
            **extra,
        )


@dataclasses.dataclass
class MaiaSearchOutput:
    """numpy, batch first; values are from the mover's view."""

    move_id: np.ndarray  # int32 [B]
    move: list[str]
    policy: np.ndarray  # float32 [B, 1968] final policy (legal moves only)
    prior: np.ndarray  # float32 [B, 1968] Maia's policy (the search prior)
    anchor: np.ndarray  # float32 [B, 1968] τ of the KL term
    visit_counts: np.ndarray  # int32 [B, 1968]
    root_value: np.ndarray  # float32 [B] Maia's W − L at the root
    search_value: np.ndarray  # float32 [B] the tree's root value
    num_sims: np.ndarray  # int32 [B]


# ----------------------------------------------------------------------------- inside jit
def evaluate(net: MaiaNet, state, boards, rep, valid, legal) -> tuple[jax.Array, jax.Array]:
    """Vocabulary logits (−inf off the legal moves) and W − L for the side to move."""
    planes = pj.planes(boards, rep, valid, state)
    lc0_logits, wdl_logits = net(planes)
    logits = lc0_moves.lc0_to_vocab_logits(lc0_logits, state.color == 1, pj.king_home(state), legal)
    wdl = jax.nn.softmax(wdl_logits, axis=-1)
    return logits, wdl[:, 0] - wdl[:, 2]


@dataclasses.dataclass(frozen=True)
class MaiaLeaves(leaves.PositionLeaves):
    """Maia's ``leaves.Leaves``: a node carries its state and 8-board history (the context holds
    the roots' history)."""

    def root_eval(self, model: Any, state, root_out, context) -> NodeEval:
        del model
        boards, rep, valid = context
        payload = {"state": state, "boards": boards, "rep": rep, "valid": valid}
        value = leaves.mover_value(root_out.value, state.color == 0)
        ev = leaves.node_eval(state, root_out.policy_logits, value, payload)
        # a root the rules would let a player claim drawn is still searched (a human may play
        # on); only a root without a legal move cannot be
        has_move = (ev.prior_logits > leaves.NO_TOKEN / 2).any(-1)
        return ev._replace(terminal=~has_move, value=jnp.where(has_move, value, ev.value))

    def child(self, model: Any, node, action, context) -> NodeEval:
        del context  # a node's history is in its payload
        child = chess_jax.apply(node["state"], action)
        legal = chess_jax.legal_mask(child)
        boards, rep, valid = pj.push_history(
            node["boards"],
            node["rep"],
            node["valid"],
            pj.absolute_boards(child),
            pj.repeated(child),
        )
        logits, value = evaluate(model, child, boards, rep, valid, legal)
        payload = {"state": child, "boards": boards, "rep": rep, "valid": valid}
        return leaves.node_eval(child, logits, value, payload, legal)


@functools.partial(aot.jit, static_argnames=("graphdef",))
def _root(graphdef, params, state, legal, boards, rep, valid):
    net = nnx.merge(graphdef, params)
    logits, value_mover = evaluate(net, state, boards, rep, valid, legal)
    moves = jnp.where(legal, logits, leaves.NO_TOKEN)
    return leaves.move_root_outputs(moves, leaves.mover_value(value_mover, state.color == 0))


def _history(games: Sequence[Game], batch: int):
    boards = np.zeros((batch, pj.HISTORY, 64), np.int8)
    rep = np.zeros((batch, pj.HISTORY), bool)
    valid = np.zeros((batch, pj.HISTORY), bool)
    for i in range(batch):
        g = games[i if i < len(games) else 0]
        boards[i], rep[i], valid[i] = GameEncoder(g.moves).history(len(g.moves))
    return boards, rep, valid


class MaiaRoots(leaves.PositionRoots):
    """``leaves.Roots`` of Maia: the root's 8-board history (host encoder) as context."""

    leaves = MaiaLeaves()
    claimable_roots = True  # a root in a claimable draw is searched (see MaiaLeaves.root_eval)

    def host_context(self, games: Sequence[Game], batch: int):
        return _history(games, batch)

    def root_outputs(self, state, legal, context) -> leaves.RootOutputs:
        return _root(self.graphdef, self.params, state, legal, *context)


def maia_searcher(net: MaiaNet, config: SearchConfig, *, fixed_shapes: bool = False) -> Searcher:
    """The one ``Searcher`` with Maia as the model (``config``: any non-adaptive mode)."""
    if config.adaptive:
        raise ValueError(
            f"mode {config.mode!r} sets each budget from a predicted think time, which Maia "
            "does not have: use search or gumbel"
        )
    return Searcher(
        net, config, fixed_shapes=fixed_shapes, roots=MaiaRoots(net, fixed_shapes=fixed_shapes)
    )


@functools.partial(aot.jit, static_argnames=("graphdef",))
def _anchor_logits(graphdef, params, state, legal, boards, rep, valid):
    return _root(graphdef, params, state, legal, boards, rep, valid).policy_logits


class MaiaSearcher:
    """Batched search on Maia for positions given as games in progress (lists of UCI moves).

    Rows are run ``batch_size`` at a time (padded to a power of two, move lists to a length
    bucket), so a run compiles once per (batch size, length bucket).
    """

    def __init__(
        self,
        prior_net: MaiaNet,
        config: MaiaSearchConfig = MaiaSearchConfig(),
        *,
        anchor_net: MaiaNet | None = None,
        batch_size: int = 32,
    ):
        self.prior_net = prior_net
        self.anchor_net = anchor_net
        self.config = config
        self.batch_size = batch_size
        self.searcher = maia_searcher(prior_net, config.search_config())
        self._anchor = None if anchor_net is None else nnx.split(anchor_net)

    def _anchor_rows(self, games: list[Game]) -> np.ndarray | None:
        if self._anchor is None:
            return None
        b = len(games)
        moves, history = self.searcher.roots.prepare(games, b)
        state, legal, _ = self.searcher.replay(moves)
        logits = _anchor_logits(*self._anchor, state, legal, *(jnp.asarray(x) for x in history))
        return np.asarray(logits)[:, : vocab.NUM_MOVES]

    def run(self, games: Sequence[Sequence[str]], rng: jax.Array) -> MaiaSearchOutput:
        """Search every position (games must not be over: each needs a legal move)."""
        outs = []
        for start in range(0, len(games), self.batch_size):
            chunk = [Game(moves=list(m)) for m in games[start : start + self.batch_size]]
            for i, g in enumerate(chunk):
                board = chess.Board()
                for uci in g.moves:
                    board.push_uci(uci)
                if not board.legal_moves.count():
                    raise ValueError(f"maia search: position {start + i} has no legal move")
            anchor = self._anchor_rows(chunk)
            res = self.searcher.run(chunk, jax.random.fold_in(rng, start), anchor_logits=anchor)
            white = np.asarray([len(g.moves) % 2 == 0 for g in chunk])
            legal = res.prior > 0
            if anchor is None:
                tau = res.prior
            else:
                a = np.where(legal, anchor, -np.inf)
                tau = np.exp(a - a.max(-1, keepdims=True))
                tau = tau / tau.sum(-1, keepdims=True)
            outs.append(
                {
                    "move_id": res.move_id,
                    "policy": res.policy,
                    "prior": res.prior,
                    "anchor": tau.astype(np.float32),
                    "visit_counts": res.visit_counts,
                    "root_value": np.where(white, res.value_white, -res.value_white),
                    "search_value": res.search_value,
                    "num_sims": res.num_sims,
                }
            )
        cat = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
        return MaiaSearchOutput(
            move_id=cat["move_id"].astype(np.int32),
            move=[vocab.MOVES[int(i)] for i in cat["move_id"]],
            policy=cat["policy"].astype(np.float32),
            prior=cat["prior"].astype(np.float32),
            anchor=cat["anchor"].astype(np.float32),
            visit_counts=cat["visit_counts"].astype(np.int32),
            root_value=cat["root_value"].astype(np.float32),
            search_value=cat["search_value"].astype(np.float32),
            num_sims=cat["num_sims"].astype(np.int32),
        )
