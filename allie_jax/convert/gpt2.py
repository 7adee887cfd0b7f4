"""HF GPT-2 ``model.safetensors`` → AllieModel parameters (SPEC §2), without torch.

Every block, ``wpe`` (its first ``max_len`` rows) and ``ln_f`` are copied. The token embeddings are
re-initialised from the source ``wte``'s mean and standard deviation (GPT-2's text vocabulary has
nothing to say about chess moves), the two Elo vectors are N(0, 0.02), and the value and time heads
are N(0, 0.02) with zero bias — the released recipe. HF ``Conv1D`` weights are already
``[in, out]``; the fused ``c_attn`` is split into per-head query / key / value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
from etils import epath

from allie_jax.data import paths
from allie_jax.model import layer_layout
from allie_jax.model.checkpoint import model_from_params
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel

IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not parameters


class ConversionError(ValueError):
    """A source checkpoint that does not fit the target config; the message says how."""


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    path = paths.as_path(path)  # local or remote (gs://...): etils.epath
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.exists():
        raise ConversionError(f"{path}: no such file")
    local = paths.local_copy(path)  # safetensors maps a local file
    return {k: np.asarray(v, np.float32) for k, v in load_file(local).items()}


def strip_prefix(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Keys under ``prefix`` without it (GPT2LMHeadModel saves ``transformer.h.0...``)."""
    if any(k.startswith(prefix) for k in tensors):
        return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    return dict(tensors)


def get_tensor(
    t: Mapping[str, np.ndarray], key: str, shape: tuple[int, ...], source: str
) -> np.ndarray:
    if key not in t:
        raise ConversionError(f"{source}: missing tensor {key!r}")
    value = np.asarray(t[key], np.float32)
    if value.shape != shape:
        raise ConversionError(f"{source}: {key} has shape {value.shape}, the config needs {shape}")
    return value


def check_geometry(t: Mapping[str, np.ndarray], config: ModelConfig, source: str) -> None:
    """Layers, width and positions of a GPT-2 state dict against ``config``, with clear errors."""
    if "wte.weight" not in t or "wpe.weight" not in t:
        raise ConversionError(f"{source}: not a GPT-2 state dict (no wte/wpe weights)")
    layers = {int(k.split(".")[1]) for k in t if k.startswith("h.")}
    width = t["wte.weight"].shape[1]
    if len(layers) != config.num_layers or width != config.embed_dim:
        raise ConversionError(
            f"{source}: {len(layers)} layers × width {width}, but the config has "
            f"{config.num_layers} × {config.embed_dim}; pick the matching --size"
        )
    rows = t["wpe.weight"].shape[0]
    if rows < config.max_len:
        raise ConversionError(
            f"{source}: {rows} positions, fewer than the config's max_len {config.max_len}"
        )


def blocks_from_gpt2(t: Mapping[str, np.ndarray], config: ModelConfig, source: str) -> dict:
    """The transformer body (blocks, wpe, ln_f) from GPT-2 names without the model prefix."""
    d, n, h, f = config.embed_dim, config.num_heads, config.head_dim, config.hidden_dim
    blocks = {}
    for i in range(config.num_layers):
        p = f"h.{i}."
        qkv = get_tensor(t, p + "attn.c_attn.weight", (d, 3 * d), source)
        qkv_b = get_tensor(t, p + "attn.c_attn.bias", (3 * d,), source)
        q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(d, n, h) for j in range(3))
        qb, kb, vb = (qkv_b[j * d : (j + 1) * d].reshape(n, h) for j in range(3))
        blocks[i] = {
            "ln_1": {
                "scale": get_tensor(t, p + "ln_1.weight", (d,), source),
                "bias": get_tensor(t, p + "ln_1.bias", (d,), source),
            },
            "attn": {
                "query": q,
                "key": k,
                "value": v,
                "query_bias": qb,
                "key_bias": kb,
                "value_bias": vb,
                "out": get_tensor(t, p + "attn.c_proj.weight", (d, d), source).reshape(n, h, d),
                "out_bias": get_tensor(t, p + "attn.c_proj.bias", (d,), source),
            },
            "ln_2": {
                "scale": get_tensor(t, p + "ln_2.weight", (d,), source),
                "bias": get_tensor(t, p + "ln_2.bias", (d,), source),
            },
            "mlp": {
                "fc": get_tensor(t, p + "mlp.c_fc.weight", (d, f), source),
                "fc_bias": get_tensor(t, p + "mlp.c_fc.bias", (f,), source),
                "proj": get_tensor(t, p + "mlp.c_proj.weight", (f, d), source),
                "proj_bias": get_tensor(t, p + "mlp.c_proj.bias", (d,), source),
            },
        }
    return {
        "blocks": blocks,
        "wpe": np.asarray(t["wpe.weight"][: config.max_len], np.float32),
        "ln_f": {
            "scale": get_tensor(t, "ln_f.weight", (d,), source),
            "bias": get_tensor(t, "ln_f.bias", (d,), source),
        },
    }


def _check_hf_config(path: epath.Path, config: ModelConfig) -> None:
    """If an HF ``config.json`` sits next to the weights, its head count must match too."""
    file = (path if path.is_dir() else path.parent) / "config.json"
    if not file.exists():
        return
    hf = json.loads(file.read_text())
    if "n_head" in hf and hf["n_head"] != config.num_heads:
        raise ConversionError(
            f"{file}: n_head={hf['n_head']}, but the config has {config.num_heads} heads"
        )


def gpt2_to_params(
    tensors: Mapping[str, np.ndarray],
    config: ModelConfig,
    *,
    reinit_embeddings: bool = True,
    seed: int = 0,
    source: str = "gpt2",
) -> dict:
    """Our parameter tree (pure dict of numpy) from a GPT-2 state dict, in ``config``'s layer
    layout (stacked when ``config.scan_layers``, so the trainer can drop it into its model).

    ``reinit_embeddings=False`` keeps the source ``wte`` (its rows must equal ``vocab_size``): only
    useful for parity tests against HF's own forward pass.
    """
    t = strip_prefix(tensors, "transformer.")
    t = {k: v for k, v in t.items() if not k.endswith(IGNORED_SUFFIXES)}
    check_geometry(t, config, source)
    rng = np.random.default_rng(seed)
    d = config.embed_dim
    src_wte = np.asarray(t["wte.weight"], np.float64)
    if reinit_embeddings:
        mean, std = src_wte.mean(), src_wte.std(ddof=1)
        wte = rng.normal(mean, std, size=(config.vocab_size, d))
    else:
        if src_wte.shape[0] != config.vocab_size:
            raise ConversionError(
                f"{source}: wte has {src_wte.shape[0]} rows; keeping it needs vocab_size "
                f"{config.vocab_size}"
            )
        wte = src_wte
    params = blocks_from_gpt2(t, config, source)
    params.update(
        wte=wte.astype(np.float32),
        elo_embed=rng.normal(0.0, 0.02, size=(2, d)).astype(np.float32),
        value_head=rng.normal(0.0, 0.02, size=(d, 1)).astype(np.float32),
        value_bias=np.zeros((1,), np.float32),
        time_head=rng.normal(0.0, 0.02, size=(d, 1)).astype(np.float32),
        time_bias=np.zeros((1,), np.float32),
    )
    return in_config_layout(params, config)


def in_config_layout(params: dict, config: ModelConfig) -> dict:
    """A converter's unrolled tree restacked to ``config.scan_layers``'s layout."""
    return layer_layout.to_layout(
        params, scan_layers=config.scan_layers, num_layers=config.num_layers
    )


def convert_gpt2(
    path: str | os.PathLike,
    config: ModelConfig,
    *,
    reinit_embeddings: bool = True,
    seed: int = 0,
) -> AllieModel:
    """An AllieModel initialised from HF GPT-2 weights (a file or a save_pretrained directory)."""
    path = paths.as_path(path)
    _check_hf_config(path, config)
    tensors = read_safetensors(path)
    params = gpt2_to_params(
        tensors, config, reinit_embeddings=reinit_embeddings, seed=seed, source=str(path)
    )
    return model_from_params(config, params)
