"""KL-regularised search on Maia: Maia's policy as the prior and anchor τ, its WDL as the value.

The leaf evaluator is Maia itself, inside the search's jit: a node carries its ``ChessState`` and the
8 newest boards (``lc0_planes_jax``), so expanding a node is one rules step, one plane build and one
Maia forward pass for the whole batch. The tree is mctx's (0.0.71), as in ``allie_jax.search``.

Two KL-regularised modes (piKL's point: search improves a human policy while a KL term keeps it
close to the anchor):

- ``pibar`` (``maia+search``): PUCT search (``c_puct``, no root noise), then Grill et al.'s
  π̄ = argmax_π q·π − λ KL(τ ‖ π) over the legal moves, with λ = ``pikl_lambda`` or, when that is
  None, Grill's λ_N = c_puct·√N / (|A| + N). Unvisited moves take the root's value as q.
- ``gumbel`` (``maia+gumbel``): Gumbel MuZero (sequential halving over ``gumbel_considered``
  moves), then, with ``pikl_lambda`` set, piKL's closed form π ∝ τ · exp(q̂ / λ) over completed
  q-values q̂ (the maximiser of q·π − λ KL(π ‖ τ)); without it, mctx's improved policy
  softmax(log τ + σ(q̂)).
- ``visits``: plain visit counts (no KL post-processing), for reference.

The prior that guides the tree and the anchor τ of the KL term may be different networks
(``anchor_net``), as piKL allows. The move played / predicted is the argmax of the final policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import mctx
import numpy as np
from flax import nnx

from allie_jax import vocab
from allie_jax.baselines import lc0_moves
from allie_jax.baselines import lc0_planes_jax as pj
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaNet
from allie_jax.chess_jax import convert, rules
from allie_jax.search.pibar import kl_lambda, pibar

MODES = ("pibar", "gumbel", "visits")
_NEG = -1e9  # logit of an illegal move (finite: mctx softmaxes every row)


@dataclasses.dataclass(frozen=True)
class MaiaSearchConfig:
    """Search on Maia. ``pikl_lambda`` None: Grill's λ_N (pibar) or mctx's σ (gumbel)."""

    mode: str = "pibar"
    num_simulations: int = 32
    c_puct: float = 1.25
    c_base: float = 19652.0
    pikl_lambda: float | None = None
    gumbel_considered: int = 16
    max_depth: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"maia search mode {self.mode!r}: expected one of {MODES}")
        if self.num_simulations < 1:
            raise ValueError(f"num_simulations={self.num_simulations} must be at least 1")
        if self.pikl_lambda is not None and not self.pikl_lambda > 0:
            raise ValueError(f"pikl_lambda={self.pikl_lambda} must be > 0 (or None)")


@flax.struct.dataclass
class Node:
    """What a tree node carries: the position, its 8-board history, legal moves, and game end."""

    state: rules.ChessState
    boards: jax.Array  # int8 [B, 8, 64]
    rep: jax.Array  # bool [B, 8]
    valid: jax.Array  # bool [B, 8]
    legal: jax.Array  # bool [B, 1968]
    done: jax.Array  # bool [B]


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


def _evaluate(net: MaiaNet, node: Node) -> tuple[jax.Array, jax.Array]:
    """Vocabulary logits (−1e9 off the legal moves) and W − L for the mover."""
    planes = pj.planes(node.boards, node.rep, node.valid, node.state)
    lc0_logits, wdl_logits = net(planes)
    logits = lc0_moves.lc0_to_vocab_logits(
        lc0_logits, node.state.color == 1, pj.king_home(node.state), node.legal
    )
    logits = jnp.where(node.legal, logits, _NEG)
    wdl = jax.nn.softmax(wdl_logits, axis=-1)
    return logits, wdl[:, 0] - wdl[:, 2]


def _step(node: Node, action: jax.Array) -> tuple[Node, jax.Array]:
    """Play ``action`` in every row; returns the child and the mover's reward (+1 mate, −1 for an
    illegal action, which a tree may try below a node whose priors are all tiny)."""
    legal_action = jnp.take_along_axis(node.legal, action[:, None], axis=1)[:, 0]
    moved = rules.apply(node.state, action)
    legal = rules.legal_mask(moved)
    ended, result_white = rules.outcome(moved, legal)
    keep = node.done | ~legal_action  # finished or illegal: the child is a dead copy
    state = jax.tree.map(
        lambda new, old: jnp.where(keep.reshape((-1,) + (1,) * (new.ndim - 1)), old, new),
        moved,
        node.state,
    )
    boards, rep, valid = pj.push_history(
        node.boards, node.rep, node.valid, pj.absolute_boards(moved), pj.repeated(moved)
    )
    pick = lambda new, old: jnp.where(keep.reshape((-1,) + (1,) * (new.ndim - 1)), old, new)  # noqa: E731
    mover_sign = jnp.where(node.state.color == 0, 1.0, -1.0)  # the side that just moved
    reward = jnp.where(ended, result_white * mover_sign, 0.0)
    reward = jnp.where(node.done, 0.0, jnp.where(legal_action, reward, -1.0))
    child = Node(
        state=state,
        boards=pick(boards, node.boards),
        rep=pick(rep, node.rep),
        valid=pick(valid, node.valid),
        legal=pick(legal, node.legal),
        done=node.done | ended | ~legal_action,
    )
    return child, reward


def _search(
    prior_net: MaiaNet, anchor_net: MaiaNet | None, root: Node, rng, config: MaiaSearchConfig
):
    prior_logits, root_value = _evaluate(prior_net, root)
    anchor_logits = prior_logits if anchor_net is None else _evaluate(anchor_net, root)[0]

    def recurrent_fn(params, key, action, node: Node):
        del params, key
        child, reward = _step(node, action)
        logits, value = _evaluate(prior_net, child)
        value = jnp.where(child.done, 0.0, value)
        discount = jnp.where(child.done, 0.0, -1.0)
        out = mctx.RecurrentFnOutput(
            reward=reward, discount=discount, prior_logits=logits, value=value
        )
        return out, child

    root_out = mctx.RootFnOutput(prior_logits=prior_logits, value=root_value, embedding=root)
    invalid = ~root.legal
    if config.mode == "gumbel":
        policy_fn = mctx.gumbel_muzero_policy
        knobs = dict(max_num_considered_actions=config.gumbel_considered)
    else:
        policy_fn = mctx.muzero_policy
        knobs = dict(
            dirichlet_fraction=0.0,
            pb_c_init=config.c_puct,
            pb_c_base=config.c_base,
            temperature=1.0,
        )
    out = policy_fn(
        None,
        rng,
        root_out,
        recurrent_fn,
        config.num_simulations,
        invalid_actions=invalid,
        max_depth=config.max_depth,
        **knobs,
    )
    tree = out.search_tree
    summary = tree.summary()
    visits = summary.visit_counts
    q = summary.qvalues
    anchor = jax.nn.softmax(jnp.where(root.legal, anchor_logits, -jnp.inf), axis=-1)
    total = visits.sum(-1)
    if config.mode == "pibar":
        lam = (
            jnp.full_like(root_value, config.pikl_lambda)
            if config.pikl_lambda is not None
            else kl_lambda(config.c_puct, total, root.legal.sum(-1))
        )
        policy = pibar(jnp.where(visits > 0, q, root_value[:, None]), anchor, root.legal, lam)
    elif config.mode == "gumbel":
        if config.pikl_lambda is not None:
            prior_probs = jax.nn.softmax(prior_logits, axis=-1)
            completed = completed_q(q, visits, prior_probs, root_value)
            logits = jnp.log(jnp.maximum(anchor, 1e-30)) + completed / config.pikl_lambda
            policy = jax.nn.softmax(jnp.where(root.legal, logits, -jnp.inf), axis=-1)
        else:
            policy = out.action_weights
    else:
        policy = visits / jnp.maximum(total[:, None], 1)
    policy = jnp.where(root.legal, policy, 0.0)
    prior = jax.nn.softmax(jnp.where(root.legal, prior_logits, -jnp.inf), axis=-1)
    return {
        "move_id": jnp.argmax(policy, axis=-1).astype(jnp.int32),
        "policy": policy,
        "prior": prior,
        "anchor": anchor,
        "visit_counts": visits,
        "root_value": root_value,
        "search_value": summary.value,
        "num_sims": total,
    }


def completed_q(
    q: jax.Array, visits: jax.Array, prior: jax.Array, raw_value: jax.Array
) -> jax.Array:
    """Root q-values with unvisited moves completed by mctx's mixed value (unscaled):
    (v̂ + N · Σ_visited π(a) q(a) / Σ_visited π(a)) / (1 + N)."""
    visited = visits > 0
    total = visits.sum(-1).astype(jnp.float32)
    p_visited = jnp.where(visited, prior, 0.0).sum(-1)
    weighted = jnp.where(visited, prior * q, 0.0).sum(-1) / jnp.maximum(p_visited, 1e-30)
    mixed = jnp.where(total > 0, (raw_value + total * weighted) / (1.0 + total), raw_value)
    return jnp.where(visited, q, mixed[:, None])


@nnx.jit(static_argnames=("config",))
def _jit_search(prior_net, anchor_net, root, rng, config):
    return _search(prior_net, anchor_net, root, rng, config)


class MaiaSearcher:
    """Batched search on Maia for positions given as games in progress (lists of UCI moves).

    Rows are padded to ``batch_size`` and move lists to a multiple of 64 plies, so a run compiles
    once per (batch size, length bucket).
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

    def roots(self, games: Sequence[Sequence[str]]) -> Node:
        """Root nodes of the positions after each move list (host encoder for the history)."""
        n = len(games)
        length = max([len(m) for m in games] + [1])
        width = -(-length // 64) * 64
        ids = np.zeros((n, width), np.int32)
        boards = np.zeros((n, 8, 64), np.int8)
        rep = np.zeros((n, 8), bool)
        valid = np.zeros((n, 8), bool)
        for i, moves in enumerate(games):
            ids[i, : len(moves)] = convert.uci_to_move_ids(list(moves))
            boards[i], rep[i], valid[i] = GameEncoder(moves).history(len(moves))
        lengths = np.asarray([len(m) for m in games], np.int32)
        state = rules.replay(jnp.asarray(ids), jnp.asarray(lengths))
        legal = rules.legal_mask(state)
        # A root is searched whenever it has a legal move: a human may play on in a position the
        # rules would let them claim as drawn (threefold, 50 moves); inside the tree those end.
        done = ~legal.any(axis=-1)
        return Node(state, jnp.asarray(boards), jnp.asarray(rep), jnp.asarray(valid), legal, done)

    def run(self, games: Sequence[Sequence[str]], rng: jax.Array) -> MaiaSearchOutput:
        """Search every position (games must not be over: each needs a legal move)."""
        outs = []
        for start in range(0, len(games), self.batch_size):
            chunk = list(games[start : start + self.batch_size])
            n = len(chunk)
            padded = chunk + [chunk[-1]] * (self.batch_size - n)
            root = self.roots(padded)
            if bool(np.asarray(root.done[:n]).any()):
                bad = int(np.argmax(np.asarray(root.done[:n])))
                raise ValueError(f"maia search: position {start + bad} has no legal move")
            res = _jit_search(
                self.prior_net, self.anchor_net, root, jax.random.fold_in(rng, start), self.config
            )
            outs.append({k: np.asarray(v)[:n] for k, v in res.items()})
        cat = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
        return MaiaSearchOutput(
            move_id=cat["move_id"],
            move=[vocab.MOVES[int(i)] for i in cat["move_id"]],
            policy=cat["policy"].astype(np.float32),
            prior=cat["prior"].astype(np.float32),
            anchor=cat["anchor"].astype(np.float32),
            visit_counts=cat["visit_counts"].astype(np.int32),
            root_value=cat["root_value"].astype(np.float32),
            search_value=cat["search_value"].astype(np.float32),
            num_sims=cat["num_sims"].astype(np.int32),
        )
