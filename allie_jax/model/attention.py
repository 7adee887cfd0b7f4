"""Whole-game attention kernels: causal within each game of a packed row, one function per kernel.

All three compute the same thing: token t of row b sees token s iff s <= t and both belong to the
same game piece (``segment_ids[b, t] == segment_ids[b, s]``; padding, segment 0, is one more
piece). They differ in what they build:

- ``xla``: a boolean ``[B, 1, T, T]`` mask when the row is packed, nothing (``is_causal``) when it
  is not; XLA fuses the mask into the softmax.
- ``cudnn``: cuDNN flash attention in JAX's packed layout (per-row segment lengths ``[B, M]`` and
  starts ``[B, M + 1]`` for a static maximum of ``M`` segments per row), never a ``T x T`` mask.
  GPU only, 16-bit inputs.
- ``splash``: Pallas splash attention (TPU) with a causal mask and ``SegmentIds``; under a mesh it
  runs per device through ``shard_map`` (batch over data x fsdp, heads over tensor).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from allie_jax import compat
from allie_jax.model import sharding as sh

Array = jax.Array


def segment_mask(segment_ids: Array) -> Array:
    """bool ``[B, 1, T, T]``: causal and within the same segment."""
    t = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal[None] & same)[:, None]


def xla_attention(q: Array, k: Array, v: Array, segment_ids: Array | None) -> Array:
    if segment_ids is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    return jax.nn.dot_product_attention(
        q, k, v, mask=segment_mask(segment_ids), implementation="xla"
    )


def xla_attention_with_dropout(
    q: Array, k: Array, v: Array, segment_ids: Array | None, dropout: Callable[[Array], Array]
) -> Array:
    """Softmax attention with ``dropout`` on the probabilities (GPT-2's ``attn_pdrop``).

    Written out (scores, float32 softmax, dropout, weighted values) because no fused kernel
    here drops attention probabilities; used only in training with ``attn_pdrop > 0``.
    """
    t = q.shape[1]
    if segment_ids is None:
        mask = jnp.tril(jnp.ones((t, t), bool))[None, None]
    else:
        mask = segment_mask(segment_ids)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = dropout(jax.nn.softmax(scores, axis=-1)).astype(v.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs, v)


# Segments per packed row the cuDNN kernel is compiled for (``ModelConfig.max_segments_per_row``
# overrides it). cuDNN keeps float32 softmax statistics for every segment slot of every row, so
# the slot count is memory: 32 slots cost 1/16 of T = 512. The packer never puts more than
# ``max_segments_per_row - 1`` games in a row (one slot stays for the padding run).
DEFAULT_MAX_SEGMENTS = 32


def segment_starts(segment_ids: Array) -> Array:
    """bool ``[B, T]``: True where a segment (a maximal run of equal ids) begins."""
    b = segment_ids.shape[0]
    return jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )


def packed_lengths_and_offsets(segment_ids: Array, max_segments: int) -> tuple[Array, Array]:
    """JAX's packed cuDNN layout: (lengths ``[B, M]``, offsets ``[B, M + 1]``), ``M = max_segments``.

    Segment j of row b covers tokens ``offsets[b, j] .. offsets[b, j] + lengths[b, j] - 1``
    (within its row); unused entries are -1, and the last offset column is always -1. This is
    the layout of the docstring of JAX's cuDNN ``dot_product_attention`` (segment *starts*, then
    -1: ``[[0, 1, 2, -1], [0, 1, -1, -1]]`` for rows of 3 and 2 one-token segments), which JAX
    compacts across the batch before calling cuDNN: an end entry would be read as the start of
    the next row's first segment. A segment is a maximal run of equal ids (the trailing padding
    run included, so its outputs are defined). Rows with more than ``M`` segments do not fit:
    ``segments_per_row`` tells the caller.
    """
    b, t = segment_ids.shape
    m = int(max_segments)
    index = jnp.cumsum(segment_starts(segment_ids), axis=1, dtype=jnp.int32) - 1
    rows = jnp.arange(b)[:, None]
    tokens = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    # Segment numbers >= M are dropped (mode="drop"): such rows are flagged by the caller.
    lengths = jnp.zeros((b, m), jnp.int32).at[rows, index].add(1, mode="drop")
    starts = jnp.full((b, m), t, jnp.int32).at[rows, index].min(tokens, mode="drop")
    count = jnp.minimum(index[:, -1:] + 1, m)
    slot = jnp.arange(m, dtype=jnp.int32)[None, :]
    used = slot < count
    lengths = jnp.where(used, lengths, -1)
    offsets = jnp.concatenate([jnp.where(used, starts, -1), jnp.full((b, 1), -1, jnp.int32)], 1)
    return lengths, offsets


def segments_per_row(segment_ids: Array) -> Array:
    """int ``[B]``: the number of segments (maximal runs of equal ids) in each row."""
    return jnp.sum(segment_starts(segment_ids), axis=1, dtype=jnp.int32)


def cudnn_attention(
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array | None,
    *,
    max_segments: int = DEFAULT_MAX_SEGMENTS,
) -> Array:
    """cuDNN flash attention over packed rows; a row with more than ``max_segments`` segments
    comes out as NaN (so the loss check stops the run) rather than attending across games."""
    cudnn_dpa, mask_type = compat.cudnn_fused_attention()
    scale = 1.0 / math.sqrt(q.shape[-1])
    if segment_ids is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    lengths, offsets = packed_lengths_and_offsets(segment_ids, max_segments)
    out = cudnn_dpa(
        q,
        k,
        v,
        q_seqlen=lengths,
        kv_seqlen=lengths,
        q_offsets=offsets,
        kv_offsets=offsets,
        scale=scale,
        mask_type=mask_type.PADDING_CAUSAL,
    )
    overflow = segments_per_row(segment_ids) > max_segments
    return jnp.where(overflow[:, None, None, None], jnp.nan, out).astype(out.dtype)


def _splash_per_device(q, k, v, segment_ids, *, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    _, t, n, h = q.shape
    block = min(512, t)
    mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(n)])
    sizes = sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    kernel = sk.make_splash_mha(
        mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret
    )
    # Splash takes [heads, T, head_dim] per example and does not scale the queries itself.
    qh = jnp.swapaxes(q * (1.0 / math.sqrt(h)), 1, 2)
    kh, vh = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    if segment_ids is None:
        segment_ids = jnp.zeros(q.shape[:2], jnp.int32)
    segs = sk.SegmentIds(q=segment_ids, kv=segment_ids)
    out = jax.vmap(kernel)(qh, kh, vh, segment_ids=segs)
    return jnp.swapaxes(out, 1, 2)


def splash_attention(
    q: Array, k: Array, v: Array, segment_ids: Array | None, *, interpret: bool = False
) -> Array:
    import functools

    fn = functools.partial(_splash_per_device, interpret=interpret)
    mesh, rules = sh.active_mesh_and_rules()
    if mesh is None:
        return fn(q, k, v, segment_ids)
    batch = sh.logical_to_spec((sh.BATCH,), rules)[0]
    heads = sh.logical_to_spec((sh.HEADS,), rules)[0]
    qkv = PartitionSpec(batch, None, heads, None)
    seg = PartitionSpec(batch, None)
    if segment_ids is None:
        segment_ids = jnp.zeros(q.shape[:2], jnp.int32)
    return jax.shard_map(
        fn, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv, check_vma=False
    )(q, k, v, segment_ids)


KERNELS = {"xla": xla_attention, "cudnn": cudnn_attention, "splash": splash_attention}


def game_attention(
    impl: str,
    q: Array,
    k: Array,
    v: Array,
    segment_ids: Array | None,
    *,
    max_segments: int = DEFAULT_MAX_SEGMENTS,
) -> Array:
    """Causal, per-segment attention ``[B, T, heads, head_dim]`` with the kernel ``impl``."""
    if impl == "cudnn":
        return cudnn_attention(q, k, v, segment_ids, max_segments=max_segments)
    return KERNELS[impl](q, k, v, segment_ids)
