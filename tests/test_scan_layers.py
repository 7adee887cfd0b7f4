"""Scanned layers (``ModelConfig.scan_layers``) against the unrolled model with the same weights.

Float32 throughout: outputs and gradients agree to 1e-6 (only the order XLA sums in differs),
every per-layer path (cache, path evaluation, search leaf) agrees, checkpoints of either layout
load into the other, and the stacked parameters shard with a leading ``None``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from allie_jax import vocab
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.model import layer_layout as ll
from allie_jax.model.checkpoint import (
    CheckpointError,
    load_model,
    model_from_params,
    params_dict,
    save_model,
    with_layer_layout,
)

TOL = 1e-6
LAYERS = 2
CONFIG = ModelConfig(num_layers=LAYERS, embed_dim=32, num_heads=4, max_len=64, dropout=0.1)
SCANNED = dataclasses.replace(CONFIG, scan_layers=True)


@pytest.fixture(scope="module")
def pair() -> tuple[AllieModel, AllieModel]:
    """An unrolled model and the scanned model holding exactly its weights."""
    unrolled = AllieModel(CONFIG, rngs=nnx.Rngs(3))
    return unrolled, model_from_params(SCANNED, params_dict(unrolled))


def _packed_batch() -> tuple[jax.Array, jax.Array]:
    """Two rows of packed games (three segments, then padding), with Elo header tokens."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab.NUM_MOVES, (2, 24)).astype(np.int32)
    tokens[0, 0], tokens[0, 1] = vocab.VOCAB_SIZE + 1500, vocab.VOCAB_SIZE + 2100
    segments = np.array([[1] * 9 + [2] * 11 + [0] * 4, [1] * 17 + [2] * 7], np.int32)
    return jnp.asarray(tokens), jnp.asarray(segments)


def _max_diff(a, b) -> float:
    return max(
        float(jnp.max(jnp.abs(x - y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _with_remat(model: AllieModel, remat: str) -> AllieModel:
    config = dataclasses.replace(model.config, remat=remat)
    return model_from_params(config, params_dict(model))


def _loss(model: AllieModel, tokens: jax.Array, segments: jax.Array) -> jax.Array:
    """Cross entropy on the next token plus the two regression heads, all masked by segment."""
    out = model(tokens, segment_ids=segments)
    mask = (segments > 0).astype(jnp.float32)
    logp = jax.nn.log_softmax(out.policy_logits, axis=-1)
    target = jnp.roll(tokens, -1, axis=1) % vocab.NUM_MOVES
    ce = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    return jnp.sum((ce + jnp.square(out.time - 0.3) + jnp.square(out.value - 0.5)) * mask) / (
        jnp.sum(mask)
    )


def test_stack_and_unstack_are_inverse(pair):
    unrolled, scanned = pair
    params = params_dict(unrolled)
    stacked = ll.stack_layers(params, LAYERS)
    assert stacked["layers"]["attn"]["query"].shape == (LAYERS, 32, 4, 8)
    assert ll.is_scanned(stacked) and not ll.is_scanned(params)
    assert _max_diff(stacked, params_dict(scanned)) == 0.0
    back = ll.unstack_layers(stacked)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    assert _max_diff(back, params) == 0.0
    with pytest.raises(ll.LayerLayoutError, match="layers"):
        ll.stack_layers(params, LAYERS + 1)


def test_config_round_trip_and_older_files():
    assert ModelConfig.from_dict(json_dict := SCANNED.to_dict()).scan_layers is True
    del json_dict["scan_layers"]  # a config.json written before the field existed
    assert ModelConfig.from_dict(json_dict).scan_layers is False


@pytest.mark.parametrize("remat", ["none", "full"])
def test_outputs_and_gradients_equal_unrolled(pair, remat):
    tokens, segments = _packed_batch()
    unrolled, scanned = (_with_remat(m, remat) for m in pair)
    forward = nnx.jit(lambda m, t, s: m(t, segment_ids=s))
    assert _max_diff(forward(unrolled, tokens, segments), forward(scanned, tokens, segments)) <= TOL
    grad = nnx.jit(nnx.grad(_loss))
    g_unrolled = grad(unrolled, tokens, segments).to_pure_dict()
    g_scanned = grad(scanned, tokens, segments).to_pure_dict()
    g_scanned = ll.unstack_layers(g_scanned)
    assert jax.tree.structure(g_scanned) == jax.tree.structure(g_unrolled)
    assert float(jnp.max(jnp.abs(g_unrolled["blocks"][0]["mlp"]["fc"]))) > 0
    assert _max_diff(g_unrolled, g_scanned) <= TOL


def test_dropout_runs_per_layer_inside_the_scan(pair):
    """Each layer's dropout stream advances inside the scan, and training outputs are random."""
    _, scanned = pair
    model = nnx.clone(scanned)
    tokens, segments = _packed_batch()
    train = nnx.jit(lambda m, t, s: m(t, segment_ids=s, deterministic=False))
    counts = lambda: np.asarray(model.layers.dropout.rngs.count[...])  # noqa: E731
    before = counts()
    first, second = train(model, tokens, segments), train(model, tokens, segments)
    assert counts().shape == (LAYERS,) and (counts() == before + 4).all()  # 2 dropouts x 2 calls
    assert _max_diff(first.policy_logits, second.policy_logits) > 1e-3
    keys = jax.random.key_data(model.layers.dropout.rngs.key[...])
    assert len({tuple(np.asarray(k).ravel()) for k in keys}) == LAYERS  # one stream per layer


def test_cache_path_and_search_leaf_agree(pair):
    """Every per-layer path reads ``layer_blocks()``: the cache extension (all tokens and the
    last only), the path extension, and ``path_forward`` (the search's leaf evaluator)."""
    from allie_jax.search import evaluator

    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, vocab.NUM_MOVES, (2, 6)), jnp.int32)
    more = jnp.asarray(rng.integers(0, vocab.NUM_MOVES, (2, 2)), jnp.int32)
    action = jnp.asarray(rng.integers(0, vocab.NUM_MOVES, 2), jnp.int32)
    num_new, path_len = jnp.asarray([6, 4], jnp.int32), jnp.asarray([1, 0], jnp.int32)
    path_k = jnp.zeros((LAYERS, 2, 3, 4, 8)).at[:, :, :1].set(0.1)
    store = jnp.asarray(rng.normal(size=(2, 4, LAYERS, 4, 8)), jnp.float32) * 0.1
    nodes, depth = jnp.asarray([[1, 2, 0], [3, 0, 0]], jnp.int32), jnp.asarray([2, 1], jnp.int32)

    def run(model):
        out, cache = model.extend(tokens, model.init_cache(2, 16), num_new)
        last, _ = model.extend(tokens, model.init_cache(2, 16), num_new, last_only=True)
        path = model.extend_with_path(more, cache, path_k, path_k, path_len)
        root = evaluator.heads_first(cache)
        leaf = evaluator.path_forward(model, action, root, nodes, depth, store, store)
        return out, cache, last, path, leaf

    run = nnx.jit(run)
    unrolled, scanned = run(pair[0]), run(pair[1])
    assert unrolled[-1][1].shape == (2, LAYERS, 4, 8)
    assert _max_diff(unrolled, scanned) <= TOL


def test_checkpoints_load_into_either_layout(pair, tmp_path):
    unrolled, scanned = pair
    tokens, segments = _packed_batch()
    want = nnx.jit(lambda m, t, s: m(t, segment_ids=s))(unrolled, tokens, segments)
    save_model(scanned, tmp_path / "scanned")
    save_model(unrolled, tmp_path / "unrolled")
    loaded = {
        "scanned as saved": load_model(tmp_path / "scanned"),
        "scanned into unrolled": load_model(tmp_path / "scanned", scan_layers=False),
        "unrolled into scanned": load_model(tmp_path / "unrolled", scan_layers=True),
    }
    assert loaded["scanned as saved"].config.scan_layers
    assert not loaded["scanned into unrolled"].config.scan_layers
    assert loaded["unrolled into scanned"].config.scan_layers
    for name, model in loaded.items():
        got = nnx.jit(lambda m, t, s: m(t, segment_ids=s))(model, tokens, segments)
        assert _max_diff(want, got) <= TOL, name
    # the inference helper the engine uses: unrolled weights, identical numbers
    from allie_jax.engine.api import Allie

    assert not Allie(scanned).model.config.scan_layers
    assert (
        _max_diff(params_dict(with_layer_layout(scanned, scan_layers=False)), params_dict(unrolled))
        == 0
    )
    with pytest.raises(CheckpointError, match="neither"):
        model_from_params(SCANNED, {"wte": np.zeros(1)})


def test_gpt2_conversion_honours_the_layout(pair):
    """The trainer drops a converter's tree straight into its model (``replace_by_pure_dict``)."""
    from allie_jax.convert.gpt2 import gpt2_to_params

    d, rng = CONFIG.embed_dim, np.random.default_rng(4)
    shapes = {"wte.weight": (50, d), "wpe.weight": (64, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(LAYERS):
        shapes |= {
            f"h.{i}.attn.c_attn.weight": (d, 3 * d),
            f"h.{i}.attn.c_attn.bias": (3 * d,),
            f"h.{i}.attn.c_proj.weight": (d, d),
            f"h.{i}.attn.c_proj.bias": (d,),
            f"h.{i}.mlp.c_fc.weight": (d, 4 * d),
            f"h.{i}.mlp.c_fc.bias": (4 * d,),
            f"h.{i}.mlp.c_proj.weight": (4 * d, d),
            f"h.{i}.mlp.c_proj.bias": (d,),
        } | {f"h.{i}.{ln}.{w}": (d,) for ln in ("ln_1", "ln_2") for w in ("weight", "bias")}
    tensors = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    flat, stacked = gpt2_to_params(tensors, CONFIG), gpt2_to_params(tensors, SCANNED)
    assert _max_diff(ll.stack_layers(flat, LAYERS), stacked) == 0.0
    _, scanned = pair
    params = nnx.state(nnx.clone(scanned), nnx.Param)
    nnx.replace_by_pure_dict(params, stacked)
    assert params["layers"]["mlp"]["fc"][...].shape == (LAYERS, d, 4 * d)


def test_stacked_parameters_shard_with_a_leading_none():
    from allie_jax.train import sharding as shd

    abstract = nnx.eval_shape(lambda: AllieModel(SCANNED, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    mesh = shd.make_mesh((1, 1, 1), jax.devices()[:1])
    shardings = shd.state_shardings(params, mesh).to_pure_dict()
    query = shardings["layers"]["attn"]["query"].spec
    assert query == PartitionSpec(None, "fsdp", "tensor", None)
    assert len(shardings["layers"]["ln_1"]["scale"].spec) == 2
    for spec_leaf, param in zip(
        jax.tree.leaves(shardings["layers"]),
        jax.tree.leaves(params.to_pure_dict()["layers"]),
        strict=True,
    ):
        assert len(spec_leaf.spec) == param.ndim and spec_leaf.spec[0] is None
    assert shardings["wte"].spec == PartitionSpec(None, "fsdp")  # the rest is unchanged


def test_training_resume_refuses_the_other_layout(pair, tmp_path):
    """The optimizer state is not restacked: resuming across layouts names the flag instead."""
    from allie_jax.train.checkpoints import Checkpointer
    from allie_jax.train.state import init_train_state

    tx = optax.adam(1e-3)

    def state_of(model):
        _, params, rest = nnx.split(model, nnx.Param, ...)
        return init_train_state(params, rest, tx)

    unrolled, scanned = pair
    checkpointer = Checkpointer(tmp_path, async_save=False, save_every=1)
    checkpointer.save(state_of(nnx.clone(unrolled)), force=True)
    checkpointer.wait()
    restored = checkpointer.restore(state_of(nnx.clone(unrolled)))
    assert int(restored.step) == 0
    with pytest.raises(ValueError, match="scan_layers=False"):
        checkpointer.restore(state_of(nnx.clone(scanned)))
    checkpointer.close()


def test_trainer_starts_from_gpt2_in_the_scanned_layout(tmp_path):
    """``build_trainer`` with ``scan_layers``: the GPT-2 blocks land in their rows, a step runs."""
    from allie_jax.data.synthetic import synthetic_batch
    from allie_jax.train import sharding as shd
    from allie_jax.train.loop import build_trainer, model_config_from
    from configs.tiny import get_config
    from tests.test_train import _write_gpt2_safetensors

    source = _write_gpt2_safetensors(tmp_path / "model.safetensors")
    config = get_config()
    config.model.init_from_gpt2 = str(tmp_path / "model.safetensors")
    config.train.batch_size = 2
    model_config = dataclasses.replace(model_config_from(config), scan_layers=True)
    trainer = build_trainer(config, model_config, shd.make_mesh((-1, 1, 1)))
    scale = np.asarray(trainer.state.params["layers"]["ln_1"]["scale"][...])
    np.testing.assert_array_equal(scale[1], source["h.1.ln_1.weight"].astype(np.float32))
    batch = jax.device_put(synthetic_batch(2, 32, seed=1), trainer.batch_sharding)
    state, metrics = trainer.train_step(trainer.state, batch)
    assert np.isfinite(float(metrics["loss"])) and int(state.step) == 1
