"""loss_fn against a hand-written numpy reference, and on a real encoded game."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from allie_jax import game as game_lib
from allie_jax.model import AllieModel, ModelConfig, ModelOutputs
from allie_jax.model.losses import loss_fn
from tests.test_model import load_sample_games


def _reference(logits, time, value, batch, weights):
    logits = logits.astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    pm, tm, vm = batch["policy_mask"], batch["time_mask"], batch["value_mask"]
    ce, hits, se_t, se_v = [], [], [], []
    for idx in np.ndindex(pm.shape):
        if pm[idx]:
            tgt = batch["policy_targets"][idx]
            ce.append(-logp[idx][tgt])
            hits.append(float(np.argmax(logits[idx]) == tgt))
        if tm[idx]:
            sec = min(max(batch["time_targets"][idx], 0.0), 60.0)
            se_t.append((time[idx] - (sec - 4.64001) / 6.16533) ** 2)
        if vm[idx]:
            se_v.append((value[idx] - batch["value_targets"][idx]) ** 2)
    p, t, v = np.mean(ce), np.mean(se_t), np.mean(se_v)
    return weights[0] * p + weights[1] * t + weights[2] * v, p, t, v, np.mean(hits)


def test_loss_matches_reference_with_masks_and_unlabelled_garbage():
    rng = np.random.default_rng(0)
    b, t, v = 3, 7, 1997
    logits = rng.normal(size=(b, t, v)).astype(np.float32) * 3
    time = rng.normal(size=(b, t)).astype(np.float32)
    value = np.tanh(rng.normal(size=(b, t))).astype(np.float32)
    batch = {
        "policy_targets": rng.integers(0, v, size=(b, t)).astype(np.int32),
        "time_targets": rng.uniform(-5, 90, size=(b, t)).astype(np.float32),  # clipped to [0, 60]
        "value_targets": rng.choice([-1.0, 0.0, 1.0], size=(b, t)).astype(np.float32),
        "policy_mask": (rng.uniform(size=(b, t)) < 0.7).astype(np.float32),
        "time_mask": (rng.uniform(size=(b, t)) < 0.5).astype(np.float32),
        "value_mask": (rng.uniform(size=(b, t)) < 0.8).astype(np.float32),
    }
    # Unlabelled positions may carry anything, including NaN values and -1 policy targets.
    batch["policy_targets"][batch["policy_mask"] == 0] = -1
    batch["value_targets"][batch["value_mask"] == 0] = np.nan
    batch["time_targets"][batch["time_mask"] == 0] = -1.0
    batch["policy_mask"][0, 0], batch["policy_targets"][0, 0] = 1.0, 5
    logits[0, 0, 5] += 20  # at least one correct argmax

    weights = (1.0, 0.5, 2.0)
    out = ModelOutputs(jnp.asarray(logits), jnp.asarray(time), jnp.asarray(value))
    loss, metrics = jax.jit(lambda o, bt: loss_fn(o, bt, weights))(out, batch)
    ref_loss, p, tl, vl, acc = _reference(logits, time, value, batch, weights)
    np.testing.assert_allclose(float(metrics["policy_loss"]), p, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["time_loss"]), tl, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["value_loss"]), vl, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["policy_accuracy"]), acc, rtol=1e-6)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    assert acc > 0


def test_empty_masks_give_zero_not_nan():
    out = ModelOutputs(jnp.zeros((1, 2, 1997)), jnp.ones((1, 2)), jnp.ones((1, 2)))
    zeros = jnp.zeros((1, 2))
    batch = {
        "policy_targets": jnp.zeros((1, 2), jnp.int32),
        "time_targets": jnp.full((1, 2), jnp.nan),
        "value_targets": jnp.full((1, 2), jnp.nan),
        "policy_mask": zeros,
        "time_mask": zeros,
        "value_mask": zeros,
    }
    loss, metrics = loss_fn(out, batch)
    assert float(loss) == 0.0 and all(np.isfinite(float(x)) for x in metrics.values())
    with pytest.raises(ValueError, match="weights"):
        loss_fn(out, batch, weights=(1.0, 1.0))


def test_loss_and_gradients_on_a_real_game(sample_pgn):
    g = load_sample_games(sample_pgn, 1)[0]
    enc = game_lib.encode_game(g)
    batch = {
        "inputs": enc.tokens[None],
        "policy_targets": np.maximum(enc.policy_targets, 0)[None],
        "time_targets": enc.time_targets[None],
        "value_targets": np.nan_to_num(enc.value_targets)[None],
        "policy_mask": (enc.policy_targets >= 0).astype(np.float32)[None],
        "time_mask": (enc.time_targets >= 0).astype(np.float32)[None],
        "value_mask": np.isfinite(enc.value_targets).astype(np.float32)[None],
    }
    assert batch["time_mask"].sum() > 10
    model = AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))

    @nnx.jit
    def step(m, batch):
        def objective(m):
            return loss_fn(m(batch["inputs"]), batch)

        return nnx.value_and_grad(objective, has_aux=True)(m)

    (loss, metrics), grads = step(model, jax.tree.map(jnp.asarray, batch))
    # A fresh model is close to uniform over 1,997 tokens.
    assert abs(float(metrics["policy_loss"]) - np.log(1997)) < 0.5
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["elo_embed"][...]).sum()) > 0  # the soft Elo tokens get gradient
