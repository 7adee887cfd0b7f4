"""Whole-game attention kernels and memory settings reachable from the config.

On CPU: the kernel choice per backend, the XLA path against a hand-written softmax attention,
cuDNN's packed layout (segment lengths/offsets) against a plain-Python reading of the segments,
Pallas splash attention (interpret mode) against XLA, and remat policies against no remat.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

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


def test_cudnn_packed_layout_reads_the_segments():
    seg = _segments(16)
    lengths, offsets = (np.asarray(x) for x in A.packed_lengths_and_offsets(jnp.asarray(seg)))
    for row in range(seg.shape[0]):
        runs, start = [], 0
        for t in range(1, seg.shape[1] + 1):
            if t == seg.shape[1] or seg[row, t] != seg[row, t - 1]:
                runs.append((start, t - start))
                start = t
        m = len(runs)
        assert list(lengths[row, :m]) == [n for _, n in runs]
        assert (lengths[row, m:] == -1).all()
        assert list(offsets[row, : m + 1]) == [s for s, _ in runs] + [seg.shape[1]]
        assert (offsets[row, m + 1 :] == -1).all()


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
