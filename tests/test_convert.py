"""Converters against the source frameworks' own forward passes (HF GPT-2, a released-Allie clone).

The PyTorch module (``bench/torch_allie.py``) mirrors the released Allie exactly (y0mingzhang/allie,
``CausalLMWithRegressionHead(CausalLMWithControlToken(GPT2LMHeadModel))``): Elo ids replace the
token embedding by ``[a, 1 − a] @ control_embeds``, GPT-2 adds positions, and the value / time
heads read the final hidden state. Its ``best.pt`` uses the real key names.
"""

from __future__ import annotations

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax import game as game_lib
from allie_jax.convert import ConversionError, convert_gpt2, convert_released_allie
from allie_jax.convert.allie_torch import infer_config
from allie_jax.convert.gpt2 import gpt2_to_params
from allie_jax.model import ModelConfig
from allie_jax.model.checkpoint import load_model, load_safetensors
from tests.test_model import REPO_ROOT, load_sample_games, pad_rows

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# the released-structure clone, shared with the benchmarks that compare against torch
from bench.torch_allie import ControlToken, RegressionHead  # noqa: E402

TINY = dict(n_layer=2, n_embd=64, n_head=4, n_positions=128)
ATOL = 1e-4


def _hf_config(vocab_size: int, **kw):
    return transformers.GPT2Config(
        vocab_size=vocab_size,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        **{**TINY, **kw},
    )


def _our_config(**kw) -> ModelConfig:
    return ModelConfig.named("tiny", **{"max_len": TINY["n_positions"], **kw})


def _randomise(module, seed: int) -> None:
    """Non-trivial LayerNorm and bias values so a mis-mapped tensor cannot hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.copy_(
                    torch.randn(p.shape, generator=g) * 0.1
                    + (1.0 if "ln_" in name and name.endswith("weight") else 0.0)
                )


@pytest.fixture(scope="module")
def hf_gpt2_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_hf_config(vocab_size=300)).eval()
    _randomise(model, 1)
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path, safe_serialization=True)
    return path, model


@pytest.fixture(scope="module")
def released_ckpt(tmp_path_factory):
    torch.manual_seed(1)
    gpt2 = transformers.GPT2LMHeadModel(_hf_config(vocab_size=1997))
    model = RegressionHead(ControlToken(gpt2)).eval()
    _randomise(model, 2)
    path = tmp_path_factory.mktemp("allie") / "best.pt"
    torch.save({"model": model.state_dict(), "step": 123}, path)
    return path, model


def test_gpt2_body_matches_hf_forward(hf_gpt2_dir):
    path, hf = hf_gpt2_dir
    assert (path / "model.safetensors").exists()
    ours = convert_gpt2(path, _our_config(vocab_size=300), reinit_embeddings=False)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 300, size=(2, 50))
    with torch.no_grad():
        ref = hf(torch.tensor(tokens)).logits.numpy()
    out = ours(jnp.asarray(tokens, jnp.int32))
    assert np.abs(np.asarray(out.policy_logits) - ref).max() <= ATOL


def test_gpt2_reinit_follows_spec_and_checks_sizes(hf_gpt2_dir):
    path, hf = hf_gpt2_dir
    from allie_jax.convert.gpt2 import read_safetensors

    tensors = read_safetensors(path / "model.safetensors")
    assert any(k.startswith("transformer.") for k in tensors)
    bare = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    cfg = _our_config(max_len=100)  # wpe has 128 rows: the first 100 are kept
    params = gpt2_to_params(bare, cfg, seed=3)
    src = tensors["transformer.wte.weight"]
    assert params["wte"].shape == (1997, 64)
    assert abs(params["wte"].mean() - src.mean()) < 0.1 * src.std()
    assert abs(params["wte"].std() / src.std() - 1) < 0.05
    assert abs(params["elo_embed"].std() - 0.02) < 0.01
    np.testing.assert_array_equal(params["wpe"], tensors["transformer.wpe.weight"][:100])
    np.testing.assert_array_equal(
        params["blocks"][1]["mlp"]["fc"], tensors["transformer.h.1.mlp.c_fc.weight"]
    )
    with pytest.raises(ConversionError, match="2 layers × width 64.*4 × 64"):
        gpt2_to_params(tensors, _our_config(num_layers=4))
    with pytest.raises(ConversionError, match="128 positions"):
        gpt2_to_params(tensors, _our_config(max_len=256))
    with pytest.raises(ConversionError, match="n_head=4"):
        convert_gpt2(path, ModelConfig.named("tiny", num_heads=8, max_len=128))
    with pytest.raises(ConversionError, match="no such file"):
        convert_gpt2(path / "nope.safetensors", _our_config())


def test_released_allie_matches_torch_on_real_games(released_ckpt, sample_pgn, tmp_path):
    path, ref_model = released_ckpt
    games = load_sample_games(sample_pgn, 3)
    seqs = [game_lib.encode_game(g, max_len=TINY["n_positions"]).tokens for g in games]
    # Also a game whose Elos are out of range (clamped) and one with <BOS> instead of Elos.
    seqs.append(game_lib.encode_game(games[0], drop_elo=True).tokens[:60])
    seqs.append(np.concatenate([[1997 + 3300, 1997 + 120], seqs[1][2:70]]).astype(np.int32))
    tokens = pad_rows(seqs)
    mask = np.zeros_like(tokens)
    for i, s in enumerate(seqs):
        mask[i, : len(s)] = 1
    with torch.no_grad():
        logits, value, time = (
            x.numpy() for x in ref_model(torch.tensor(tokens, dtype=torch.long), torch.tensor(mask))
        )

    state_config = infer_config(
        {k: v.numpy() for k, v in ref_model.state_dict().items()}, size="tiny"
    )
    assert state_config.max_len == 128 and state_config.vocab_size == 1997
    ours = convert_released_allie(path, size="tiny")
    out = ours(jnp.asarray(tokens))
    for i, s in enumerate(seqs):
        n = len(s)
        assert np.abs(np.asarray(out.policy_logits)[i, :n] - logits[i, :n]).max() <= ATOL
        assert np.abs(np.asarray(out.value)[i, :n] - value[i, :n]).max() <= ATOL
        assert np.abs(np.asarray(out.time)[i, :n] - time[i, :n]).max() <= ATOL


@pytest.mark.slow
def test_convert_cli_writes_model_dir_and_safetensors(released_ckpt, tmp_path):
    path, ref_model = released_ckpt
    out_dir, st = tmp_path / "model", tmp_path / "allie.safetensors"
    cmd = [sys.executable, "-m", "launch.convert", "--format", "allie", "--input", str(path)]
    cmd += ["--output", str(out_dir), "--size", "tiny", "--safetensors", str(st)]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT, capture_output=True)
    a, b = load_model(out_dir), load_safetensors(st)
    tokens = jnp.array([[1997 + 1500, 1997 + 1600, 1968, 757, 890]])
    with torch.no_grad():
        _, value, _ = ref_model(torch.tensor(np.asarray(tokens), dtype=torch.long))
    np.testing.assert_allclose(a(tokens).value, value.numpy(), atol=ATOL)
    np.testing.assert_array_equal(a(tokens).policy_logits, b(tokens).policy_logits)
    with pytest.raises(ConversionError, match="2 layers × width 64.*24 × 1024"):
        convert_released_allie(path, size="allie_medium")


def test_convert_from_and_to_gs_paths(hf_gpt2_dir, released_ckpt, tmp_path, monkeypatch):
    """gs:// in and out through etils.epath (in-memory gs://, see tests/support/memory_fs.py): the same
    parameters as from local files, and a model directory published remotely loads back."""
    from etils import epath

    from allie_jax.data import paths
    from allie_jax.model.checkpoint import CONFIG_FILE, PARAMS_DIR, params_dict, save_model
    from tests.support.memory_fs import memory_gcs

    monkeypatch.setenv("ALLIE_JAX_CACHE", str(tmp_path / "cache"))
    hf_dir, _ = hf_gpt2_dir
    pt, _ = released_ckpt
    config = _our_config(vocab_size=300)
    with memory_gcs() as fs:
        for f in hf_dir.iterdir():
            epath.Path(f"gs://b/gpt2/{f.name}").write_bytes(f.read_bytes())
        epath.Path("gs://b/allie/best.pt").write_bytes(pt.read_bytes())
        remote = convert_gpt2("gs://b/gpt2", config, seed=3)
        local = convert_gpt2(hf_dir, config, seed=3)
        for a, b in zip(
            jax_leaves(params_dict(remote)), jax_leaves(params_dict(local)), strict=True
        ):
            np.testing.assert_array_equal(a, b)
        released = convert_released_allie("gs://b/allie/best.pt", size="tiny")
        with paths.staged_output("gs://b/model", [CONFIG_FILE, PARAMS_DIR]) as stage:
            save_model(released, stage)  # what launch.convert does
        assert epath.Path(f"gs://b/model/{CONFIG_FILE}").exists()
        down = tmp_path / "down"
        for key in fs.find("gs://b/model"):
            rel = key[len("b/model/") :]
            (down / rel).parent.mkdir(parents=True, exist_ok=True)
            (down / rel).write_bytes(epath.Path(f"gs://{key}").read_bytes())
        with pytest.raises(ConversionError, match="no such file"):
            convert_gpt2("gs://b/nothing", config)
    tokens = jnp.array([[1997 + 1500, 1997 + 1600, 1968, 757, 890]])
    np.testing.assert_array_equal(load_model(down)(tokens).value, released(tokens).value)
    assert not (tmp_path / "gs:").exists()


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.slow
def test_convert_command_on_emulated_gcs(released_ckpt, tmp_path, monkeypatch):
    """launch.convert with input, output and --safetensors on gs:// (a local Cloud Storage
    emulator, tests/support/gcs_emulator.py: real gcsfs and TensorStore clients); the model directory
    and the safetensors file load back from gs:// with the converted parameters."""
    import os

    from etils import epath

    from allie_jax.model.checkpoint import flatten_params, params_dict
    from tests.support.gcs_emulator import emulated_gcs
    from tests.test_gcs_paths import _require_gcs_extra

    _require_gcs_extra()
    pt, _ = released_ckpt
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALLIE_JAX_CACHE", str(tmp_path / "cache"))
    expected = flatten_params(params_dict(convert_released_allie(pt, size="tiny")))
    with emulated_gcs() as gcs:
        epath.Path("gs://bucket/released/best.pt").write_bytes(pt.read_bytes())
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "launch.convert",
                "--format=allie",
                "--input=gs://bucket/released/best.pt",
                "--output=gs://bucket/converted",
                "--safetensors=gs://bucket/exports/allie.safetensors",
            ],
            cwd=tmp_path,
            env={**os.environ, **gcs.env(), "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "converted/params/manifest.ocdbt" in gcs.objects(prefix="converted/")
        for model in (
            load_model("gs://bucket/converted"),
            load_safetensors("gs://bucket/exports/allie.safetensors"),
        ):
            got = flatten_params(params_dict(model))
            assert got.keys() == expected.keys()
            for name in expected:
                np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert not (tmp_path / "gs:").exists()
