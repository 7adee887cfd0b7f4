"""Leaf evaluation through the model's KV cache: the root prefix once, ONE new token per simulation.

Each tree node keeps the ``ChessState`` after its move and the keys/values of its move token
(``[num_layers, heads, head_dim]``). A new node's evaluation gathers the keys/values of its
parent's path (node indices from ``tree_search``; at most P − 1 of them), then runs
``model.extend_with_path(action, root_cache, path_k, path_v, path_len)``: the new token attends
to the root prefix in the cache, the path, and itself. Storing one token per node rather than a
[P]-long path buffer per node keeps the tree at ~1/P of the memory (a 124M model, 201 nodes,
256 games: 3.8 GB instead of 120 GB) for one gather per simulation.

Values: the value head is White's view; the tree wants the view of the player to move at the
node, so v = value_white if White is to move else −value_white. A terminal node (chess_jax's
``outcome`` under the configured rules) gets its exact value: −1 for the mated side to move,
0 for any draw, and is never expanded. Prior logits are restricted to the node's legal moves.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from allie_jax import chess_jax, vocab
from allie_jax.model.kv_cache import KVCache
from allie_jax.search.selection import mask_logits
from allie_jax.search.tree_search import NodeEval


def mover_value(value_white: jax.Array, white_to_move: jax.Array) -> jax.Array:
    return jnp.where(white_to_move, value_white, -value_white)


def terminal_value(state: chess_jax.ChessState, legal: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(done [B], exact value for the side to move [B]): mate −1, draws 0."""
    done, result_white = chess_jax.outcome(state, legal)
    return done, mover_value(result_white, chess_jax.white_to_move(state))


def node_eval(
    state: chess_jax.ChessState,
    policy_logits: jax.Array,
    value_white: jax.Array,
    k: jax.Array,
    v: jax.Array,
) -> NodeEval:
    """A NodeEval from model outputs at a position: legal-masked logits, mover's / exact value."""
    legal = chess_jax.legal_mask(state)
    done, exact = terminal_value(state, legal)
    value = jnp.where(done, exact, mover_value(value_white, chess_jax.white_to_move(state)))
    logits = mask_logits(policy_logits[:, : vocab.NUM_MOVES].astype(jnp.float32), legal)
    return NodeEval(logits, value.astype(jnp.float32), done, {"state": state, "k": k, "v": v})


def make_model_expand(model: Any, root_cache: KVCache):
    """The ``tree_search.ExpandFn`` of a model (call inside jit; ``model`` is an AllieModel)."""

    def expand(payloads, parent, path_nodes, path_len, action):
        rows = jnp.arange(parent.shape[0])
        state = jax.tree.map(lambda x: x[rows, parent], payloads["state"])
        child = chess_jax.apply(state, action)
        # [B, N, L, H, D] gathered at the path -> [L, B, P, H, D]
        path_k = jnp.moveaxis(payloads["k"][rows[:, None], path_nodes], 2, 0)
        path_v = jnp.moveaxis(payloads["v"][rows[:, None], path_nodes], 2, 0)
        out, new_k, new_v = model.extend_with_path(
            action[:, None].astype(jnp.int32), root_cache, path_k, path_v, path_len
        )
        return node_eval(
            child,
            out.policy_logits[:, 0],
            out.value[:, 0],
            jnp.moveaxis(new_k[:, :, 0], 0, 1),  # [B, L, H, D]
            jnp.moveaxis(new_v[:, :, 0], 0, 1),
        )

    return expand


def root_eval(model: Any, state: chess_jax.ChessState, outputs_last, cache: KVCache) -> NodeEval:
    """The root's NodeEval from the prefix's last outputs; its own k/v slot is unused (zeros)."""
    cfg = model.config
    b = state.color.shape[0]
    zeros = jnp.zeros((b, cfg.num_layers, cfg.num_heads, cfg.head_dim), cache.k.dtype)
    return node_eval(state, outputs_last.policy_logits, outputs_last.value, zeros, zeros)
