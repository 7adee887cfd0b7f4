"""The board family's pieces for the shared trainer: config, model, loss, batches.

``launch.train`` dispatches on ``config.model.family``; for ``"board"`` the training loop calls
the functions here instead of the decoder's (``allie_jax/train`` keeps only a small switch).

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
import numpy as np
import optax

from allie_jax.data import board_features
from allie_jax.model.board_transformer import BoardConfig, BoardOutputs, BoardTransformer

FAMILY = "board"
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


def forward_loss(model: BoardTransformer, batch, deterministic: bool, loss_weights):
    """The trainer's ``forward_loss`` hook: one forward (both passes) and the loss."""
    outputs = model(model_inputs(batch), deterministic=deterministic)
    weights = tuple(loss_weights) if len(loss_weights) == 4 else DEFAULT_LOSS_WEIGHTS
    return board_loss(outputs, batch, weights)


def eval_sums(model: BoardTransformer, batch) -> dict[str, jax.Array]:
    """The trainer's ``eval_sums`` hook (dropout off)."""
    return board_loss_sums(model(model_inputs(batch), deterministic=True), batch)


def pad_rows(local: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """A validation batch padded to ``rows`` with label-free positions (they count for nothing)."""
    have = len(local["side"])
    if have > rows:
        raise ValueError(f"a validation batch has {have} rows, more than the {rows} expected")
    if have == rows:
        return dict(local)
    pad = {
        k: np.zeros((rows - have, *shape), dtype)
        for k, (shape, dtype) in board_features.FIELDS.items()
    }
    pad["policy_target"][:] = -1
    pad["value_target"][:] = np.nan
    return {k: np.concatenate([local[k], pad[k]]) for k in board_features.FIELDS}


class BoardValidator:
    """``validator(state) -> metrics`` for board batches: the trainer's ``Validator`` protocol
    (same batch count on every process, fixed-shape padded batches, means from summed terms)."""

    def __init__(self, open_iterator, eval_step, sharding, *, rows, max_batches, weights):
        self._open, self._eval_step, self._sharding = open_iterator, eval_step, sharding
        self.rows, self.max_batches = int(rows), int(max_batches)
        self.weights = tuple(weights) if len(weights) == 4 else DEFAULT_LOSS_WEIGHTS
        self.num_batches: int | None = None

    def _local_batches(self):
        try:
            iterator = self._open()
        except (FileNotFoundError, ValueError):
            return iter(())
        return (b for _, b in zip(range(self.max_batches), iterator, strict=False))

    def __call__(self, state) -> dict[str, float]:
        from allie_jax.train.feed import global_batch
        from allie_jax.train.validation import agreed_count

        if self.num_batches is None:
            self.num_batches = agreed_count(sum(1 for _ in self._local_batches()))
        if self.num_batches == 0:
            return {}
        local = self._local_batches()
        totals = None
        for _ in range(self.num_batches):
            rows = next(local, None)
            rows = pad_rows(
                {k: v[:0] for k, v in _EMPTY.items()} if rows is None else rows, self.rows
            )
            sums = self._eval_step(state, global_batch(rows, self._sharding))
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        sums = jax.device_get(totals)
        means = {t: float(sums[f"{t}_sum"]) / max(float(sums[f"{t}_count"]), 1.0) for t in TERMS}
        means["loss"] = float(combine(means, self.weights))
        means["policy_tokens"] = float(sums["policy_loss_count"])
        return means


_EMPTY = {k: np.zeros((0, *shape), dtype) for k, (shape, dtype) in board_features.FIELDS.items()}


def build_validator(config, trainer, local_batch: int, data_iterator) -> BoardValidator:
    """The trainer's validator hook; ``data_iterator`` is the loop's (dispatching) opener."""
    return BoardValidator(
        lambda: data_iterator(config, "val", local_batch=local_batch, augment=False, num_epochs=1),
        trainer.eval_step,
        trainer.batch_sharding,
        rows=local_batch,
        max_batches=int(config.train.eval_batches),
        weights=tuple(config.train.loss_weights),
    )


def is_board(config) -> bool:
    """Whether a training config (ml_collections) selects this family."""
    model = config.model
    return str(model.get("family", "allie") if hasattr(model, "get") else "allie") == FAMILY


def model_config_from(config) -> BoardConfig:
    """``config.model.name`` (a ``BoardConfig.named`` size) plus ``config.model.board`` overrides."""
    board = config.model.get("board", None)
    overrides = {k: v for k, v in (board.to_dict() if board else {}).items() if v is not None}
    return BoardConfig.named(
        config.model.name,
        dtype=config.model.dtype,
        dropout=float(config.model.dropout),
        **overrides,
    )


def build_model(model_config: BoardConfig, seed: int) -> BoardTransformer:
    from flax import nnx

    return BoardTransformer(model_config, rngs=nnx.Rngs(seed))


def data_iterator(
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
    """The trainer's data hook: board batches; the curriculum only for training."""
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
