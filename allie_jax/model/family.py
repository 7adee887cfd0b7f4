"""Model families: one interface the trainer, checkpoints and compile check call, one registry.

A family is everything that differs between networks trained or played by this library: how its
frozen config is read from an ``ml_collections`` training config, how the model is built, its loss
and validation sums, its batches, how a checkpoint's ``config.json`` and parameters are read back.
``train/loop.py``, ``train/programs.py`` and ``model/checkpoint.py`` call these methods and never
ask which family they hold, so a fourth family is its own module plus one line in ``_REGISTRY``
(as levanter's ``LmConfig`` registry).

The families: ``allie`` (the GPT-2 decoder, ``model/decoder_family.py``), ``board`` (seed 001's
board-state transformer, ``model/board_family.py``) and ``maia`` (Maia-1 nets read from lc0 files,
``baselines/maia_family.py``; inference only: lc0 trained them).

Every field of a family's frozen config is reachable from ``--config.model.*`` (``model_section``
writes a placeholder for each), and a key the family does not read is an error naming it
(``check_model_keys``): a misspelt or unused setting never passes silently.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import ml_collections
import numpy as np
from ml_collections import config_dict

DEFAULT_FAMILY = "allie"

# name -> module holding ``FAMILY`` (imported on first use: a decoder run never imports lc0 code)
_REGISTRY: dict[str, str] = {
    "allie": "allie_jax.model.decoder_family",
    "board": "allie_jax.model.board_family",
    "maia": "allie_jax.baselines.maia_family",
}


class FamilyError(ValueError):
    """A training or model config that names no family, or settings its family does not read."""


@runtime_checkable
class ModelFamily(Protocol):
    """What the trainer, the checkpoint reader and the compile check need from a family."""

    name: str
    config_type: type  # the family's frozen config dataclass (a ``NamedConfig``)
    loss_terms: tuple[str, ...]  # the names of ``config.train.loss_weights``, in order
    # ``forward_loss(model, batch, deterministic, loss_weights) -> (loss, metrics)`` and
    # ``eval_sums(model, batch) -> sums``; None: the decoder's exact, label-count-aware loss
    forward_loss: Callable | None
    eval_sums: Callable | None

    def model_config(self, config: ml_collections.ConfigDict) -> Any:
        """The frozen model config a training config describes (errors name the field)."""

    def init_params(self, config: ml_collections.ConfigDict, model_config: Any) -> dict | None:
        """Parameters to start from (a pure dict), or None for the family's random init."""

    def preflight(self, config: ml_collections.ConfigDict, backend: str) -> None:
        """Errors a run would otherwise meet late (bad fields, missing files), before devices."""

    def describe(self, config: ml_collections.ConfigDict, model_config: Any, backend: str) -> str:
        """The run's first console line about its model."""

    def build(self, model_config: Any, seed: int) -> Any:
        """A fresh model (``nnx.Module``) with random weights from ``seed``."""

    def data_iterator(
        self,
        config: ml_collections.ConfigDict,
        split: str,
        *,
        local_batch: int,
        shard_index: int,
        shard_count: int,
        augment: bool,
        num_epochs: int | None,
        seed: int | None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """This process's batches of ``split``."""

    def example_batch(self, config: ml_collections.ConfigDict, rows: int) -> dict[str, np.ndarray]:
        """A batch of ``rows`` all-padding rows with the pipeline's keys, shapes and dtypes (a
        host out of validation data feeds it; the compile check lowers against its shapes)."""

    def pad_batch(self, local: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """``local`` padded to ``rows`` with rows that count for nothing."""

    def validation_means(
        self, sums: Mapping[str, Any], weights: Sequence[float]
    ) -> dict[str, float]:
        """Per-label means and the weighted loss from summed ``eval_sums``."""

    def config_from_dict(self, data: Mapping[str, Any]) -> Any:
        """The frozen config from a model dir's ``config.json``."""

    def restore_config(self, config: Any, saved: Any) -> Any:
        """The config to restore a checkpoint saved with ``saved`` into, before
        ``checkpoint_params`` brings it to ``config`` (the decoder: the saved layer layout)."""

    def checkpoint_params(self, params: Mapping, model_config: Any) -> dict:
        """A checkpoint's parameters in the layout ``model_config`` builds (or an error)."""


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> ModelFamily:
    """The family registered as ``name``."""
    try:
        module = _REGISTRY[name]
    except KeyError:
        raise FamilyError(
            f"unknown model family {name!r}; expected one of {sorted(_REGISTRY)}"
        ) from None
    return importlib.import_module(module).FAMILY


def name_of_config(config: ml_collections.ConfigDict) -> str:
    """``config.model.family`` (``allie`` when a config leaves it out)."""
    return str(config.model.get("family", None) or DEFAULT_FAMILY)


def of_config(config: ml_collections.ConfigDict) -> ModelFamily:
    """The family a training config selects."""
    return get(name_of_config(config))


def of_model_config(model_config: Any) -> ModelFamily:
    """The family of a frozen model config (its ``family`` field; the decoder has none)."""
    return get(str(getattr(model_config, "family", DEFAULT_FAMILY)))


def of_json(data: Mapping[str, Any]) -> ModelFamily:
    """The family of a model dir's ``config.json`` contents."""
    return get(str(data.get("family", DEFAULT_FAMILY)))


# ---------------------------------------------------------------- config sections, one rule each
_PLACEHOLDER_TYPES = (bool, int, float, str)


def _placeholder(field: dataclasses.Field) -> Any:
    """An unset ml_collections field typed like ``field`` (None means: the named size's value)."""
    kind = field.type if isinstance(field.type, type) else None
    if kind is None:  # ``from __future__ import annotations``: the type is a string
        text = str(field.type)
        kind = next((t for t in _PLACEHOLDER_TYPES if text.startswith(t.__name__)), str)
    return config_dict.placeholder(kind)


def model_section(
    config_type: type, *, skip: Sequence[str] = (), values: Mapping[str, Any] | None = None
) -> ml_collections.ConfigDict:
    """One ``ConfigDict`` entry per field of ``config_type`` (except ``skip``): the given
    ``values`` where set, a typed placeholder (None = the named size's value) elsewhere."""
    values = dict(values or {})
    section = ml_collections.ConfigDict()
    for field in dataclasses.fields(config_type):
        if field.name in skip:
            continue
        if field.name in values:
            section[field.name] = values.pop(field.name)
        else:
            section[field.name] = _placeholder(field)
    if values:
        raise FamilyError(f"{config_type.__name__} has no fields {sorted(values)}")
    return section


def check_model_keys(
    section: ml_collections.ConfigDict, allowed: Sequence[str], where: str, family: str
) -> None:
    """Every key of ``section`` is one ``family`` reads; otherwise one error naming the keys."""
    unused = sorted(set(section.keys()) - set(allowed))
    if unused:
        raise FamilyError(
            f"{', '.join(f'{where}.{k}' for k in unused)}: not a setting of the {family!r} "
            f"model family (its settings: {', '.join(sorted(allowed))})"
        )


def set_values(section: ml_collections.ConfigDict) -> dict[str, Any]:
    """The keys of ``section`` a config or a flag set (placeholders left unset are skipped)."""
    out = {}
    for key in section.keys():
        value = section[key]
        if isinstance(value, ml_collections.ConfigDict):
            continue
        if value is not None:
            out[key] = tuple(value) if isinstance(value, list) else value
    return out


def check_loss_weights(config: ml_collections.ConfigDict, family: ModelFamily) -> tuple:
    """``config.train.loss_weights``, one weight per term of ``family`` (else an error)."""
    weights = tuple(float(w) for w in config.train.loss_weights)
    if len(weights) != len(family.loss_terms):
        raise FamilyError(
            f"config.train.loss_weights={weights}: the {family.name!r} family needs "
            f"{len(family.loss_terms)} weights ({', '.join(family.loss_terms)})"
        )
    return weights
