"""The Allie decoder family (GPT-2 with soft Elo tokens): its pieces for the shared trainer.

``config.model`` holds the family's own keys (``family``, ``name``, ``init_from_gpt2``) and one
entry per ``ModelConfig`` field; an unset entry takes the named size's value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from flax import nnx

from allie_jax.data.paths import as_path
from allie_jax.data.synthetic import synthetic_batch
from allie_jax.model import family as family_lib
from allie_jax.model import layer_layout
from allie_jax.model.config import ModelConfig
from allie_jax.model.losses import combine
from allie_jax.model.transformer import AllieModel

SCRATCH = "scratch"  # --config.model.init_from_gpt2=scratch: random initial weights
OWN_KEYS = ("family", "name", "init_from_gpt2")  # config.model keys that are not ModelConfig's
TERMS = ("policy_loss", "policy_accuracy", "time_loss", "value_loss")


class CheckpointLayoutError(ValueError):
    """Parameters that fit neither layer layout of the config."""


def model_section(**values: Any) -> ml_collections.ConfigDict:
    """``config.model`` for the decoder: every ``ModelConfig`` field (``values`` set, the rest
    unset = the named size's), plus ``family``, ``name`` and ``init_from_gpt2``."""
    section = family_lib.model_section(
        ModelConfig, values={k: v for k, v in values.items() if k not in OWN_KEYS}
    )
    section.family = "allie"
    section.name = values.get("name", "tiny")
    section.init_from_gpt2 = values.get("init_from_gpt2", "")
    return section


def gpt2_init_path(config: ml_collections.ConfigDict) -> str | None:
    """The GPT-2 file to start from, or None for random weights.

    Configs that must not train from random weights by accident (``allie_medium``) leave the field
    unset; the run then stops and asks for a path or ``scratch``.
    """
    value = config.model.init_from_gpt2
    if value is None:
        raise ValueError(
            f"config.model.init_from_gpt2 is required for {config.model.name}: pass "
            "--config.model.init_from_gpt2=/path/to/gpt2-medium/model.safetensors (the paper's "
            f"start) or --config.model.init_from_gpt2={SCRATCH} (random weights)"
        )
    return None if value in ("", SCRATCH) else str(value)


def pad_rows(local: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``local`` with all-zero rows appended up to ``rows`` (segment 0, every mask 0)."""
    have = len(local["inputs"])
    if have > rows:
        raise ValueError(f"a validation batch has {have} rows, more than the {rows} expected")
    return {
        k: np.concatenate([v, np.zeros((rows - have,) + v.shape[1:], v.dtype)])
        if have < rows
        else v
        for k, v in local.items()
    }


def empty_batch(rows: int, seq_len: int) -> dict[str, np.ndarray]:
    """An all-padding batch with the pipeline's keys and dtypes (for a host out of val data)."""
    return {k: np.zeros_like(v) for k, v in synthetic_batch(rows, seq_len).items()}


def means_from_sums(sums: Mapping[str, float], weights: Sequence[float]) -> dict[str, float]:
    """Per-label means of every term and the weighted loss, from ``losses.loss_sums`` totals."""
    means = {t: float(sums[f"{t}_sum"]) / max(float(sums[f"{t}_count"]), 1.0) for t in TERMS}
    means["loss"] = float(combine(means, weights))
    means["policy_tokens"] = float(sums["policy_loss_count"])
    return means


class DecoderFamily:
    """``ModelFamily`` for ``AllieModel``."""

    name = "allie"
    config_type = ModelConfig
    loss_terms = ("policy", "time", "value")
    forward_loss = None  # the trainer's exact decoder loss (whole-batch label counts)
    eval_sums = None

    def model_config(self, config: ml_collections.ConfigDict) -> ModelConfig:
        model = config.model
        fields = [f for f in ModelConfig.__dataclass_fields__]
        family_lib.check_model_keys(model, (*OWN_KEYS, *fields), "config.model", self.name)
        overrides = {k: v for k, v in family_lib.set_values(model).items() if k not in OWN_KEYS}
        if "dropout" in overrides:
            overrides["dropout"] = float(overrides["dropout"])
        return ModelConfig.named(model.name, **overrides)

    def init_params(self, config: ml_collections.ConfigDict, model_config: ModelConfig):
        path = gpt2_init_path(config)
        if not path:
            return None
        from allie_jax.convert.gpt2 import gpt2_to_params, read_safetensors

        return gpt2_to_params(
            read_safetensors(path), model_config, seed=int(config.train.seed), source=path
        )

    def preflight(self, config: ml_collections.ConfigDict, backend: str) -> None:
        """What a run would otherwise find late: an unknown size, dtype, kernel or remat, a
        missing GPT-2 file, attention dropout with a kernel that has none."""
        self.model_config(config).check_attention_dropout(backend)
        gpt2 = gpt2_init_path(config)
        if gpt2 and not as_path(gpt2).is_file():
            raise FileNotFoundError(f"config.model.init_from_gpt2 names a missing file: {gpt2}")

    def describe(self, config, model_config: ModelConfig, backend: str) -> str:
        """The run's first console line about its model."""
        gpt2 = gpt2_init_path(config)
        start = f"GPT-2 weights from {gpt2}" if gpt2 else "random initial weights (scratch)"
        return (
            f"model {config.model.name}, {start}, attention "
            f"{model_config.resolved_attention_impl(backend)}, remat {model_config.remat}"
        )

    def build(self, model_config: ModelConfig, seed: int) -> AllieModel:
        return AllieModel(model_config, rngs=nnx.Rngs(seed))

    def data_iterator(
        self,
        config,
        split,
        *,
        local_batch,
        shard_index,
        shard_count,
        augment,
        num_epochs=None,
        seed=None,
    ):
        from allie_jax.data.pipeline import make_iterator

        train = split == "train"
        return make_iterator(
            config.data.data_dir,
            split,
            batch_size=local_batch,
            seq_len=int(config.data.seq_len),
            seed=int(config.data.seed if seed is None else seed),
            shard_index=shard_index,
            shard_count=shard_count,
            augment=augment,
            num_epochs=num_epochs,
            worker_count=int(config.data.get("worker_count", 0)) if train else 0,
            # One segment slot of the cuDNN kernel's static layout stays for the padding run.
            max_games_per_row=self.model_config(config).max_segments_per_row - 1,
            worker_buffer_size=int(config.data.get("worker_buffer_size", 1)),
        )

    def example_batch(self, config, rows: int) -> dict[str, np.ndarray]:
        return empty_batch(rows, int(config.data.seq_len))

    def pad_batch(self, local, rows: int) -> dict[str, np.ndarray]:
        return pad_rows(local, rows)

    def validation_means(self, sums, weights) -> dict[str, float]:
        return means_from_sums(sums, weights)

    def config_from_dict(self, data: Mapping[str, Any]) -> ModelConfig:
        """``config.json``: the ModelConfig fields themselves; or a ``"model"`` entry holding
        either those fields, a size name (``"allie_medium"``), or ``{"size": name, **overrides}``."""
        fields = set(ModelConfig.__dataclass_fields__)
        data = {k: v for k, v in data.items() if k != "family"}
        if data and set(data) <= fields:
            return ModelConfig.from_dict(dict(data))
        model = data.get("model")
        if isinstance(model, str):
            return ModelConfig.named(model)
        if isinstance(model, Mapping):
            model = dict(model)
            size = model.pop("size", None) or model.pop("name", None)
            overrides = {k: v for k, v in model.items() if k in fields}
            return (
                ModelConfig.named(size, **overrides) if size else ModelConfig.from_dict(overrides)
            )
        raise ValueError("no model configuration (ModelConfig fields or a 'model' entry)")

    def restore_config(self, config: ModelConfig, saved: ModelConfig) -> ModelConfig:
        """Restore in the layer layout the checkpoint was written in (``checkpoint_params``
        restacks it to ``config``'s)."""
        return dataclasses.replace(config, scan_layers=saved.scan_layers)

    def checkpoint_params(self, params: Mapping, model_config: ModelConfig) -> dict:
        """Either layer layout, restacked to ``model_config.scan_layers``'s."""
        try:
            return layer_layout.to_layout(
                params, scan_layers=model_config.scan_layers, num_layers=model_config.num_layers
            )
        except layer_layout.LayerLayoutError as err:
            raise CheckpointLayoutError(f"parameters do not fit the config: {err}") from None


FAMILY = DecoderFamily()
