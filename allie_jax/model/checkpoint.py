"""Saving and loading models: ``DIR/config.json`` + ``DIR/params`` (Orbax), training workdirs, safetensors.

A model directory holds exactly the parameters (an ``nnx.State`` of ``nnx.Param`` as a pure dict)
and the ``ModelConfig`` that shapes them. ``load_model`` also accepts a training workdir:

    WORKDIR/config.json                      the run's config (see ``config_from_json``)
    WORKDIR/checkpoints/<step>/params/       Orbax CheckpointManager item "params" (pure dict)
    WORKDIR/best/<step>/params/              the step with the lowest validation loss

and restores its best step (``best/``, else the lowest saved ``val_loss`` metric), else its latest. ``restore_params_from_workdir`` is that second half on its own, so the
training code can reuse or adapt it.

Either layer layout (``ModelConfig.scan_layers``: ``blocks.{i}.*`` or stacked ``layers.*``) loads
into the other: checkpoints are restored in the layout they were saved in (their ``config.json``)
and ``model_from_params`` restacks them for the config asked for (``model/layer_layout.py``).

Model directories and workdirs are user paths, so they go through ``etils.epath``: ``gs://b/run``
is read from Cloud Storage (Orbax's arrays through TensorStore's own gcs driver), never turned
into a local ``./gs:/b/run`` as ``pathlib`` would.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import zipfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from allie_jax.data.paths import as_path, is_remote, local_copy
from allie_jax.model import family as family_lib
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel, shapes_only

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"


class CheckpointError(ValueError):
    """A checkpoint path that cannot be read as a model; the message names the path."""


# ---------------------------------------------------------------------------- building models
def abstract_model(config: Any) -> Any:
    """A model of ``config``'s family whose parameters are shapes only (no memory, no init).

    A new object each call, from one traced construction per config (a load needs the abstract
    model twice), traced under ``shapes_only``: tracing the random init itself would be most of
    a checkpoint load.
    """
    try:
        graphdef, state = _abstract_parts(config)
    except TypeError:  # an unhashable config: trace it every time
        return _traced_abstract_model(config)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x, state))


@functools.lru_cache(maxsize=8)
def _abstract_parts(config: Any) -> tuple[Any, Any]:
    return nnx.split(_traced_abstract_model(config))


def _traced_abstract_model(config: Any) -> Any:
    family = family_lib.of_model_config(config)
    with shapes_only():  # no random init traced: see ``transformer.shapes_only``
        return nnx.eval_shape(lambda: family.build(config, 0))


def abstract_params(config: ModelConfig) -> dict:
    """The pure-dict tree of ``jax.ShapeDtypeStruct`` that checkpoints of ``config`` must match."""
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    state = nnx.state(abstract_model(config), nnx.Param).to_pure_dict()
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)


def model_from_params(config: ModelConfig, params: Mapping, *, seed: int = 0) -> AllieModel:
    """An ``AllieModel`` holding ``params`` (a pure dict), without allocating a random init first.

    ``params`` may be in either layer layout; it is restacked to ``config.scan_layers``'s.
    """
    model = abstract_model(config)
    state = nnx.state(model, nnx.Param)
    try:
        params = family_lib.of_model_config(config).checkpoint_params(_int_keys(params), config)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    expected = flatten_params(state.to_pure_dict(), to_numpy=False)
    got = flatten_params(params, to_numpy=False)
    if set(expected) != set(got):
        raise CheckpointError(
            "parameter names do not match the config: "
            f"missing {sorted(set(expected) - set(got))[:5]}, "
            f"unexpected {sorted(set(got) - set(expected))[:5]}"
        )
    for name, want in expected.items():
        if tuple(got[name].shape) != tuple(want.shape):
            raise CheckpointError(
                f"parameter {name}: shape {tuple(got[name].shape)} in the checkpoint, "
                f"{tuple(want.shape)} in the config"
            )
    dtype = config.parameter_dtype
    state.replace_by_pure_dict(unflatten_params({k: jnp.asarray(v, dtype) for k, v in got.items()}))
    nnx.update(model, state)
    _materialise_rngs(model, seed)
    return model


def _materialise_rngs(model: AllieModel, seed: int) -> None:
    """Give the dropout streams of an abstract model real keys (they carry no learned state).

    A stacked layer's stream holds one key per layer (shape ``[layers]``): each gets its own.
    """
    state = nnx.state(model, nnx.RngState)
    leaves, treedef = jax.tree.flatten(state)
    fresh = [
        _fresh_keys(jax.random.fold_in(jax.random.key(seed), i), x.shape)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        else jnp.zeros(x.shape, x.dtype)
        for i, x in enumerate(leaves)
    ]
    nnx.update(model, jax.tree.unflatten(treedef, fresh))


def _fresh_keys(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.split(key, shape) if shape else key


def with_layer_layout(model: AllieModel, *, scan_layers: bool) -> AllieModel:
    """``model`` itself when already in that layout, else a new model with the same weights.

    Inference uses this to run a scanned training checkpoint unrolled (the search reads one
    layer at a time); the dropout streams are fresh, the parameters identical.
    """
    config = model.config
    if getattr(config, "scan_layers", scan_layers) == scan_layers:
        return model
    config = dataclasses.replace(config, scan_layers=scan_layers)
    return model_from_params(config, params_dict(model))


def _int_keys(tree: Any) -> Any:
    """Orbax restores ``nnx.List`` indices as strings when no target is given; undo that."""
    if isinstance(tree, Mapping):
        return {
            (int(k) if isinstance(k, str) and k.isdigit() else k): _int_keys(v)
            for k, v in tree.items()
        }
    return tree


# ---------------------------------------------------------------------------- model directories
def _user_path(path: str | os.PathLike) -> epath.Path:
    """A user's checkpoint path through epath; absolute when local (Orbax wants that)."""
    path = as_path(path)
    return path if is_remote(path) else path.absolute()


def params_dict(model: AllieModel) -> dict:
    return nnx.state(model, nnx.Param).to_pure_dict()


def save_model(model: AllieModel, path: str | os.PathLike) -> pathlib.Path | epath.Path:
    """Write ``path/config.json`` and ``path/params`` (overwriting a previous save).

    Returns the absolute directory: a ``pathlib.Path`` when local, an ``epath.Path`` for URLs.
    """
    path = _user_path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(model.config.to_json())
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / PARAMS_DIR, params_dict(model), force=True)
    checkpointer.wait_until_finished()
    return path if is_remote(path) else pathlib.Path(path)


def config_from_json(data: Mapping[str, Any], *, source: str = "config") -> Any:
    """The frozen model config of a model dir's or a training run's ``config.json``, read by
    the family it names (``family``; the decoder's files have none)."""
    try:
        return family_lib.of_json(data).config_from_dict(data)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{source}: {err}") from None


def _read_config(path: epath.Path) -> ModelConfig:
    file = path / CONFIG_FILE
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: not JSON ({err})") from None
    return config_from_json(data, source=str(file))


TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _is_zip(path: str | os.PathLike) -> bool:
    try:
        with as_path(path).open("rb") as f:
            return zipfile.is_zipfile(f)
    except OSError:
        return False


def file_instead_of_directory(path: pathlib.Path | epath.Path) -> str:
    """What to do when a file is given where a model directory or workdir is expected.

    The usual case is a newcomer passing the released Allie ``best.pt``: it must be converted once
    (it is PyTorch, and may need torch's unpickler), so we name the exact command rather than
    converting behind their back.
    """
    if path.suffix in TORCH_SUFFIXES or _is_zip(path):
        return (
            f"{path} is a PyTorch file (the released Allie best.pt?), not an allie-jax checkpoint "
            "directory. Convert it once: python -m launch.convert --format allie "
            f"--input {path} --output DIR (needs the [torch] extra), then pass DIR"
        )
    if path.suffix == ".safetensors":
        return (
            f"{path} is a safetensors file; load it with "
            "allie_jax.model.checkpoint.load_safetensors, or pass a model directory"
        )
    return (
        f"{path} is a file; expected a model directory (config.json + params/) or a training "
        "workdir (config.json + checkpoints/)"
    )


def best_or_latest_step(
    manager: ocp.CheckpointManager, best_metric: str = "val_loss", best_mode: str = "min"
) -> int | None:
    """The step whose saved metrics have the best ``best_metric``; the latest if none has it."""
    scored = []
    for step in manager.all_steps():
        metrics = manager.metrics(step) or {}
        if best_metric in metrics:
            scored.append((float(metrics[best_metric]), step))
    if scored:
        pick = min if best_mode == "min" else max
        return pick(scored)[1]
    return manager.latest_step()


def restore_params_from_workdir(
    workdir: str | os.PathLike,
    config: ModelConfig,
    step: int | None = None,
    *,
    best_metric: str = "val_loss",
    best_mode: str = "min",
) -> tuple[dict, int]:
    """Params (pure dict) of a run's best step (by saved metrics), else its latest, and the step.

    The run saves with ``CheckpointManager(WORKDIR/checkpoints).save(step,
    args=ocp.args.Composite(params=ocp.args.StandardSave(pure_dict), ...), metrics={...})``;
    other items (optimizer state, data iterator) are ignored here.
    """
    workdir = _user_path(workdir)
    ckpt_dir = workdir / CHECKPOINTS_DIR
    # The training loop keeps the best-by-validation step in WORKDIR/best (see train/checkpoints.py).
    best_dir = workdir / BEST_DIR
    if step is None and best_dir.is_dir() and any(p.name.isdigit() for p in best_dir.iterdir()):
        ckpt_dir = best_dir
    manager = ocp.CheckpointManager(ckpt_dir)
    try:
        if step is None:
            step = best_or_latest_step(manager, best_metric, best_mode)
        if step is None:
            raise CheckpointError(f"{ckpt_dir}: no checkpoints")
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                **{PARAMS_DIR: ocp.args.StandardRestore(abstract_params(config))}
            ),
        )
    finally:
        manager.close()
    return dict(restored[PARAMS_DIR]), int(step)


def load_model(
    path: str | os.PathLike, *, step: int | None = None, **config_overrides: Any
) -> AllieModel:
    """A model from a model directory or a training workdir.

    ``config_overrides`` change non-shape fields at load time, e.g. ``dtype="bfloat16"`` for
    inference or ``dropout=0.0``; ``scan_layers`` picks the layer layout whatever the saved one.
    """
    path = _user_path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    if path.is_file():
        raise CheckpointError(file_instead_of_directory(path))
    saved = _read_config(path)
    config = saved
    if config_overrides:
        config = type(config).from_dict({**config.to_dict(), **config_overrides})
    # Restore in the layout the checkpoint was written in; model_from_params restacks it.
    as_saved = family_lib.of_model_config(config).restore_config(config, saved)
    if (path / PARAMS_DIR).exists():
        params = ocp.StandardCheckpointer().restore(path / PARAMS_DIR, abstract_params(as_saved))
    elif (path / CHECKPOINTS_DIR).exists():
        params, _ = restore_params_from_workdir(path, as_saved, step)
    else:
        raise CheckpointError(
            f"{path}: neither a model directory ({PARAMS_DIR}/) nor a training workdir "
            f"({CHECKPOINTS_DIR}/)"
        )
    return model_from_params(config, params)


# ---------------------------------------------------------------------------- safetensors
def flatten_params(params: Mapping, *, to_numpy: bool = True) -> dict[str, Any]:
    """``{"blocks.0.attn.query": array, ...}``: the names used in safetensors exports."""
    out: dict[str, np.ndarray] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = np.asarray(node) if to_numpy else node

    walk("", params)
    return out


def unflatten_params(flat: Mapping[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split(".")
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[leaf] = value
    return tree


def export_safetensors(model: AllieModel, path: str | os.PathLike) -> pathlib.Path:
    """All parameters in one ``.safetensors`` file, the config JSON in its metadata."""
    from safetensors.numpy import save_file

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {k: np.ascontiguousarray(v) for k, v in flatten_params(params_dict(model)).items()}
    save_file(flat, str(path), metadata={"config": model.config.to_json()})
    return path


def load_safetensors(path: str | os.PathLike) -> AllieModel:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    path = as_path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    local = local_copy(path)  # safetensors memory-maps a local file; a URL is fetched once
    with safe_open(local, framework="numpy") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        raise CheckpointError(f"{path}: no 'config' in the safetensors metadata")
    config = config_from_json(json.loads(meta["config"]), source=str(path))
    return model_from_params(config, unflatten_params(load_file(local)))
