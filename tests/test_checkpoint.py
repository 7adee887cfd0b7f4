"""save_model / load_model round trips, training workdirs, safetensors, and clear errors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from allie_jax.model import AllieModel, ModelConfig
from allie_jax.model import checkpoint as ckpt

TOKENS = jnp.array([[1997 + 1500, 1997 + 1620, 1968, 757, 890, 743, 12]])
_run = nnx.jit(lambda m, t, det: m(t, deterministic=det), static_argnums=2)


@pytest.fixture(scope="module")
def model():
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(5))


def _same_params(a, b):
    for x, y in zip(
        jax.tree.leaves(nnx.state(a, nnx.Param)),
        jax.tree.leaves(nnx.state(b, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)


def test_save_and_load_model_dir(model, tmp_path):
    ckpt.save_model(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_layers"] == 2
    loaded = ckpt.load_model(tmp_path / "m")
    assert loaded.config == model.config
    _same_params(model, loaded)
    np.testing.assert_array_equal(loaded(TOKENS).policy_logits, model(TOKENS).policy_logits)
    # Dropout streams are real after loading, so the loaded model trains.
    assert (
        float(jnp.abs(loaded(TOKENS, deterministic=False).value - loaded(TOKENS).value).max()) > 0
    )
    ckpt.save_model(loaded, tmp_path / "m")  # overwriting is allowed
    bf16 = ckpt.load_model(tmp_path / "m", dtype="bfloat16")
    assert bf16.config.dtype == "bfloat16" and bf16.wte[...].dtype == jnp.float32


def test_load_training_workdir_best_else_latest(model, tmp_path):
    other = AllieModel(model.config, rngs=nnx.Rngs(9))
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps({"model": {"size": "tiny"}, "lr": 1e-4}))
    options = ocp.CheckpointManagerOptions(best_fn=lambda m: m["val_loss"], best_mode="min")
    with ocp.CheckpointManager(workdir / "checkpoints", options=options) as mgr:
        for step, (m, val) in {10: (model, 1.0), 20: (other, 2.0)}.items():
            pure = nnx.state(m, nnx.Param).to_pure_dict()
            mgr.save(
                step,
                args=ocp.args.Composite(params=ocp.args.StandardSave(pure)),
                metrics={"val_loss": val},
            )
        mgr.wait_until_finished()
    _same_params(ckpt.load_model(workdir), model)  # best: lowest val_loss
    _same_params(ckpt.load_model(workdir, step=20), other)
    _, step = ckpt.restore_params_from_workdir(workdir, model.config)
    assert step == 10


def test_safetensors_round_trip(model, tmp_path):
    path = ckpt.export_safetensors(model, tmp_path / "m.safetensors")
    from safetensors.numpy import load_file

    flat = load_file(str(path))
    assert flat["blocks.1.attn.query"].shape == (64, 4, 16)
    assert flat["wte"].shape == (1997, 64)
    _same_params(ckpt.load_safetensors(path), model)


def test_errors_name_the_path_and_problem(model, tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no such checkpoint"):
        ckpt.load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ckpt.CheckpointError, match="config.json: missing"):
        ckpt.load_model(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(ModelConfig.named("tiny").to_json())
    with pytest.raises(ckpt.CheckpointError, match="neither a model directory"):
        ckpt.load_model(tmp_path / "empty")
    params = nnx.state(model, nnx.Param).to_pure_dict()
    wide = ModelConfig.named("tiny", embed_dim=128)
    with pytest.raises(ckpt.CheckpointError, match="shape"):
        ckpt.model_from_params(wide, params)
    del params["ln_f"]
    with pytest.raises(ckpt.CheckpointError, match="missing"):
        ckpt.model_from_params(model.config, params)


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig.named("tiny"),
        ModelConfig.named("tiny", scan_layers=True),
        "board_tiny",
    ],
    ids=["decoder", "decoder-scanned", "board"],
)
def test_abstract_model_matches_the_traced_random_init(config):
    """``abstract_model`` traces under ``shapes_only`` (no random init): every variable's
    path, shape, dtype, type and sharding metadata must be those of ``nnx.eval_shape`` of the
    family's real ``build``."""
    from allie_jax.model import family as family_lib
    from allie_jax.model.board_transformer import BoardConfig

    if config == "board_tiny":
        config = BoardConfig.named("board_tiny")
    family = family_lib.of_model_config(config)
    real = nnx.eval_shape(lambda: family.build(config, 0))
    cheap = ckpt.abstract_model(config)

    def describe(model):
        _, state = nnx.split(model)
        out = {}
        for path, var in nnx.to_flat_state(state):
            meta = {k: v for k, v in var.get_metadata().items() if k != "value"}
            out[path] = (type(var).__name__, var.shape, str(var.dtype), repr(sorted(meta.items())))
        return out

    want, got = describe(real), describe(cheap)
    assert want.keys() == got.keys()
    assert want == got
    assert sum(k[0] == "Param" for k in got.values()) > 10
