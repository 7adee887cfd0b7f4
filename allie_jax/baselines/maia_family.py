"""Maia-1 as a model family: lc0 SE-ResNets read from their ``.pb.gz`` files, inference only.

lc0 trained the nine Maia-1 nets; this library reads them (``baselines/maia.py``) and plays or
evaluates them (``maia:DIR`` systems and players). So the family builds, describes and restores a
``MaiaNet`` like the others, and its training members stop with one line saying why, instead of a
half-working trainer. ``config.model`` for it: ``family="maia"``, ``name`` (a label) and
``weights`` (a ``.pb.gz`` path), plus the ``MaiaConfig`` shape fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from allie_jax.baselines.maia import MaiaConfig, MaiaNet, load_maia
from allie_jax.model import family as family_lib

OWN_KEYS = ("family", "name", "weights")
_INFERENCE_ONLY = (
    "the maia family is inference only: lc0 trained the Maia-1 nets, and allie-jax reads their "
    ".pb.gz files (play or evaluate them as maia:DIR); launch.train cannot train it"
)


def model_section(weights: str = "", **values: Any) -> ml_collections.ConfigDict:
    section = family_lib.model_section(MaiaConfig, values=values)
    section.family = "maia"
    section.name = "maia1"
    section.weights = weights
    return section


class MaiaFamily:
    """``ModelFamily`` for ``MaiaNet``."""

    name = "maia"
    config_type = MaiaConfig
    loss_terms = ("policy", "value")
    forward_loss = None
    eval_sums = None

    def model_config(self, config: ml_collections.ConfigDict) -> MaiaConfig:
        fields = [f.name for f in dataclasses.fields(MaiaConfig)]
        family_lib.check_model_keys(config.model, (*OWN_KEYS, *fields), "config.model", self.name)
        values = family_lib.set_values(config.model)
        return MaiaConfig(**{k: v for k, v in values.items() if k in fields})

    def init_params(self, config: ml_collections.ConfigDict, model_config: MaiaConfig) -> dict:
        from flax import nnx

        net = load_maia(config.model.weights)
        if net.config != model_config:
            raise family_lib.FamilyError(
                f"config.model.weights={config.model.weights}: a {net.config} net, not the "
                f"configured {model_config}"
            )
        return nnx.state(net, nnx.Param).to_pure_dict()

    def preflight(self, config, backend: str) -> None:
        raise family_lib.FamilyError(_INFERENCE_ONLY)

    def describe(self, config, model_config: MaiaConfig, backend: str) -> str:
        return f"Maia-1 net {config.model.weights or '(random)'} ({model_config})"

    def build(self, model_config: MaiaConfig, seed: int) -> MaiaNet:
        from flax import nnx

        return MaiaNet(model_config, rngs=nnx.Rngs(seed))

    def data_iterator(self, config, split, **_: Any):
        raise family_lib.FamilyError(_INFERENCE_ONLY)

    def example_batch(self, config, rows: int):
        raise family_lib.FamilyError(_INFERENCE_ONLY)

    def pad_batch(self, local, rows: int):
        raise family_lib.FamilyError(_INFERENCE_ONLY)

    def validation_means(self, sums, weights):
        raise family_lib.FamilyError(_INFERENCE_ONLY)

    def config_from_dict(self, data: Mapping[str, Any]) -> MaiaConfig:
        fields = {f.name for f in dataclasses.fields(MaiaConfig)}
        unknown = set(data) - fields - {"family"}
        if unknown:
            raise ValueError(f"unknown MaiaConfig fields: {sorted(unknown)}")
        return MaiaConfig(**{k: v for k, v in data.items() if k in fields})

    def restore_config(self, config: MaiaConfig, saved: MaiaConfig) -> MaiaConfig:
        return config

    def checkpoint_params(self, params: Mapping, model_config: MaiaConfig) -> dict:
        return dict(params)


FAMILY = MaiaFamily()
