"""The released Allie ``best.pt`` (PyTorch) → AllieModel parameters.

Released structure (y0mingzhang/allie, ``CausalLMWithRegressionHead(CausalLMWithControlToken(
GPT2LMHeadModel))``): ``model.model.transformer.*`` is a GPT-2 body with a 1,997-row ``wte``;
``model.control_embeds.weight`` is ``[2, width]`` and an Elo id ``elo + 1997`` is embedded as
``[a, 1 − a] @ control_embeds`` with ``a = (clamp(elo, 500, 3000) − 500) / 2500`` in place of a
token row (row 0 strong, row 1 weak), before GPT-2 adds positions; ``value_head.0`` and
``time_head.0`` are ``Linear(width, 1)`` on the final (post-``ln_f``) hidden state, the value
followed by tanh; the LM head is tied to ``wte``. Reading ``.pt`` needs torch (extra ``[torch]``).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

import numpy as np

from allie_jax.convert.gpt2 import (
    IGNORED_SUFFIXES,
    ConversionError,
    blocks_from_gpt2,
    check_geometry,
    get_tensor,
    strip_prefix,
)
from allie_jax.model.checkpoint import model_from_params
from allie_jax.model.config import NAMED_SIZES, ModelConfig
from allie_jax.model.transformer import AllieModel

BODY = "model.model.transformer."
LM_HEAD = "model.model.lm_head.weight"
CONTROL = "model.control_embeds.weight"


def read_torch_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The ``model`` state dict of a released checkpoint as float32 numpy arrays."""
    path = pathlib.Path(path)
    if not path.exists():
        raise ConversionError(f"{path}: no such file")
    try:
        import torch
    except ImportError:
        raise ConversionError(
            f"reading {path} needs PyTorch: pip install 'allie-jax[torch]' (or pip install torch)"
        ) from None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - old pickles with extra objects
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:
            raise ConversionError(f"{path}: not a readable PyTorch checkpoint ({err})") from None
    state = ckpt.get("model", ckpt) if isinstance(ckpt, Mapping) else None
    if not isinstance(state, Mapping):
        raise ConversionError(f"{path}: expected a dict with a 'model' state dict")
    state = strip_prefix(state, "module.")  # DistributedDataParallel
    return {k: v.detach().float().cpu().numpy() for k, v in state.items() if hasattr(v, "detach")}


def infer_config(
    state: Mapping[str, np.ndarray], size: str | None = None, **overrides
) -> ModelConfig:
    """The config of a released state dict: ``size`` if given, else the named size that fits."""
    body = strip_prefix(state, BODY)
    if "wte.weight" not in body:
        raise ConversionError(f"not a released Allie state dict: no {BODY}wte.weight")
    vocab_rows, width = body["wte.weight"].shape
    layers = len({int(k.split(".")[1]) for k in body if k.startswith("h.")})
    positions = body["wpe.weight"].shape[0]
    if size is None:
        fits = [
            name
            for name, spec in NAMED_SIZES.items()
            if (spec["num_layers"], spec["embed_dim"]) == (layers, width)
        ]
        if not fits:
            raise ConversionError(
                f"no named size has {layers} layers × width {width}; pass size= (and overrides)"
            )
        size = fits[0]
    return ModelConfig.named(size, vocab_size=vocab_rows, max_len=positions, **overrides)


def released_to_params(
    state: Mapping[str, np.ndarray], config: ModelConfig, source: str = "best.pt"
) -> dict:
    body = strip_prefix(state, BODY)
    body = {k: v for k, v in body.items() if not k.endswith(IGNORED_SUFFIXES)}
    check_geometry(body, config, source)
    d = config.embed_dim
    wte = get_tensor(body, "wte.weight", (config.vocab_size, d), source)
    if LM_HEAD in state and not np.array_equal(state[LM_HEAD], wte):
        raise ConversionError(f"{source}: lm_head is not tied to wte; Allie ties them")
    params = blocks_from_gpt2(body, config, source)
    params.update(
        wte=wte,
        elo_embed=get_tensor(state, CONTROL, (2, d), source),
        value_head=get_tensor(state, "value_head.0.weight", (1, d), source).T.copy(),
        value_bias=get_tensor(state, "value_head.0.bias", (1,), source),
        time_head=get_tensor(state, "time_head.0.weight", (1, d), source).T.copy(),
        time_bias=get_tensor(state, "time_head.0.bias", (1,), source),
    )
    return params


def convert_released_allie(
    path: str | os.PathLike,
    *,
    size: str | None = None,
    config: ModelConfig | None = None,
    **overrides,
) -> AllieModel:
    """An AllieModel with the released weights; the config is inferred unless given."""
    state = read_torch_checkpoint(path)
    config = config or infer_config(state, size, **overrides)
    return model_from_params(config, released_to_params(state, config, source=str(path)))
