"""The paper's schedule, and the released trainer's weight decay on the real parameter trees."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from allie_jax.model import AllieModel, ModelConfig
from allie_jax.train.metrics import device_peak_flops, training_flops_per_token
from allie_jax.train.optimizer import (
    decay_mask,
    learning_rate_schedule,
    make_optimizer,
    parameter_names,
)
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


def _param_names(tree) -> dict[str, tuple[int, ...]]:
    """{"blocks.0.attn.query": shape, ...} of a params tree, by its dict keys."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(parameter_names(path)): tuple(leaf.shape) for path, leaf in leaves}


def _abstract_params(name: str):
    config = ModelConfig.named(name)
    return nnx.state(nnx.eval_shape(lambda: AllieModel(config, rngs=nnx.Rngs(0))), nnx.Param)


# The released trainer decays Linear/Conv1D weights only: every attention and MLP kernel of every
# block and the two scalar heads' kernels; never a bias, a LayerNorm, wte, wpe or the Elo table.
def _released_rule(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "blocks":
        return parts[2] in ("attn", "mlp") and parts[3] in (
            "query",
            "key",
            "value",
            "out",
            "fc",
            "proj",
        )
    return name in ("value_head", "time_head")


@pytest.mark.parametrize("size", ["tiny", "allie_medium"])
def test_decay_mask_on_the_real_parameter_tree(size):
    params = _abstract_params(size)
    names = _param_names(params)
    mask = {
        ".".join(parameter_names(p)): m
        for p, m in jax.tree_util.tree_flatten_with_path(decay_mask(params))[0]
    }
    assert set(mask) == set(names)
    decayed = {n for n, m in mask.items() if m}
    assert decayed == {n for n in names if _released_rule(n)}
    layers = ModelConfig.named(size).num_layers
    assert len(decayed) == 6 * layers + 2
    # The matrices the old ndim >= 2 rule decayed by mistake.
    for name in ("wte", "wpe", "elo_embed", "blocks.0.attn.query_bias", "blocks.0.attn.out_bias"):
        assert name in names and not mask[name], name
    assert len(names["wte"]) == 2 and len(names["blocks.0.attn.query_bias"]) == 2


def test_weight_decay_moves_only_the_released_trainers_weights():
    """With zero gradients only decoupled weight decay moves a parameter (lr · wd · p)."""
    train = medium().train
    train.warmup_steps = 0
    train.learning_rate = 1.0
    train.min_learning_rate = 1.0
    tx = make_optimizer(train)
    model = AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero_grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    old_names, new_names = _flat(params), _flat(new)
    for name, before in old_names.items():
        expected = before * (1.0 - 0.01) if _released_rule(name) else before
        np.testing.assert_allclose(new_names[name], expected, rtol=1e-6, err_msg=name)


def _flat(tree) -> dict[str, np.ndarray]:
    return {
        ".".join(parameter_names(path)): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def test_flops_accounting():
    assert training_flops_per_token(100, 2, 8, 16) == 6 * 100 + 12 * 2 * 8 * 16
    peak, known = device_peak_flops()
    assert peak > 0 and isinstance(known, bool)
