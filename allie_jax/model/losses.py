"""Training loss (SPEC §1): CE(policy) + MSE(think time) + MSE(tanh value), each masked.

Each term is a mean over its own labelled positions, so a batch with few time labels still weighs
the time loss like any other; the released code did the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from allie_jax import game
from allie_jax.model.transformer import ModelOutputs


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _per_token_terms(outputs: ModelOutputs, batch: Mapping[str, jax.Array]):
    """{name: (per-token value, mask)} for the policy CE, accuracy, time and value errors."""
    logits = outputs.policy_logits.astype(jnp.float32)
    vocab_size = logits.shape[-1]

    policy_mask = jnp.asarray(batch["policy_mask"], jnp.float32)
    targets = jnp.clip(jnp.asarray(batch["policy_targets"], jnp.int32), 0, vocab_size - 1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)

    time_mask = jnp.asarray(batch["time_mask"], jnp.float32)
    seconds = jnp.asarray(batch["time_targets"], jnp.float32)
    time_target = game.normalize_think_time(jnp.where(time_mask > 0, seconds, 0.0))

    value_mask = jnp.asarray(batch["value_mask"], jnp.float32)
    value_target = jnp.where(value_mask > 0, jnp.asarray(batch["value_targets"], jnp.float32), 0.0)
    return {
        "policy_loss": (ce, policy_mask),
        "policy_accuracy": (correct, policy_mask),
        "time_loss": (jnp.square(outputs.time - time_target), time_mask),
        "value_loss": (jnp.square(outputs.value - value_target), value_mask),
    }


# The mask that counts the labels of each term.
LABEL_MASKS = {
    "policy_loss": "policy_mask",
    "policy_accuracy": "policy_mask",
    "time_loss": "time_mask",
    "value_loss": "value_mask",
}


def label_counts(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Labels of each loss term in ``batch`` (float32 scalars).

    Gradient accumulation divides every micro-batch's sums by the *whole* batch's counts, so the
    micro-batch losses add up to exactly the whole batch's loss (and gradient): a micro-batch
    with few time labels does not weigh its time error more than the same rows in one pass.
    """
    return {
        name: jnp.sum(jnp.asarray(batch[mask], jnp.float32)) for name, mask in LABEL_MASKS.items()
    }


def loss_fn(
    outputs: ModelOutputs,
    batch: Mapping[str, jax.Array],
    weights: Sequence[float] = (1.0, 1.0, 1.0),
    *,
    label_totals: Mapping[str, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted sum of the three losses and their components.

    ``batch`` uses the data pipeline's keys: ``policy_targets`` (int, any value where unmasked),
    ``time_targets`` (seconds, normalised here), ``value_targets`` (may be NaN where unmasked),
    and the float masks ``policy_mask``, ``time_mask``, ``value_mask``. ``label_totals``
    (``label_counts`` of the whole batch) replaces this batch's own label counts as the
    denominators: the terms are then this micro-batch's share of the whole batch's means.
    """
    if len(weights) != 3:
        raise ValueError(f"weights must be (policy, time, value), got {weights!r}")
    terms = _per_token_terms(outputs, batch)
    if label_totals is None:
        metrics = {name: _masked_mean(values, mask) for name, (values, mask) in terms.items()}
    else:
        metrics = {
            name: jnp.sum(values * mask) / jnp.maximum(label_totals[name], 1.0)
            for name, (values, mask) in terms.items()
        }
    metrics["loss"] = combine(metrics, weights)
    metrics["policy_tokens"] = jnp.sum(terms["policy_loss"][1])
    return metrics["loss"], metrics


def combine(losses: Mapping[str, jax.Array | float], weights: Sequence[float]):
    """The training objective from its three parts (one definition for training and validation)."""
    w_policy, w_time, w_value = weights
    return (
        w_policy * losses["policy_loss"]
        + w_time * losses["time_loss"]
        + w_value * losses["value_loss"]
    )


def loss_sums(outputs: ModelOutputs, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Masked sums and label counts (``<name>_sum``, ``<name>_count``) of every loss term.

    Validation adds these over batches and divides once, so the result is the mean over every
    labelled position whatever the batching, and all-padding rows (mask 0) change nothing.
    """
    out = {}
    for name, (values, mask) in _per_token_terms(outputs, batch).items():
        out[f"{name}_sum"] = jnp.sum(values * mask)
        out[f"{name}_count"] = jnp.sum(mask)
    return out
