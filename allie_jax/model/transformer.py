"""Allie: a GPT-2 decoder over move tokens, soft Elo tokens, and value / time heads (Flax NNX).

Layout choices, and why:
- Attention weights are stored per head (``[embed, heads, head_dim]``) rather than GPT-2's fused
  ``c_attn`` so that sharding the ``heads`` axis never splits a query/key/value boundary; the
  converters reshape GPT-2's fused matrices.
- Every path (whole games, KV-cache extension, search paths) runs the same blocks; they differ
  only in which keys a query may see, so they agree to float32 rounding.
- Whole games go through the kernel ``config.attention_impl`` picks (``model/attention.py``:
  cuDNN flash on GPU, Pallas splash on TPU, XLA elsewhere), with segment ids rather than a mask
  where the kernel takes them. The cache and search paths, whose keys are not one causal row, go
  through ``jax.nn.dot_product_attention`` with an explicit boolean mask.
- Dropout sits where GPT-2 (and the released trainer) put it: after the embeddings
  (``embd_pdrop``), on the residual branches (``resid_pdrop``) and, with the XLA kernel, on the
  attention probabilities (``attn_pdrop``, off unless set: the flash kernels have none).
- Layers are kept one Block per layer (``blocks``) or, with ``config.scan_layers``, as one Block
  whose parameters carry a leading layer axis (``layers``, ``model/layer_layout.py``): whole games
  then run as one ``nnx.scan``, so 24 or 36 layers trace and compile like one. Per-layer paths
  (KV cache, search) read ``layer_blocks()``, which is the same Blocks in either layout.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from allie_jax import vocab
from allie_jax.model import attention as attn
from allie_jax.model import sharding as sh
from allie_jax.model.config import ModelConfig
from allie_jax.model.kv_cache import KVCache
from allie_jax.thread_flag import ThreadFlag

Array = jax.Array


def _dtype_name(dtype) -> str:
    return jnp.dtype(dtype).name


# What the backward pass keeps of each block (``config.remat``); the rest is recomputed.
REMAT_POLICY = {
    "none": None,
    "full": None,  # nothing saved but the block's input
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}


@flax.struct.dataclass
class ModelOutputs:
    """Per-position predictions; ``time`` is normalised (seconds via game.denormalize_think_time)."""

    policy_logits: Array  # float32 [B, T, vocab_size]
    time: Array  # float32 [B, T]
    value: Array  # float32 [B, T], tanh, White's view


_SHAPES_ONLY = ThreadFlag()


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Within it (this thread), ``param`` makes zeros instead of drawing from its initializer.

    For an ``nnx.eval_shape`` whose values are thrown away (a checkpoint's abstract tree): each
    initializer call advances the Rngs' counter, a traced value that flax then asks for its
    sharding, and JAX's answer (an error message) walks the whole trace so far, so tracing a
    model's random init grows with the square of its parameter count (~1 s of every 124M load).
    Names, shapes, dtypes and sharding metadata are the same; the random streams are not
    advanced (a loaded model's are given fresh keys anyway).
    """
    with _SHAPES_ONLY.raised():
        yield


def param(
    rngs: nnx.Rngs,
    init,
    shape: Sequence[int],
    names: sh.AxisNames,
    dtype,
) -> nnx.Param:
    """A parameter tagged with logical axis names (no eager sharding: the mesh is the trainer's)."""
    if _SHAPES_ONLY.on:
        value = jnp.zeros(tuple(shape), dtype)
    else:
        value = init(rngs.params(), tuple(shape), dtype)
    return nnx.Param(
        value,
        out_sharding=tuple(names),
        eager_sharding=False,
    )


_normal = jax.nn.initializers.normal
_zeros = jax.nn.initializers.zeros
_ones = jax.nn.initializers.ones


class LayerNorm(nnx.Module):
    """GPT-2 LayerNorm, statistics in float32 whatever the computation dtype."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, pd = cfg.embed_dim, cfg.parameter_dtype
        self.scale = param(rngs, _ones, (d,), (sh.EMBED,), pd)
        self.bias = param(rngs, _zeros, (d,), (sh.EMBED,), pd)
        self.eps = cfg.layer_norm_eps
        self.dtype = cfg.compute_dtype

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


class Attention(nnx.Module):
    """Multi-head attention; projection and attention are split so callers choose the keys."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, n, h, pd = cfg.embed_dim, cfg.num_heads, cfg.head_dim, cfg.parameter_dtype
        w = _normal(0.02)
        self.query = param(rngs, w, (d, n, h), (sh.EMBED, sh.HEADS, sh.HEAD_DIM), pd)
        self.key = param(rngs, w, (d, n, h), (sh.EMBED, sh.HEADS, sh.HEAD_DIM), pd)
        self.value = param(rngs, w, (d, n, h), (sh.EMBED, sh.HEADS, sh.HEAD_DIM), pd)
        self.query_bias = param(rngs, _zeros, (n, h), (sh.HEADS, sh.HEAD_DIM), pd)
        self.key_bias = param(rngs, _zeros, (n, h), (sh.HEADS, sh.HEAD_DIM), pd)
        self.value_bias = param(rngs, _zeros, (n, h), (sh.HEADS, sh.HEAD_DIM), pd)
        # GPT-2 scales residual projections by 1/sqrt(2 · layers) at init.
        w_out = _normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.out = param(rngs, w_out, (n, h, d), (sh.HEADS, sh.HEAD_DIM, sh.EMBED), pd)
        self.out_bias = param(rngs, _zeros, (d,), (sh.EMBED,), pd)
        self.dtype = cfg.compute_dtype
        # Masked paths (cache, search) only use cuDNN when asked for explicitly.
        self.impl = "cudnn" if cfg.attention_impl == "cudnn" else "xla"
        self.games_impl = cfg.attention_impl
        self.max_segments = cfg.max_segments_per_row
        # GPT-2's attn_pdrop, on the attention probabilities of whole games (XLA kernel only;
        # ModelConfig.check_attention_dropout refuses the others before a run starts).
        rate = cfg.attention_dropout
        self.prob_dropout = nnx.Dropout(rate, rngs=rngs) if rate > 0 else None

    def project(self, x: Array) -> tuple[Array, Array, Array]:
        """Queries, keys, values ``[B, T, heads, head_dim]``."""
        dt = self.dtype

        def proj(w: nnx.Param, b: nnx.Param) -> Array:
            y = jnp.einsum("btd,dnh->btnh", x, w[...].astype(dt)) + b[...].astype(dt)
            return sh.constrain(y, (sh.BATCH, sh.LENGTH, sh.HEADS, sh.HEAD_DIM))

        return (
            proj(self.query, self.query_bias),
            proj(self.key, self.key_bias),
            proj(self.value, self.value_bias),
        )

    def attend(self, q: Array, k: Array, v: Array, mask: Array) -> Array:
        """``mask``: bool ``[B, 1, T, S]``, True where query t may see key s."""
        dt = self.dtype
        out = jax.nn.dot_product_attention(
            q, k.astype(dt), v.astype(dt), mask=mask, implementation=self.impl
        )
        return self.output(out)

    def attend_games(
        self,
        q: Array,
        k: Array,
        v: Array,
        segment_ids: Array | None,
        deterministic: bool = True,
    ) -> Array:
        """Causal attention within each segment of the row (no segments: plain causal)."""
        impl = self.games_impl
        if impl == "auto":
            impl = self.resolved_impl()
        if self.prob_dropout is not None and not deterministic:
            drop = lambda p: self.prob_dropout(p, deterministic=False)  # noqa: E731
            return self.output(attn.xla_attention_with_dropout(q, k, v, segment_ids, drop))
        return self.output(
            attn.game_attention(impl, q, k, v, segment_ids, max_segments=self.max_segments)
        )

    def resolved_impl(self) -> str:
        return ModelConfig(
            dtype=_dtype_name(self.dtype), attention_impl="auto"
        ).resolved_attention_impl(jax.default_backend())

    def output(self, out: Array) -> Array:
        dt = self.dtype
        out = sh.constrain(out, (sh.BATCH, sh.LENGTH, sh.HEADS, sh.HEAD_DIM))
        y = jnp.einsum("btnh,nhd->btd", out, self.out[...].astype(dt))
        return y + self.out_bias[...].astype(dt)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, f, pd = cfg.embed_dim, cfg.hidden_dim, cfg.parameter_dtype
        self.fc = param(rngs, _normal(0.02), (d, f), (sh.EMBED, sh.MLP), pd)
        self.fc_bias = param(rngs, _zeros, (f,), (sh.MLP,), pd)
        w_out = _normal(0.02 / math.sqrt(2 * cfg.num_layers))
        self.proj = param(rngs, w_out, (f, d), (sh.MLP, sh.EMBED), pd)
        self.proj_bias = param(rngs, _zeros, (d,), (sh.EMBED,), pd)
        self.dtype = cfg.compute_dtype

    def __call__(self, x: Array) -> Array:
        dt = self.dtype
        h = x @ self.fc[...].astype(dt) + self.fc_bias[...].astype(dt)
        h = sh.constrain(jax.nn.gelu(h, approximate=True), (sh.BATCH, sh.LENGTH, sh.MLP))
        return h @ self.proj[...].astype(dt) + self.proj_bias[...].astype(dt)


class Block(nnx.Module):
    """Pre-LN GPT-2 block."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.ln_1 = LayerNorm(cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.ln_2 = LayerNorm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)
        self.dropout = nnx.Dropout(cfg.residual_dropout, rngs=rngs)  # GPT-2's resid_pdrop

    def attention_inputs(self, x: Array) -> tuple[Array, Array, Array]:
        return self.attn.project(self.ln_1(x))

    def finish(
        self, x: Array, q: Array, k: Array, v: Array, mask: Array, deterministic: bool
    ) -> Array:
        """The rest of the block once the caller has chosen the keys ``k, v`` and their mask."""
        return self._rest(x, self.attn.attend(q, k, v, mask), deterministic)

    def after_attention(self, x: Array, attended: Array, deterministic: bool) -> Array:
        """Residual and MLP once the attention output (projected, in ``x``'s layout) is known:
        for callers that lay attention out apart from the residual stream (the evaluator's
        packed pass runs the per-token layers on packed tokens, attention on per-game rows)."""
        return self._rest(x, attended, deterministic)

    def _rest(self, x: Array, attended: Array, deterministic: bool) -> Array:
        x = x + self.dropout(attended, deterministic=deterministic)
        x = x + self.dropout(self.mlp(self.ln_2(x)), deterministic=deterministic)
        return sh.constrain(x, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))

    def __call__(self, x: Array, segment_ids: Array | None, deterministic: bool) -> Array:
        """One block over whole (packed) games."""
        q, k, v = self.attention_inputs(x)
        attended = self.attn.attend_games(q, k, v, segment_ids, deterministic)
        return self._rest(x, attended, deterministic)


# The layer axis of stacked parameters has no logical name: it is never sharded (each step of
# the scan reads one whole layer), so its PartitionSpec entry is None.
LAYER_AXIS_METADATA = {nnx.PARTITION_NAME: None}


def stacked_blocks(cfg: ModelConfig, rngs: nnx.Rngs) -> Block:
    """``cfg.num_layers`` Blocks as one, each parameter with a leading layer axis.

    Built by ``nnx.vmap`` over split rngs (Flax's scan-over-layers idiom), so every layer gets
    its own initial weights and its own dropout stream, and the sharding metadata gains the
    leading ``None`` the trainer's ``state_shardings`` needs.
    """

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata=LAYER_AXIS_METADATA)
    def make(rngs: nnx.Rngs) -> Block:
        return Block(cfg, rngs)

    return make(rngs)


def layer_views(stacked: Block, num_layers: int) -> list[Block]:
    """Each layer of a stacked Block as a plain Block (a slice of its state; works inside jit).

    The views are copies: what one changes (a dropout counter) does not reach ``stacked``. Their
    sharding metadata loses the layer axis, so each reads like an unrolled layer's. The stack is
    split once and sliced per layer.
    """
    graphdef, state = nnx.split(stacked)

    def drop_layer_axis(v: nnx.Variable) -> nnx.Variable:
        names = v.get_metadata().get("out_sharding")
        if names:
            v.set_metadata(out_sharding=tuple(names[1:]))
        return v

    def view(i: int) -> Block:
        sliced = jax.tree.map(lambda x: x[i], state)
        sliced = jax.tree.map(
            drop_layer_axis, sliced, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )
        return nnx.merge(graphdef, sliced)

    return [view(i) for i in range(num_layers)]


def soft_elo(elo: Array, table: Array) -> Array:
    """The soft Elo token ``a·E_strong + (1 − a)·E_weak`` (released Allie's rule, one place).

    ``a`` is the Elo clipped to [500, 3000] and scaled to [0, 1]; ``table`` is ``[2, d]`` with the
    strong end in row 0. The board-state transformer uses the same rule for its Elo tokens.
    """
    a = (jnp.clip(elo, vocab.MIN_ELO, vocab.MAX_ELO) - vocab.MIN_ELO) / (
        vocab.MAX_ELO - vocab.MIN_ELO
    )
    a = a.astype(jnp.float32)[..., None]
    return a * table[0] + (1.0 - a) * table[1]


def positions_from_segments(segment_ids: Array) -> Array:
    """Positions restarting at 0 wherever the segment id changes (packed rows)."""
    t = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    prev = jnp.concatenate([segment_ids[:, :1] - 1, segment_ids[:, :-1]], axis=1)
    start = jnp.where(segment_ids != prev, t, 0)
    return t - jax.lax.cummax(start, axis=1)


class AllieModel(nnx.Module):
    """GPT-2 + soft Elo tokens + policy (tied) / value (tanh) / think-time heads."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        cfg = self.config = config
        d, pd = cfg.embed_dim, cfg.parameter_dtype
        self.wte = param(rngs, _normal(0.02), (cfg.vocab_size, d), (sh.VOCAB, sh.EMBED), pd)
        self.wpe = param(rngs, _normal(0.01), (cfg.max_len, d), (None, sh.EMBED), pd)
        # Row 0 is the strong end (weight a), row 1 the weak end (1 − a), as in the released code.
        self.elo_embed = param(rngs, _normal(0.02), (2, d), (None, sh.EMBED), pd)
        self.embed_dropout = nnx.Dropout(cfg.embedding_dropout, rngs=rngs)  # GPT-2's embd_pdrop
        if cfg.scan_layers:
            self.layers = stacked_blocks(cfg, rngs)  # layers.attn.query[i] = blocks.{i}.attn.query
        else:
            self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.ln_f = LayerNorm(cfg, rngs)
        self.value_head = param(rngs, _normal(0.02), (d, 1), (sh.EMBED, None), pd)
        self.value_bias = param(rngs, _zeros, (1,), (None,), pd)
        self.time_head = param(rngs, _normal(0.02), (d, 1), (sh.EMBED, None), pd)
        self.time_bias = param(rngs, _zeros, (1,), (None,), pd)

    # ------------------------------------------------------------------ pieces shared by all paths
    def layer_blocks(self) -> list[Block]:
        """One Block per layer, in order, whatever the layout: the unrolled Blocks themselves, or
        views of the stacked one (``layer_views``) for the per-layer paths (cache, search)."""
        if self.config.scan_layers:
            return layer_views(self.layers, self.config.num_layers)
        return list(self.blocks)

    def embed(self, tokens: Array, positions: Array, deterministic: bool = True) -> Array:
        """Token (or soft Elo) embedding plus learned position; Elo ids are ``elo + vocab_size``."""
        cfg = self.config
        tokens = tokens.astype(jnp.int32)
        tok = self.wte[...][jnp.clip(tokens, 0, cfg.vocab_size - 1)]
        elo = soft_elo(tokens - cfg.vocab_size, self.elo_embed[...])
        x = jnp.where((tokens >= cfg.vocab_size)[..., None], elo, tok)
        x = x + self.wpe[...][jnp.clip(positions, 0, cfg.max_len - 1)]
        x = self.embed_dropout(x, deterministic=deterministic)
        return sh.constrain(x.astype(cfg.compute_dtype), (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))

    def heads(self, x: Array) -> ModelOutputs:
        """Final LayerNorm, tied policy logits and the two scalar heads, all returned in float32."""
        h = self.ln_f(x)
        logits = jnp.einsum(
            "btd,vd->btv",
            h,
            self.wte[...].astype(h.dtype),
            preferred_element_type=jnp.float32,
        )
        logits = sh.constrain(logits, (sh.BATCH, sh.LENGTH, sh.VOCAB))
        h32 = h.astype(jnp.float32)
        value = jnp.tanh(h32 @ self.value_head[...] + self.value_bias[...])[..., 0]
        time = (h32 @ self.time_head[...] + self.time_bias[...])[..., 0]
        return ModelOutputs(policy_logits=logits, time=time, value=value)

    def decode_one(
        self, tokens: Array, positions: Array, attend: Callable[..., Array]
    ) -> tuple[ModelOutputs, Array, Array]:
        """One new token per row (``tokens``, ``positions``: int [b]) through every layer, whose
        attention ``attend(layer, q, k, v)`` ([b, heads, head_dim] each, returns the same shape)
        computes over whatever keys the caller keeps: the search's root cache, the node's path
        and the token itself. Returns the outputs at the token and its keys / values
        [b, layers, heads, head_dim]."""
        b = tokens.shape[0]
        dt = self.config.compute_dtype
        x = self.embed(tokens[:, None], positions[:, None])
        new_k, new_v = [], []
        for i, block in enumerate(self.layer_blocks()):
            q, k, v = block.attention_inputs(x)
            out = attend(i, q[:, 0], k[:, 0], v[:, 0]).astype(dt)
            # one [b, heads·hd] x [heads·hd, d] product: written as "bnh,nhd->bd", XLA on CPU
            # re-laid the [heads, hd, d] weights out at every call (once per layer per step)
            w_out = block.attn.out[...].astype(dt)
            y = out.reshape(b, -1) @ w_out.reshape(-1, w_out.shape[-1])
            y = y + block.attn.out_bias[...].astype(dt)
            x = x + y[:, None]
            x = x + block.mlp(block.ln_2(x))
            new_k.append(k[:, 0])
            new_v.append(v[:, 0])
        return self.heads(x), jnp.stack(new_k, 1), jnp.stack(new_v, 1)

    # ------------------------------------------------------------------ (a) whole games
    def __call__(
        self,
        tokens: Array,
        *,
        positions: Array | None = None,
        segment_ids: Array | None = None,
        deterministic: bool = True,
    ) -> ModelOutputs:
        """One causal pass; with ``segment_ids`` packed games never attend to each other."""
        b, t = tokens.shape
        if positions is None:
            positions = (
                jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
                if segment_ids is None
                else positions_from_segments(segment_ids)
            )
        x = self.embed(tokens, positions, deterministic)

        def run_block(block: Block, x: Array) -> Array:
            return block(x, segment_ids, deterministic)

        policy = REMAT_POLICY[self.config.remat]
        if self.config.remat != "none":
            run_block = nnx.remat(run_block, policy=policy)
        if self.config.scan_layers:
            # One traced layer; each step reads row i of every stacked parameter and advances
            # that layer's own dropout stream (the Block's state is scanned over, not carried).
            scan = nnx.scan(
                run_block,
                in_axes=(0, nnx.Carry),
                out_axes=nnx.Carry,
                transform_metadata=LAYER_AXIS_METADATA,
            )
            x = scan(self.layers, x)
        else:
            for block in self.blocks:
                x = run_block(block, x)
        return self.heads(x)

    # ------------------------------------------------------------------ (b) KV cache
    def init_cache(self, batch_size: int, max_len: int | None = None, dtype=None) -> KVCache:
        cfg = self.config
        return KVCache.zeros(
            num_layers=cfg.num_layers,
            batch_size=batch_size,
            max_len=max_len or cfg.max_len,
            num_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            dtype=dtype or cfg.compute_dtype,
        )

    def extend(
        self,
        tokens: Array,
        cache: KVCache,
        num_new: Array | None = None,
        *,
        last_only: bool = False,
    ) -> tuple[ModelOutputs, KVCache]:
        """Append each row's first ``num_new[b]`` tokens at positions ``length[b]...``.

        Outputs at columns ``>= num_new[b]`` are meaningless (their keys are never written).
        Writes past the cache's end are dropped rather than clamped onto earlier entries.

        ``last_only``: outputs only at each row's last new token (shape [B, 1, ...]), as a
        search's root needs. The last block then runs its attention output and MLP, and the
        heads their [d, vocab] projection, on that token alone: the other tokens' keys and
        values are all the cache keeps, and those two were ~30% of a small model's prefill.
        """
        b, s = tokens.shape
        m = cache.max_len
        if num_new is None:
            num_new = jnp.full((b,), s, jnp.int32)
        num_new = jnp.asarray(num_new, jnp.int32)
        offsets = jnp.arange(s, dtype=jnp.int32)[None, :]
        positions = cache.length[:, None] + offsets  # [B, S]
        write = jnp.where(offsets < num_new[:, None], positions, m)  # m: out of bounds -> dropped
        rows = jnp.arange(b)[:, None]
        mask = (jnp.arange(m)[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, S, M]
        x = self.embed(tokens, positions)
        ks, vs = cache.k, cache.v
        blocks = self.layer_blocks()
        last = len(blocks) - 1
        for i, block in enumerate(blocks):
            q, k, v = block.attention_inputs(x)
            ks = ks.at[i, rows, write].set(k.astype(ks.dtype), mode="drop")
            vs = vs.at[i, rows, write].set(v.astype(vs.dtype), mode="drop")
            if last_only and i == last:
                col = jnp.maximum(num_new - 1, 0)[:, None]  # [B, 1]: each row's last new token
                x, q = x[rows, col], q[rows, col]
                mask = jnp.take_along_axis(mask, col[:, None, :, None], axis=2)
            x = block.finish(x, q, ks[i], vs[i], mask, True)
        return self.heads(x), KVCache(ks, vs, cache.length + num_new)

    def extend_with_path(
        self,
        tokens: Array,
        root_cache: KVCache,
        path_k: Array,
        path_v: Array,
        path_len: Array,
    ) -> tuple[ModelOutputs, Array, Array]:
        """Evaluate ``tokens`` after root prefix + per-row path, writing nothing to the root.

        Position of token i in row b: ``root.length[b] + path_len[b] + i``. Returns the new keys
        and values ``[num_layers, B, S, heads, head_dim]`` so the caller can grow the path.
        """
        b, s = tokens.shape
        m, p = root_cache.max_len, path_k.shape[2]
        path_len = jnp.asarray(path_len, jnp.int32)
        positions = (root_cache.length + path_len)[:, None] + jnp.arange(s, dtype=jnp.int32)[None]
        root_mask = jnp.arange(m)[None, :] < root_cache.length[:, None]  # [B, M]
        path_mask = jnp.arange(p)[None, :] < path_len[:, None]  # [B, P]
        self_mask = jnp.tril(jnp.ones((s, s), bool))
        mask = jnp.concatenate(
            [
                jnp.broadcast_to(root_mask[:, None, :], (b, s, m)),
                jnp.broadcast_to(path_mask[:, None, :], (b, s, p)),
                jnp.broadcast_to(self_mask[None], (b, s, s)),
            ],
            axis=-1,
        )[:, None]
        x = self.embed(tokens, positions)
        new_k, new_v = [], []
        for i, block in enumerate(self.layer_blocks()):
            q, k, v = block.attention_inputs(x)
            dt = q.dtype
            keys = jnp.concatenate([root_cache.k[i].astype(dt), path_k[i].astype(dt), k], axis=1)
            values = jnp.concatenate([root_cache.v[i].astype(dt), path_v[i].astype(dt), v], axis=1)
            x = block.finish(x, q, keys, values, mask, True)
            new_k.append(k.astype(root_cache.k.dtype))
            new_v.append(v.astype(root_cache.v.dtype))
        return self.heads(x), jnp.stack(new_k), jnp.stack(new_v)


def count_params(config: ModelConfig) -> int:
    """Number of parameters, computed from shapes only (nothing is allocated)."""
    abstract = nnx.eval_shape(lambda: AllieModel(config, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    return int(sum(math.prod(x.shape) for x in leaves))
