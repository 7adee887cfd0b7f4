"""The paper's schedule and decay mask, against hand-computed values."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax

from allie_jax.train.metrics import device_peak_flops, training_flops_per_token
from allie_jax.train.optimizer import learning_rate_schedule, make_optimizer
from configs.allie_medium import get_config as medium


def test_schedule_warmup_then_cosine_to_floor():
    train = medium().train
    schedule = learning_rate_schedule(train)
    assert float(schedule(0)) == 0.0
    assert math.isclose(float(schedule(1000)), 6e-4 * 1000 / 2000, rel_tol=1e-5)
    assert math.isclose(float(schedule(2000)), 6e-4, rel_tol=1e-5)
    # Half-way through the cosine: floor + (peak - floor) / 2.
    mid = 2000 + (2_000_000 - 2000) // 2
    assert math.isclose(float(schedule(mid)), 1e-5 + (6e-4 - 1e-5) / 2, rel_tol=1e-3)
    assert math.isclose(float(schedule(2_000_000)), 1e-5, rel_tol=1e-5)


def test_paper_recipe_tokens_per_step():
    config = medium()
    assert config.train.batch_size * config.data.seq_len == 131_072
    assert (config.train.b1, config.train.b2, config.train.weight_decay) == (0.9, 0.95, 0.01)
    assert config.train.grad_clip == 1.0 and config.model.dtype == "bfloat16"


def test_weight_decay_only_on_matrices():
    train = medium().train
    train.warmup_steps = 0
    train.learning_rate = 1.0
    train.min_learning_rate = 1.0
    tx = make_optimizer(train)
    params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}
    zero_grads = {"kernel": jnp.zeros((2, 2)), "bias": jnp.zeros((2,))}
    state = tx.init(params)
    updates, _ = tx.update(zero_grads, state, params)
    new = optax.apply_updates(params, updates)
    # With zero gradients only decoupled weight decay moves a parameter: lr * wd * p.
    np.testing.assert_allclose(np.asarray(new["kernel"]), 1.0 - 1.0 * 0.01, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new["bias"]), 1.0)


def test_flops_accounting():
    assert training_flops_per_token(100, 2, 8, 16) == 6 * 100 + 12 * 2 * 8 * 16
    peak, known = device_peak_flops()
    assert peak > 0 and isinstance(known, bool)
