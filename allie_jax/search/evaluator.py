"""Leaf evaluation through the model's KV cache: the root prefix once, ONE new token per simulation.

Each tree node keeps the ``ChessState`` after its move and the keys/values of its move token
(``[num_layers, heads, head_dim]``). A new node's evaluation gathers the keys/values of its
parent's path (node indices from ``tree_search``; at most P − 1 of them) and runs the move token
through the model's blocks (``path_forward``): it attends to the root prefix in the cache, the
path, and itself. Storing one token per node rather than a [P]-long path buffer per node keeps
the tree at ~1/P of the memory (a 124M model, 201 nodes, 256 games: 3.8 GB instead of 120 GB)
for one gather per simulation.

``path_forward`` computes the same thing as ``model.extend_with_path`` (tested against the
model's full pass) but attends to the three key groups separately with one shared softmax:
a single query per row makes attention memory-bound, and concatenating root + path + self keys
(as ``extend_with_path`` does) copied the whole root cache once per layer per simulation —
at ply 150 and 32 games, ~0.6 GB per simulation step for a 124M model.

Rows that ran out of simulations (``num_active``: rows at or past it are idle this step) skip
the model: ``row_buckets`` lists the batch sizes compiled (a ``lax.switch`` picks the smallest
that covers the active rows). With rows sorted by budget, late steps of a mixed-budget batch
then cost what their few active games cost.

Values: the value head is White's view; the tree wants the view of the player to move at the
node, so v = value_white if White is to move else −value_white. A terminal node (chess_jax's
``outcome`` under the configured rules) gets its exact value: −1 for the mated side to move,
0 for any draw, and is never expanded. Prior logits are restricted to the node's legal moves.
"""

from __future__ import annotations

import functools
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


def _attend_one(q, k, v, root_k, root_v, root_len, path_k, path_v, path_len):
    """Attention of ONE query per row over root prefix + path + itself, one softmax.

    q, k, v: [b, heads, hd]; root_k/v: [b, M, heads, hd] (first ``root_len`` valid);
    path_k/v: [b, P, heads, hd] (first ``path_len`` valid). Products are reduced in place
    rather than through dot_general, which would transpose the root cache first.
    """
    f32 = jnp.float32
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], f32))
    q = q.astype(f32) * scale
    s_root = jnp.sum(q[:, None] * root_k.astype(f32), -1)  # [b, M, heads]
    s_root = jnp.where(
        (jnp.arange(root_k.shape[1]) < root_len[:, None])[..., None], s_root, -jnp.inf
    )
    s_path = jnp.sum(q[:, None] * path_k.astype(f32), -1)  # [b, P, heads]
    s_path = jnp.where(
        (jnp.arange(path_k.shape[1]) < path_len[:, None])[..., None], s_path, -jnp.inf
    )
    s_self = jnp.sum(q * k.astype(f32), -1)  # [b, heads]
    m = jnp.maximum(jnp.maximum(s_root.max(1), s_path.max(1)), s_self)
    e_root = jnp.exp(s_root - m[:, None])
    e_path = jnp.exp(s_path - m[:, None])
    e_self = jnp.exp(s_self - m)
    denom = e_root.sum(1) + e_path.sum(1) + e_self
    out = (
        jnp.sum(e_root[..., None] * root_v.astype(f32), 1)
        + jnp.sum(e_path[..., None] * path_v.astype(f32), 1)
        + e_self[..., None] * v.astype(f32)
    )
    return out / denom[..., None]


def path_forward(model: Any, action, root_cache: KVCache, path_nodes, path_len, store_k, store_v):
    """Model outputs for move ``action`` [b] after root prefix + path, and the token's keys/values.

    Rows are the first b of ``root_cache`` and of the per-node stores ``store_k/v``
    ([B, N, L, heads, hd]); ``path_nodes`` [b, P] are the path's node slots, ``path_len`` [b]
    how many are real. Returns (ModelOutputs at the new token [b, ...], k, v [b, L, heads, hd]).
    """
    cfg = model.config
    dt = cfg.compute_dtype
    b = action.shape[0]
    rows = jnp.arange(b)
    root_len = root_cache.length[:b]
    positions = (root_len + path_len)[:, None]
    x = model.embed(action[:, None].astype(jnp.int32), positions)  # [b, 1, d]
    new_k, new_v = [], []
    for i, block in enumerate(model.blocks):
        q, k, v = block.attention_inputs(x)  # [b, 1, heads, hd]
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
        path_k = store_k[rows[:, None], path_nodes, i]  # [b, P, heads, hd]
        path_v = store_v[rows[:, None], path_nodes, i]
        out = _attend_one(
            q,
            k,
            v,
            root_cache.k[i, :b],
            root_cache.v[i, :b],
            root_len,
            path_k,
            path_v,
            path_len,
        ).astype(dt)
        y = jnp.einsum("bnh,nhd->bd", out, block.attn.out[...].astype(dt))
        x = x + (y + block.attn.out_bias[...].astype(dt))[:, None]
        x = x + block.mlp(block.ln_2(x))
        new_k.append(k.astype(store_k.dtype))
        new_v.append(v.astype(store_v.dtype))
    outputs = model.heads(x)
    return outputs, jnp.stack(new_k, 1), jnp.stack(new_v, 1)


def make_model_expand(model: Any, root_cache: KVCache, row_buckets: tuple[int, ...] | None = None):
    """The ``tree_search.ExpandFn`` of a model (call inside jit; ``model`` is an AllieModel).

    ``row_buckets``: batch sizes (descending, the first = the batch) for which the model part is
    compiled; each step runs the smallest one covering ``num_active`` rows. None: the batch only.
    """
    batch = root_cache.batch_size
    buckets = tuple(row_buckets or (batch,))
    if buckets[0] != batch or list(buckets) != sorted(buckets, reverse=True):
        raise ValueError(f"row_buckets={buckets} must descend from the batch size {batch}")

    def evaluate(size, store_k, store_v, path_nodes, path_len, action):
        out, k, v = path_forward(
            model,
            action[:size],
            root_cache,
            path_nodes[:size],
            path_len[:size],
            store_k,
            store_v,
        )
        pad = batch - size

        def grow(x):
            return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))

        return grow(out.policy_logits[:, 0]), grow(out.value[:, 0]), grow(k), grow(v)

    def expand(payloads, parent, path_nodes, path_len, action, num_active=None):
        rows = jnp.arange(parent.shape[0])
        state = jax.tree.map(lambda x: x[rows, parent], payloads["state"])
        child = chess_jax.apply(state, action)
        args = (payloads["k"], payloads["v"], path_nodes, path_len, action)
        if len(buckets) == 1 or num_active is None:
            logits, value, k, v = evaluate(batch, *args)
        else:
            # smallest bucket >= num_active: buckets descend, so count those that still cover it
            index = jnp.sum(jnp.asarray(buckets) >= num_active) - 1
            branches = [functools.partial(evaluate, size) for size in buckets]
            logits, value, k, v = jax.lax.switch(index, branches, *args)
        return node_eval(child, logits, value, k, v)

    return expand


def root_eval(model: Any, state: chess_jax.ChessState, outputs_last, cache: KVCache) -> NodeEval:
    """The root's NodeEval from the prefix's last outputs; its own k/v slot is unused (zeros)."""
    cfg = model.config
    b = state.color.shape[0]
    zeros = jnp.zeros((b, cfg.num_layers, cfg.num_heads, cfg.head_dim), cache.k.dtype)
    return node_eval(state, outputs_last.policy_logits, outputs_last.value, zeros, zeros)
