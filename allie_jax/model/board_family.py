"""The board family (seed 001's board-state transformer): its ``ModelFamily`` for the trainer.

``config.model.family = "board"`` selects it (``model/family.py``); ``config.model.board`` holds
one entry per ``BoardConfig`` field.

Loss (``loss_weights`` = policy, choice, rights, value):
- policy: cross-entropy of the pass-1 policy on the move played (illegal moves masked or not by
  the model's ``mask_illegal``);
- choice: cross-entropy of the pass-2 3-way choice on the human move's slot, only for positions
  whose move is among the pass-1 top 3 (the refinement is trained end to end with the trunk);
- rights: binary cross-entropy of the 13 castling / en-passant rights after the move (fc3);
- value: squared error of the tanh value on the game result (White's view), where known.

``policy_accuracy`` is the accuracy of the final (refined) move, what the model would play;
``pass1_accuracy`` the argmax of pass 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from allie_jax.data import board_features
from allie_jax.model import family as family_lib
from allie_jax.model.board_transformer import BoardConfig, BoardOutputs, BoardTransformer

FAMILY_NAME = "board"
DEFAULT_LOSS_WEIGHTS = (1.0, 1.0, 0.5, 1.0)  # policy, choice, rights, value


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def model_inputs(batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The input fields of a batch (targets dropped), as jax arrays."""
    return {k: jnp.asarray(batch[k]) for k in board_features.INPUT_FIELDS}


TERMS = (
    "policy_loss",
    "choice_loss",
    "rights_loss",
    "value_loss",
    "policy_accuracy",
    "pass1_accuracy",
    "top3_rate",
    "rights_accuracy",
)


def _terms(outputs: BoardOutputs, batch: Mapping[str, jax.Array]) -> dict:
    """{name: (per-position value, mask)} of every loss term and metric."""
    target = jnp.asarray(batch["policy_target"], jnp.int32)
    has_target = (target >= 0).astype(jnp.float32)
    safe = jnp.clip(target, 0, outputs.policy_logits.shape[-1] - 1)

    ce = optax.softmax_cross_entropy_with_integer_labels(outputs.policy_logits, safe)

    slot_hit = outputs.candidates == target[:, None]  # [B, 3]
    in_top3 = slot_hit.any(-1).astype(jnp.float32) * has_target
    slot = jnp.argmax(slot_hit, axis=-1)
    choice_ce = optax.softmax_cross_entropy_with_integer_labels(outputs.choice_logits, slot)

    rights_t = jnp.asarray(batch["rights_target"], jnp.float32)
    rights_bce = optax.sigmoid_binary_cross_entropy(outputs.rights_logits, rights_t).mean(-1)

    value_t = jnp.asarray(batch["value_target"], jnp.float32)
    has_value = jnp.isfinite(value_t).astype(jnp.float32)
    value_err = jnp.square(outputs.value - jnp.where(has_value > 0, value_t, 0.0))
    final_move = jnp.argmax(outputs.final_log_probs, -1)
    pass1_move = jnp.argmax(outputs.policy_logits, -1)
    rights_ok = ((outputs.rights_logits > 0) == (rights_t > 0.5)).all(-1).astype(jnp.float32)
    return {
        "policy_loss": (ce, has_target),
        "choice_loss": (choice_ce, in_top3),
        "rights_loss": (rights_bce, has_target),
        "value_loss": (value_err, has_value),
        "policy_accuracy": ((final_move == target).astype(jnp.float32), has_target),
        "pass1_accuracy": ((pass1_move == target).astype(jnp.float32), has_target),
        "top3_rate": (in_top3, has_target),
        "rights_accuracy": (rights_ok, has_target),
    }


def combine(means: Mapping[str, Any], weights: Sequence[float]):
    """The objective from its four parts (one definition for training and validation)."""
    if len(weights) != 4:
        raise ValueError(f"board loss weights must be (policy, choice, rights, value): {weights!r}")
    w_policy, w_choice, w_rights, w_value = weights
    return (
        w_policy * means["policy_loss"]
        + w_choice * means["choice_loss"]
        + w_rights * means["rights_loss"]
        + w_value * means["value_loss"]
    )


def board_loss(
    outputs: BoardOutputs,
    batch: Mapping[str, jax.Array],
    weights: Sequence[float] = DEFAULT_LOSS_WEIGHTS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted sum of the four losses, and the metrics."""
    if len(weights) != 4:
        raise ValueError(f"board loss weights must be (policy, choice, rights, value): {weights!r}")
    terms = _terms(outputs, batch)
    metrics = {name: _masked_mean(v, m) for name, (v, m) in terms.items()}
    metrics["loss"] = combine(metrics, weights)
    metrics["policy_tokens"] = jnp.sum(terms["policy_loss"][1])
    return metrics["loss"], metrics


def board_loss_sums(outputs: BoardOutputs, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Masked sums and counts (``<name>_sum``, ``<name>_count``) of every term, for validation."""
    out = {}
    for name, (values, mask) in _terms(outputs, batch).items():
        out[f"{name}_sum"] = jnp.sum(values * mask)
        out[f"{name}_count"] = jnp.sum(mask)
    return out


def pad_rows(local: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """A validation batch padded to ``rows`` with label-free positions (they count for nothing)."""
    have = len(local["side"])
    if have > rows:
        raise ValueError(f"a validation batch has {have} rows, more than the {rows} expected")
    if have == rows:
        return dict(local)
    pad = empty_batch(rows - have)
    return {k: np.concatenate([local[k], pad[k]]) for k in board_features.FIELDS}


def empty_batch(rows: int) -> dict[str, np.ndarray]:
    """``rows`` label-free positions with the pipeline's keys, shapes and dtypes."""
    pad = {
        k: np.zeros((rows, *shape), dtype) for k, (shape, dtype) in board_features.FIELDS.items()
    }
    pad["policy_target"][:] = -1
    pad["value_target"][:] = np.nan
    return pad


def validation_means(sums: Mapping[str, Any], weights: Sequence[float]) -> dict[str, float]:
    """Per-label means of every term and the weighted loss, from summed ``board_loss_sums``."""
    means = {t: float(sums[f"{t}_sum"]) / max(float(sums[f"{t}_count"]), 1.0) for t in TERMS}
    means["loss"] = float(combine(means, weights))
    means["policy_tokens"] = float(sums["policy_loss_count"])
    return means


OWN_KEYS = ("family", "name", "dtype", "dropout", "board")  # config.model's keys
SHARED_FIELDS = ("family", "dtype", "dropout")  # BoardConfig fields kept at config.model level


def model_section(name: str, **values: Any) -> ml_collections.ConfigDict:
    """``config.model`` for the board family: ``family``, ``name``, ``dtype``, ``dropout`` and
    ``board`` with one entry per other ``BoardConfig`` field (``values`` set, the rest unset =
    the named size's)."""
    section = ml_collections.ConfigDict()
    section.family = FAMILY_NAME
    section.name = name
    section.dtype = values.pop("dtype", "float32")
    section.dropout = float(values.pop("dropout", 0.0))
    section.board = family_lib.model_section(BoardConfig, skip=SHARED_FIELDS, values=values)
    return section


class BoardFamily:
    """``ModelFamily`` for ``BoardTransformer``: one position per example, four loss terms."""

    name = FAMILY_NAME
    config_type = BoardConfig
    loss_terms = ("policy", "choice", "rights", "value")

    def model_config(self, config: ml_collections.ConfigDict) -> BoardConfig:
        model = config.model
        family_lib.check_model_keys(model, OWN_KEYS, "config.model", self.name)
        board = model.get("board", None) or ml_collections.ConfigDict()
        fields = [f for f in BoardConfig.__dataclass_fields__ if f not in SHARED_FIELDS]
        family_lib.check_model_keys(board, fields, "config.model.board", self.name)
        return BoardConfig.named(
            model.name,
            dtype=model.dtype,
            dropout=float(model.dropout),
            **family_lib.set_values(board),
        )

    @staticmethod
    def forward_loss(model: BoardTransformer, batch, deterministic: bool, loss_weights):
        """One forward (both passes) and the loss."""
        outputs = model(model_inputs(batch), deterministic=deterministic)
        return board_loss(outputs, batch, tuple(loss_weights))

    @staticmethod
    def eval_sums(model: BoardTransformer, batch) -> dict[str, jax.Array]:
        """Masked loss sums with dropout off."""
        return board_loss_sums(model(model_inputs(batch), deterministic=True), batch)

    def init_params(self, config, model_config) -> None:
        return None  # no pretrained start for this family

    def preflight(self, config, backend: str) -> None:
        self.model_config(config)  # unknown size or field: an error before any device work

    def describe(self, config, model_config: BoardConfig, backend: str) -> str:
        return (
            f"board model {config.model.name}, random initial weights, attention "
            f"{model_config.resolved_attention_impl(backend)}, remat {model_config.remat}"
        )

    def build(self, model_config: BoardConfig, seed: int) -> BoardTransformer:
        from flax import nnx

        return BoardTransformer(model_config, rngs=nnx.Rngs(seed))

    def data_iterator(
        self,
        config,
        split: str,
        *,
        local_batch: int,
        shard_index: int,
        shard_count: int,
        augment: bool,
        num_epochs=None,
        seed: int | None = None,
    ):
        """Board batches; the rating curriculum only for training."""
        from allie_jax.data.board_pipeline import make_board_iterator

        del augment  # the board examples have no augmentation
        return make_board_iterator(
            config.data.data_dir,
            split,
            batch_size=local_batch,
            seed=int(config.data.seed if seed is None else seed),
            shard_index=shard_index,
            shard_count=shard_count,
            num_epochs=num_epochs,
            curriculum=bool(config.data.get("curriculum", False)) and split == "train",
            shuffle_window=int(config.data.get("shuffle_window", 2048)),
        )

    def example_batch(self, config, rows: int) -> dict[str, np.ndarray]:
        return empty_batch(rows)

    def pad_batch(self, local, rows: int) -> dict[str, np.ndarray]:
        return pad_rows(local, rows)

    def validation_means(self, sums, weights) -> dict[str, float]:
        return validation_means(sums, weights)

    def config_from_dict(self, data: Mapping[str, Any]) -> BoardConfig:
        return BoardConfig.from_dict(dict(data))

    def restore_config(self, config: BoardConfig, saved: BoardConfig) -> BoardConfig:
        return config  # one layer layout

    def checkpoint_params(self, params: Mapping, model_config: BoardConfig) -> dict:
        return dict(params)  # one layer layout


FAMILY = BoardFamily()
