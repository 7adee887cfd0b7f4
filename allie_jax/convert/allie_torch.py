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
    in_config_layout,
    strip_prefix,
)
from allie_jax.data import paths
from allie_jax.model.checkpoint import model_from_params
from allie_jax.model.config import NAMED_SIZES, ModelConfig
from allie_jax.model.transformer import AllieModel

BODY = "model.model.transformer."
LM_HEAD = "model.model.lm_head.weight"
CONTROL = "model.control_embeds.weight"


def read_torch_checkpoint(
    path: str | os.PathLike, *, allow_unsafe_pickle: bool = False
) -> dict[str, np.ndarray]:
    """The ``model`` state dict of a released checkpoint as float32 numpy arrays.

    A released ``best.pt`` also holds the optimizer state (about two thirds of its 1 GB for the
    124M shape). The file is memory-mapped (``mmap=True``) so only the model tensors we copy are
    ever read; files in torch's legacy (non-zip) format cannot be mapped and are read whole.

    Unpickling runs code named in the file, so only torch's restricted loader
    (``weights_only=True``: tensors, dicts, numbers) is used. A file it refuses is an error, not a
    silent retry with the full unpickler; ``allow_unsafe_pickle=True`` (``launch.convert
    --allow_unsafe_pickle``) opts into that for a file the caller trusts.
    """
    path = paths.as_path(path)  # local or remote (gs://...): etils.epath
    if not path.exists():
        raise ConversionError(f"{path}: no such file")
    local = pathlib.Path(paths.local_copy(path))  # torch maps a local file (remote: a copy)
    try:
        import torch
    except ImportError:
        raise ConversionError(
            f"reading {path} needs PyTorch: pip install 'allie-jax[torch]' (or pip install torch)"
        ) from None
    ckpt = _torch_load(torch, local, weights_only=not allow_unsafe_pickle)
    state = ckpt.get("model", ckpt) if isinstance(ckpt, Mapping) else None
    if not isinstance(state, Mapping):
        raise ConversionError(f"{path}: expected a dict with a 'model' state dict")
    state = strip_prefix(state, "module.")  # DistributedDataParallel
    return {k: v.detach().float().cpu().numpy() for k, v in state.items() if hasattr(v, "detach")}


def _torch_load(torch, path: pathlib.Path, *, weights_only: bool):
    """``torch.load`` memory-mapped where the format allows, restricted unless told otherwise."""
    import pickle
    import zipfile

    mmap = zipfile.is_zipfile(path)  # torch.save's default format since 1.6; legacy files are not
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as err:
        if not weights_only:
            raise ConversionError(f"{path}: not a readable PyTorch checkpoint ({err})") from None
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConversionError(
            f"{path}: torch's safe loader (weights_only=True) refused it ({reason}). The file "
            "holds Python objects besides tensors, and unpickling those can run arbitrary code. "
            "Only for a file you trust, rerun with --allow_unsafe_pickle "
            "(read_torch_checkpoint(..., allow_unsafe_pickle=True))."
        ) from None
    except Exception as err:  # noqa: BLE001 - torch raises many types for a damaged file
        raise ConversionError(f"{path}: not a readable PyTorch checkpoint ({err})") from None


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
    return in_config_layout(params, config)


def convert_released_allie(
    path: str | os.PathLike,
    *,
    size: str | None = None,
    config: ModelConfig | None = None,
    allow_unsafe_pickle: bool = False,
    **overrides,
) -> AllieModel:
    """An AllieModel with the released weights; the config is inferred unless given.

    ``allow_unsafe_pickle``: see ``read_torch_checkpoint`` (off: refuse files that need it).
    """
    state = read_torch_checkpoint(path, allow_unsafe_pickle=allow_unsafe_pickle)
    config = config or infer_config(state, size, **overrides)
    return model_from_params(config, released_to_params(state, config, source=str(path)))
