"""Whole-game attention kernels: causal within each game of a packed row, one function per kernel.

All three compute the same thing: token t of row b sees token s iff s <= t and both belong to the
same game piece (``segment_ids[b, t] == segment_ids[b, s]``; padding, segment 0, is one more
piece). They differ in what they build:

- ``xla``: a boolean ``[B, 1, T, T]`` mask when the row is packed, nothing (``is_causal``) when it
  is not; XLA fuses the mask into the softmax.
- ``cudnn``: cuDNN flash attention in its packed layout (per-row segment lengths and offsets,
  ``[B, T]`` integers), never a ``T x T`` mask. GPU only, 16-bit inputs.
- ``splash``: Pallas splash attention (TPU) with a causal mask and ``SegmentIds``; under a mesh it
  runs per device through ``shard_map`` (batch over data x fsdp, heads over tensor).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

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


def packed_lengths_and_offsets(segment_ids: Array) -> tuple[Array, Array]:
    """cuDNN's packed layout: (lengths ``[B, T]``, offsets ``[B, T + 1]``), unused entries -1.

    Segment j of row b covers tokens ``offsets[b, j] .. offsets[b, j] + lengths[b, j] - 1``; a
    segment is a maximal run of equal ids (the trailing padding run included).
    """
    b, t = segment_ids.shape
    change = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    index = jnp.cumsum(change, axis=1, dtype=jnp.int32) - 1  # segment number of each token
    rows = jnp.arange(b)[:, None]
    lengths = jnp.zeros((b, t), jnp.int32).at[rows, index].add(1)
    count = index[:, -1:] + 1  # segments per row
    slot = jnp.arange(t, dtype=jnp.int32)[None, :]
    starts = jnp.cumsum(lengths, axis=1) - lengths
    offsets = jnp.concatenate([starts, jnp.full((b, 1), t, jnp.int32)], axis=1)
    lengths = jnp.where(slot < count, lengths, -1)
    slot1 = jnp.arange(t + 1, dtype=jnp.int32)[None, :]
    offsets = jnp.where(slot1 <= count, jnp.where(slot1 == count, t, offsets), -1)
    return lengths, offsets


def cudnn_attention(q: Array, k: Array, v: Array, segment_ids: Array | None) -> Array:
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_dpa

    scale = 1.0 / math.sqrt(q.shape[-1])
    if segment_ids is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    lengths, offsets = packed_lengths_and_offsets(segment_ids)
    return cudnn_dpa(
        q,
        k,
        v,
        q_seqlen=lengths,
        kv_seqlen=lengths,
        q_offsets=offsets,
        kv_offsets=offsets,
        scale=scale,
        mask_type=MaskType.PADDING_CAUSAL,
    )


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


def game_attention(impl: str, q: Array, k: Array, v: Array, segment_ids: Array | None) -> Array:
    """Causal, per-segment attention ``[B, T, heads, head_dim]`` with the kernel ``impl``."""
    return KERNELS[impl](q, k, v, segment_ids)
