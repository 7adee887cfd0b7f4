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
at ply 150 and 32 games, ~0.6 GB per simulation step for a 124M model. The path's keys/values
of all layers are read by one gather per store, fenced by an optimisation barrier before the
model runs: read layer by layer, nothing ordered the last layers' reads before the step's write
of the new token into the same stores, so XLA copied both whole [B, N, L, heads, hd] stores
twice per step (the figures are in bench/RESULTS.md).

Rows that ran out of simulations (``num_active``: rows at or past it are idle this step) skip
the model and the chess rules (move, legal mask, outcome): ``row_buckets`` lists the batch sizes
compiled (a ``lax.switch`` picks the smallest that covers the active rows). With rows sorted by
budget, late steps of a mixed-budget batch then cost what their few active games cost. The
same switch reads only the first 4 or 8 path slots (``SHORT_PATHS``) when every active row's
path fits.

Values: the value head is White's view; the tree wants the view of the player to move at the
node, so v = value_white if White is to move else −value_white. A terminal node (chess_jax's
``outcome`` under the configured rules) gets its exact value: −1 for the mated side to move,
0 for any draw, and is never expanded. Prior logits are restricted to the node's legal moves.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from allie_jax import chess_jax
from allie_jax.model.kv_cache import KVCache
from allie_jax.search import leaves
from allie_jax.search.leaves import mover_value
from allie_jax.search.tree_search import NodeEval


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
    value = mover_value(value_white, chess_jax.white_to_move(state))
    return leaves.node_eval(state, policy_logits, value, {"state": state, "k": k, "v": v})


def _attend_one(q, k, v, root_k, root_v, root_len, live, path_k, path_v, path_len, group=1):
    """Attention of ONE query per row over root prefix + path + itself, one softmax.

    q, k, v: [b, heads, hd]; root_k/v: the root cache's position blocks (``RootKV``), each
    [b, heads, block, hd], the first ``root_len`` positions valid; ``live`` (a scalar, ≥ every
    row's ``root_len``): blocks starting at or after it hold no row's tokens and are skipped
    (a ``lax.cond``), so a 35-token root in a 128-wide cache reads 64 positions, not 128.
    path_k/v: [b, heads, P, hd] (first ``path_len`` valid). Heads come before positions so
    each (row, head) is one contiguous matrix-vector product (with positions first, XLA on CPU
    transposed the root cache at every call, or reduced it several times more slowly).
    ``group`` > 1: rows come in groups of ``group`` leaves of one game, and ``root_k/v`` hold
    one row per game: each game's root is read once for all its leaves (one matrix product).
    """
    f32 = jnp.float32
    q = q.astype(f32) / jnp.sqrt(jnp.asarray(q.shape[-1], f32))

    def scores(keys, length, start=0, shared=False):
        if shared and group > 1:  # [games, group, heads, m]: one root per group of rows
            s = jnp.einsum("gknh,gnmh->gknm", q.reshape(-1, group, *q.shape[1:]), keys.astype(f32))
            s = s.reshape(q.shape[0], q.shape[1], keys.shape[2])
        else:
            s = jnp.einsum("bnh,bnmh->bnm", q, keys.astype(f32))
        positions = start + jnp.arange(keys.shape[2])
        return jnp.where((positions < length[:, None])[:, None], s, -jnp.inf)

    def if_live(start, fn, skipped):
        # block 0 always holds tokens; the others only while the roots reach them
        return fn() if start == 0 else jax.lax.cond(start < live, fn, lambda: skipped)

    starts = [sum(blk.shape[2] for blk in root_k[:j]) for j in range(len(root_k))]
    b, n = q.shape[:2]
    s_root = [
        if_live(
            start,
            functools.partial(scores, keys, root_len, start, True),
            jnp.full((b, n, keys.shape[2]), -jnp.inf, f32),
        )
        for start, keys in zip(starts, root_k, strict=True)
    ]
    s_path = scores(path_k, path_len)
    s_self = jnp.sum(q * k.astype(f32), -1)  # [b, heads]
    m = functools.reduce(jnp.maximum, [s.max(-1) for s in s_root] + [s_path.max(-1), s_self])
    e_root = [jnp.exp(s - m[..., None]) for s in s_root]
    e_path = jnp.exp(s_path - m[..., None])
    e_self = jnp.exp(s_self - m)
    denom = sum(e.sum(-1) for e in e_root) + e_path.sum(-1) + e_self

    def weighted(e, values):
        if group == 1:
            return jnp.einsum("bnm,bnmh->bnh", e, values.astype(f32))
        e = e.reshape(-1, group, *e.shape[1:])
        return jnp.einsum("gknm,gnmh->gknh", e, values.astype(f32)).reshape(q.shape)

    out = sum(
        if_live(start, functools.partial(weighted, e, values), jnp.zeros_like(q))
        for start, e, values in zip(starts, e_root, root_v, strict=True)
    )
    out = (
        out
        + jnp.einsum("bnm,bnmh->bnh", e_path, path_v.astype(f32))
        + e_self[..., None] * v.astype(f32)
    )
    return out / denom[..., None]


# The root cache is cut into position blocks of at least ``ROOT_BLOCK`` positions (at most
# ``MAX_ROOT_BLOCKS`` of them), and a simulation step reads the blocks up to the longest root
# among its rows, not the whole cache width: the engine's 128-wide cache holds ~35 tokens at
# ply 30. Smaller blocks cost more (extra products and conditionals) than they skip.
ROOT_BLOCK = 64
MAX_ROOT_BLOCKS = 8


class RootKV(NamedTuple):
    """The root cache per layer, as position blocks of [B, heads, block, hd] arrays."""

    k: tuple[tuple[jax.Array, ...], ...]
    v: tuple[tuple[jax.Array, ...], ...]
    length: jax.Array  # int32 [B]


def heads_first(cache: KVCache) -> RootKV:
    """The root cache in the layout ``path_forward`` reads, made once per move.

    Heads before positions (see ``_attend_one``); one array per layer (slicing layer i out
    of one [L, ...] array inside the simulation loop materialised a copy of it every step) and
    per position block (``ROOT_BLOCK``), so a step can skip the blocks no root reaches.
    """
    width = cache.k.shape[2]
    size = max(ROOT_BLOCK, width // MAX_ROOT_BLOCKS)
    blocks = width // size if width % size == 0 else 1
    size = width // blocks

    def split(x):  # [B, M, heads, hd] -> blocks of [B, heads, size, hd]
        return tuple(jnp.swapaxes(x[:, j * size : (j + 1) * size], 1, 2) for j in range(blocks))

    layers = range(cache.k.shape[0])
    return RootKV(
        tuple(split(cache.k[i]) for i in layers),
        tuple(split(cache.v[i]) for i in layers),
        cache.length,
    )


def _rows(x: jax.Array, b: int) -> jax.Array:
    return x if x.shape[0] == b else x[:b]


def path_forward(
    model: Any, action, root: RootKV, path_nodes, path_len, store_k, store_v, leaf_batch: int = 1
):
    """Model outputs for move ``action`` [b] after root prefix + path, and the token's keys/values.

    ``root`` is the root cache in ``heads_first`` layout; rows are its first b and the first b of
    the per-node stores ``store_k/v`` ([B, N, L, heads, hd]); ``path_nodes`` [b, P] are the
    path's node slots, ``path_len`` [b] how many are real. The model decodes the token
    (``AllieModel.decode_one``); this function supplies its attention over the three key groups.
    Returns (ModelOutputs at the new token, k, v [b, L, heads, hd]). ``leaf_batch`` K > 1: row r
    is a leaf of game r // K (b a multiple of K; the root cache and the stores hold games, not
    rows).
    """
    b = action.shape[0]
    games = b // leaf_batch
    rows = jnp.arange(b) if leaf_batch == 1 else jnp.arange(b) // leaf_batch
    root_len = _rows(root.length, games)
    if leaf_batch > 1:
        root_len = jnp.repeat(root_len, leaf_batch)
    live = jnp.max(root_len)  # the longest root among these rows: later blocks are skipped
    # [b, L, heads, P, hd]: every layer's path keys/values read at once, before the model runs
    all_k, all_v = jax.lax.optimization_barrier(
        tuple(
            jnp.transpose(s[rows[:, None], path_nodes], (0, 2, 3, 1, 4)) for s in (store_k, store_v)
        )
    )

    def attend(i, q, k, v):
        return _attend_one(
            q,
            k,
            v,
            tuple(_rows(x, games) for x in root.k[i]),
            tuple(_rows(x, games) for x in root.v[i]),
            root_len,
            live,
            all_k[:, i],
            all_v[:, i],
            path_len,
            leaf_batch,
        )

    out, k, v = model.decode_one(action.astype(jnp.int32), root_len + path_len, attend)
    return out, k.astype(store_k.dtype), v.astype(store_v.dtype)


# Path slots a step's evaluation reads when every active row's path fits (the smallest width
# that covers the longest active path; ``max_path`` beyond the last): gathering all
# ``max_path`` slots per row and splitting them per layer moved ~4x the bytes the path holds.
# Most paths are 2-4 deep, so 4 slots usually suffice. Each width compiles the model once
# more per row bucket: (4, 8) against (8,) trades a little time per move for a longer
# compile (both measured in bench/RESULTS.md). A search of ONE game (the engine's) reads
# every slot: its paths' keys and values are small beside the weights each step reads, and one
# width compiles the model once instead of three times (the engine compiles before readyok).
SHORT_PATHS = (4, 8)


def make_model_expand(
    model: Any,
    root_cache: KVCache,
    row_buckets: tuple[int, ...] | None = None,
    leaf_batch: int | None = None,
):
    """The ``tree_search.ExpandFn`` of a model (call inside jit; ``model`` is an AllieModel).

    ``row_buckets``: row counts (descending, the first = the batch times ``leaf_batch``) for
    which the model part is compiled; each step runs the smallest one covering ``num_active``
    rows. None: every row only. ``leaf_batch`` K: the search's leaves per game per step (rows
    b·K .. b·K + K − 1 are game b's); every bucket must then be a multiple of K. None: K is
    the first bucket over the batch size (1 without buckets), so a caller that sizes the
    buckets for B·K rows needs nothing else.
    """
    if leaf_batch is None:
        leaf_batch = max(1, (row_buckets or (0,))[0] // root_cache.batch_size)
    batch = root_cache.batch_size * leaf_batch
    root = heads_first(root_cache)  # outside the simulation loop: one transpose per move
    buckets = tuple(row_buckets or (batch,))
    if (
        buckets[0] != batch
        or list(buckets) != sorted(buckets, reverse=True)
        or any(size % leaf_batch for size in buckets)
    ):
        raise ValueError(
            f"row_buckets={buckets} must descend from {batch} rows (batch size x leaf_batch "
            f"{leaf_batch}) in multiples of leaf_batch"
        )

    def evaluate(size, width, store_k, store_v, path_nodes, path_len, action, state):
        # the rules (move, legal mask, outcome) and the model run on the first ``size`` rows
        # only, reading the first ``width`` path slots
        state = jax.tree.map(lambda x: x[:size], state)
        child = chess_jax.apply(state, action[:size])
        out, k, v = path_forward(
            model,
            action[:size],
            root,
            path_nodes[:size, :width],
            path_len[:size],
            store_k,
            store_v,
            leaf_batch,
        )
        ev = node_eval(child, out.policy_logits[:, 0], out.value[:, 0], k, v)
        pad = batch - size

        def grow(x):
            return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))

        return jax.tree.map(grow, ev) if pad else ev

    def expand(payloads, parent, path_nodes, path_len, action, num_active=None):
        rows = jnp.arange(parent.shape[0])
        game = rows if leaf_batch == 1 else rows // leaf_batch
        state = jax.tree.map(lambda x: x[game, parent], payloads["state"])
        args = (payloads["k"], payloads["v"], path_nodes, path_len, action, state)
        max_path = path_nodes.shape[1]
        short = SHORT_PATHS if root_cache.batch_size > 1 else ()
        widths = tuple(w for w in short if w < max_path) + (max_path,)
        if num_active is None:
            num_active = parent.shape[0]
        # smallest bucket >= num_active: buckets descend, so count those that still cover it
        bucket = jnp.sum(jnp.asarray(buckets) >= num_active) - 1
        longest = jnp.max(jnp.where(rows < num_active, path_len, 0))
        # the smallest width covering the longest active path: widths ascend
        wide = jnp.sum(jnp.asarray(widths[:-1]) < longest) if len(widths) > 1 else 0
        branches = [
            functools.partial(evaluate, size, width) for size in buckets for width in widths
        ]
        if len(branches) == 1:
            return branches[0](*args)
        return jax.lax.switch(bucket * len(widths) + wide, branches, *args)

    return expand


def root_eval(model: Any, state: chess_jax.ChessState, outputs_last, cache: KVCache) -> NodeEval:
    """The root's NodeEval from the prefix's last outputs; its own k/v slot is unused (zeros)."""
    cfg = model.config
    b = state.color.shape[0]
    zeros = jnp.zeros((b, cfg.num_layers, cfg.num_heads, cfg.head_dim), cache.k.dtype)
    return node_eval(state, outputs_last.policy_logits, outputs_last.value, zeros, zeros)


@dataclasses.dataclass(frozen=True)
class DecoderLeaves:
    """The decoder's ``leaves.Leaves``: the context is the root prefix's ``KVCache``."""

    def root_eval(self, model: Any, state, root_out, context: KVCache) -> NodeEval:
        return root_eval(model, state, root_out, context)

    def make_expand(self, model: Any, context: KVCache, row_buckets: tuple[int, ...]):
        return make_model_expand(model, context, row_buckets)

    def sort_context(self, context: KVCache, order, sorted_rows: bool) -> KVCache:
        return KVCache(
            leaves.take_rows(context.k, order, sorted_rows, 1),
            leaves.take_rows(context.v, order, sorted_rows, 1),
            leaves.take_rows(context.length, order, sorted_rows),
        )
