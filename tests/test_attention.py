"""Whole-game attention kernels and memory settings reachable from the config.

On CPU: the kernel choice per backend, the XLA path against a hand-written softmax attention,
cuDNN's packed layout (segment lengths/offsets) as JAX's own compaction reads it,
Pallas splash attention (interpret mode) against XLA, and remat policies against no remat.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from allie_jax import compat
from allie_jax.data.synthetic import synthetic_batch
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.model import attention as A
from allie_jax.model.losses import loss_fn


def _qkv(b=2, t=64, n=2, h=16, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32) for _ in range(3)]


def _segments(t=64):
    seg = np.ones((2, t), np.int32)
    seg[0, 20:] = 2
    seg[0, 45:] = 0  # padding tail
    seg[1, 33:] = 2
    seg[1, 34:] = 3  # a one-token game piece
    return seg


def _reference(q, k, v, seg):
    """softmax(q k^T / sqrt(h)) v over keys s <= t of the same segment (numpy, float64)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, n, h = q.shape
    out = np.zeros_like(q)
    for i in range(b):
        for j in range(t):
            keys = [s for s in range(j + 1) if seg[i, s] == seg[i, j]]
            logits = np.einsum("nh,snh->ns", q[i, j], k[i, keys]) / np.sqrt(h)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            out[i, j] = np.einsum("ns,snh->nh", w, v[i, keys])
    return out


def test_auto_picks_the_kernel_per_backend():
    bf16 = ModelConfig(dtype="bfloat16")
    assert bf16.resolved_attention_impl("gpu") == "cudnn"
    assert ModelConfig().resolved_attention_impl("gpu") == "xla"  # cuDNN flash needs 16-bit
    assert bf16.resolved_attention_impl("tpu") == "splash"
    assert bf16.resolved_attention_impl("cpu") == "xla"
    assert ModelConfig(attention_impl="xla").resolved_attention_impl("gpu") == "xla"
    # Older config.json spellings still load.
    assert ModelConfig(attention_impl=None).attention_impl == "auto"
    assert ModelConfig(remat=True).remat == "full" and ModelConfig(remat=False).remat == "none"
    with pytest.raises(ValueError, match="attention_impl"):
        ModelConfig(attention_impl="flash")
    with pytest.raises(ValueError, match="remat"):
        ModelConfig(remat="some")


def test_xla_path_equals_softmax_attention_per_segment():
    q, k, v = _qkv()
    seg = _segments()
    np.testing.assert_allclose(
        np.asarray(A.xla_attention(q, k, v, jnp.asarray(seg))),
        _reference(q, k, v, seg),
        atol=2e-5,
    )
    # No segments: is_causal (no mask built) equals one segment per row.
    ones = np.ones_like(seg)
    np.testing.assert_allclose(
        np.asarray(A.xla_attention(q, k, v, None)), _reference(q, k, v, ones), atol=2e-5
    )


def _runs(seg_row: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of equal ids, read in plain Python."""
    runs, start = [], 0
    for t in range(1, len(seg_row) + 1):
        if t == len(seg_row) or seg_row[t] != seg_row[t - 1]:
            runs.append((start, t - start))
            start = t
    return runs


def _packed_rows(t: int = 48) -> np.ndarray:
    """Four packed rows of several games each (8+ segments in all), padding tails included."""
    seg = np.zeros((4, t), np.int32)
    seg[0, :16], seg[0, 16:31], seg[0, 31:40] = 1, 2, 3  # three games, padding
    seg[1, :t] = 1  # one game filling the row
    seg[2, :5], seg[2, 5:6], seg[2, 6:32], seg[2, 32:47] = 1, 2, 3, 4  # a one-token game
    seg[3, :20], seg[3, 20:] = 1, 2  # two games, no padding
    return seg


def test_cudnn_packed_layout_is_jaxs_layout():
    """Our lengths/offsets, compacted by JAX's own ``_fix_seqlen_offsets`` (what runs before the
    cuDNN call), put every segment of every row exactly on its own tokens of the flat batch."""
    seg = _packed_rows()
    b, t = seg.shape
    n, h = 2, 8
    max_segments = 6
    lengths, offsets = A.packed_lengths_and_offsets(jnp.asarray(seg), max_segments)
    assert lengths.shape == (b, max_segments) and offsets.shape == (b, max_segments + 1)
    # JAX's docstring layout: segment starts, then -1 (never an end entry).
    for row in range(b):
        runs = _runs(seg[row])
        m = len(runs)
        assert list(np.asarray(offsets[row, :m])) == [s for s, _ in runs]
        assert (np.asarray(offsets[row, m:]) == -1).all()
        assert list(np.asarray(lengths[row, :m])) == [k for _, k in runs]
        assert (np.asarray(lengths[row, m:]) == -1).all()
    q = jnp.zeros((b, t, n, h), jnp.bfloat16)
    q_len, _, q_off, _ = compat.cudnn_fix_seqlen_offsets(lengths, lengths, offsets, offsets, q, q)
    q_len, q_off = np.asarray(q_len).ravel(), np.asarray(q_off).ravel()
    expected = [(row, s, k) for row in range(b) for s, k in _runs(seg[row])]
    assert len(expected) >= 8
    for j, (row, start, length) in enumerate(expected):
        flat_start = int(q_off[j]) // (n * h)  # JAX multiplies offsets by the token stride
        assert (flat_start, int(q_len[j])) == (row * t + start, length), (j, row, start)
        tokens = seg.ravel()[flat_start : flat_start + length]
        assert (tokens == seg[row, start]).all()
    assert (q_len[len(expected) :] == 0).all()  # JAX's fill for unused slots


def test_cudnn_rows_over_the_segment_limit_are_flagged():
    seg = _packed_rows()
    counts = np.asarray(A.segments_per_row(jnp.asarray(seg)))
    assert list(counts) == [len(_runs(r)) for r in seg] == [4, 1, 5, 2]
    lengths, offsets = A.packed_lengths_and_offsets(jnp.asarray(seg), 4)
    # Row 2 has 5 segments: only 4 fit, the kernel's caller turns that row into NaN.
    assert list(np.asarray(offsets[2])) == [0, 5, 6, 32, -1]


@pytest.mark.parametrize("with_segments", [True, False])
def test_splash_kernel_equals_xla(with_segments):
    """Pallas splash attention in interpret mode (the TPU kernel's program, run on CPU)."""
    q, k, v = _qkv(t=128, seed=1)
    seg = jnp.asarray(_segments(128)) if with_segments else None

    def loss(impl, q, k, v):
        out = impl(q, k, v, seg)
        return jnp.sum(out * jnp.cos(out)), out

    splash = lambda q, k, v, s: A.splash_attention(q, k, v, s, interpret=True)  # noqa: E731
    (_, out_s), g_s = jax.value_and_grad(lambda *a: loss(splash, *a), (0, 1, 2), has_aux=True)(
        q, k, v
    )
    (_, out_x), g_x = jax.value_and_grad(
        lambda *a: loss(A.xla_attention, *a), (0, 1, 2), has_aux=True
    )(q, k, v)
    np.testing.assert_allclose(np.asarray(out_s), np.asarray(out_x), atol=1e-5)
    for a, b in zip(g_s, g_x, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_remat_policies_give_the_same_gradients():
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(2, 32, seed=5).items()}
    batch["segment_ids"] = jnp.asarray(_segments(32))

    def grads(remat):
        config = ModelConfig(num_layers=1, dropout=0.0, remat=remat)
        model = AllieModel(config, rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss_of(params, rest):
            m = nnx.merge(graphdef, params, rest, copy=True)
            out = m(batch["inputs"], segment_ids=batch["segment_ids"])
            return loss_fn(out, batch)[0]

        return jax.tree.leaves(jax.jit(jax.grad(loss_of))(params, rest))

    # "full" is checked in test_model (remat=True).
    for a, b in zip(grads("none"), grads("dots_saveable"), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_attention_dropout_is_gpt2s_attn_pdrop():
    """``attn_pdrop`` drops attention probabilities in training only (XLA kernel), and the other
    kernels refuse it before a run starts; unset, the rates are the old ``dropout`` ones."""
    q, k, v = _qkv()
    seg = jnp.asarray(_segments())
    same = A.xla_attention_with_dropout(q, k, v, seg, lambda p: p)
    np.testing.assert_allclose(
        np.asarray(same), np.asarray(A.xla_attention(q, k, v, seg)), atol=1e-5
    )

    config = ModelConfig(num_layers=1, dropout=0.0, attn_pdrop=0.5)
    assert (config.embedding_dropout, config.residual_dropout) == (0.0, 0.0)
    model = AllieModel(config, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(synthetic_batch(2, 64, seed=1)["inputs"])
    plain = AllieModel(ModelConfig(num_layers=1, dropout=0.0), rngs=nnx.Rngs(0))
    nnx.update(model, nnx.state(plain, nnx.Param))  # same weights: only dropout differs
    eval_a = model(tokens, segment_ids=seg, deterministic=True).policy_logits
    eval_b = plain(tokens, segment_ids=seg, deterministic=True).policy_logits
    np.testing.assert_allclose(np.asarray(eval_a), np.asarray(eval_b), atol=1e-5)
    train = model(tokens, segment_ids=seg, deterministic=False).policy_logits
    assert float(jnp.max(jnp.abs(train - eval_a))) > 1e-3

    config.check_attention_dropout("cpu")  # auto -> xla: fine
    with pytest.raises(ValueError, match="attention_impl=xla"):
        config.check_attention_dropout("tpu")  # auto -> splash
    old = ModelConfig(dropout=0.2)
    assert (old.embedding_dropout, old.residual_dropout, old.attention_dropout) == (0.2, 0.2, 0.0)
