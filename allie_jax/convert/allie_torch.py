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


# Classes besides tensors and Python containers/numbers that a released checkpoint may hold and
# that torch's restricted loader is told to build (its safe globals): numpy scalars, as a loss or
# step count kept as a numpy number is pickled. Nothing else is allowed; the released trainer
# (y0mingzhang/allie, Trainer.save_ckpt) stores only tensors, dicts, lists and Python numbers.
RELEASED_SAFE_GLOBALS = (
    "numpy._core.multiarray.scalar",
    "numpy.core.multiarray.scalar",
    "numpy.dtype",
    "numpy.dtypes.Float64DType",
    "numpy.dtypes.Float32DType",
    "numpy.dtypes.Int64DType",
    "numpy.dtypes.Int32DType",
)


def read_torch_checkpoint(
    path: str | os.PathLike,
    *,
    allow_unsafe_pickle: bool = False,
    safe_globals: tuple[str, ...] = RELEASED_SAFE_GLOBALS,
) -> dict[str, np.ndarray]:
    """The ``model`` state dict of a released checkpoint as float32 numpy arrays.

    A released ``best.pt`` also holds the optimizer state (about two thirds of its 1 GB for the
    124M shape). The file is memory-mapped (``mmap=True``) so only the model tensors we copy are
    ever read; files in torch's legacy (non-zip) format cannot be mapped and are read whole.

    Unpickling runs code named in the file, so only torch's restricted loader
    (``weights_only=True``: tensors, dicts, numbers, plus exactly the classes named in
    ``safe_globals``) is used. A file it refuses is an error, not a silent retry with the full
    unpickler; ``allow_unsafe_pickle=True`` (``launch.convert --allow_unsafe_pickle``) opts into
    that for a file the caller trusts. A file that is not a readable checkpoint at all (random
    bytes, a truncated download) is called corrupt, never steered to the unsafe loader.
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
    ckpt = _torch_load(
        torch, local, weights_only=not allow_unsafe_pickle, safe_globals=safe_globals
    )
    state = ckpt.get("model", ckpt) if isinstance(ckpt, Mapping) else None
    if not isinstance(state, Mapping):
        raise ConversionError(f"{path}: expected a dict with a 'model' state dict")
    state = strip_prefix(state, "module.")  # DistributedDataParallel
    return {k: v.detach().float().cpu().numpy() for k, v in state.items() if hasattr(v, "detach")}


# The first bytes of torch's legacy (pre-1.6, non-zip) format: a pickled magic number.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


def _corrupt(path: pathlib.Path, why: str) -> ConversionError:
    return ConversionError(
        f"{path}: corrupt or truncated PyTorch checkpoint ({why}); download it again"
    )


def _torch_load(
    torch, path: pathlib.Path, *, weights_only: bool, safe_globals: tuple[str, ...] = ()
):
    """``torch.load`` memory-mapped where the format allows, restricted unless told otherwise."""
    import pickle
    import zipfile

    mmap = zipfile.is_zipfile(path)  # torch.save's default format since 1.6; legacy files are not
    if not mmap:
        with open(path, "rb") as f:
            head = f.read(len(_LEGACY_MAGIC))
        if head != _LEGACY_MAGIC:
            size = path.stat().st_size
            why = "an incomplete zip archive" if head[:2] == b"PK" else "not a zip archive"
            raise _corrupt(path, f"{why}, {size:,} bytes")
    allowed: list = []
    if weights_only and mmap:
        try:
            needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception as err:  # noqa: BLE001 - a damaged archive: torch raises many types
            raise _corrupt(path, _first_line(err)) from None
        refused = [name for name in needed if name not in safe_globals]
        if refused:
            raise _unsafe(path, ", ".join(refused))
        if needed:
            allowed = [obj for obj in map(_resolve, safe_globals) if obj is not None]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as err:
        if weights_only and "Weights only load failed" in str(err) and "GLOBAL" in str(err):
            raise _unsafe(path, _first_line(err)) from None
        if weights_only and "but got <class" in str(err):
            cls = str(err).split("but got <class", 1)[1].split(">", 1)[0].strip(" '")
            raise _unsafe(path, cls) from None
        raise _corrupt(path, _first_line(err)) from None
    except Exception as err:  # noqa: BLE001 - torch raises many types for a damaged file
        raise _corrupt(path, _first_line(err)) from None


def _unsafe(path: pathlib.Path, what: str) -> ConversionError:
    return ConversionError(
        f"{path}: holds Python objects besides tensors ({what}), which torch's safe loader "
        "(weights_only=True) does not build: unpickling them can run arbitrary code. Only for a "
        "file you trust, rerun with --allow_unsafe_pickle "
        "(read_torch_checkpoint(..., allow_unsafe_pickle=True))."
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _resolve(name: str):
    """The class ``name`` (``module.attr``), or None where this numpy has no such name."""
    import importlib

    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


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
