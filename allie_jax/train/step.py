"""Pure, jittable train and eval steps (gradient accumulation by a scan over micro-batches).

Micro-batches are *strided*: micro-batch ``i`` holds rows ``i, i + accum, i + 2·accum, ...``. The
batch arrives split over the data-parallel devices in contiguous blocks of rows, so every device
already holds its share of every strided micro-batch; a contiguous split (rows ``[0, B/accum)``
first) would put micro-batch 0 on half the devices and make the compiled step move activations
between devices (all-gathers and collective-permutes) at every step.

With the decoder's loss, each micro-batch divides its sums by the whole batch's label counts
(``losses.label_counts``), so the accumulated loss and gradient equal one pass over the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from allie_jax.model.losses import label_counts, loss_fn, loss_sums
from allie_jax.train.state import TrainState

Batch = Mapping[str, jax.Array]


def decoder_forward_loss(model, batch: Batch, deterministic: bool, loss_weights, label_totals=None):
    """The decoder's forward + loss; other model families pass their own ``forward_loss``."""
    outputs = model(
        batch["inputs"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        deterministic=deterministic,
    )
    return loss_fn(outputs, batch, weights=loss_weights, label_totals=label_totals)


def _forward(graphdef, params, rest, batch: Batch, deterministic: bool, loss_weights, forward_loss):
    # copy=True: fresh Variables owned by this trace, so dropout may advance its RNG counter.
    model = nnx.merge(graphdef, params, rest, copy=True)
    loss, metrics = forward_loss(model, batch, deterministic, loss_weights)
    _, _, new_rest = nnx.split(model, nnx.Param, ...)
    return loss, (metrics, new_rest)


def strided_micro_batches(batch: Batch, grad_accum: int) -> Batch:
    """``[accum, B / accum, ...]`` with micro-batch ``i`` = rows ``i::accum`` (see module doc)."""

    def split(x: jax.Array) -> jax.Array:
        rows = x.shape[0]
        if rows % grad_accum:
            raise ValueError(
                f"a batch of {rows} rows does not split into {grad_accum} micro-batches"
            )
        return x.reshape((rows // grad_accum, grad_accum) + x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


def real_tokens(batch: Batch) -> jax.Array | None:
    """Tokens that belong to a game (segment id > 0): what MFU counts, padding excluded."""
    if "segment_ids" not in batch:
        return None
    return jnp.sum(batch["segment_ids"] > 0, dtype=jnp.float32)


def make_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    loss_weights=(1.0, 1.0, 1.0),
    schedule: optax.Schedule | None = None,
    forward_loss: Callable | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """Build ``train_step(state, batch) -> (state, metrics)``; batch rows split into strided
    micro-batches. ``forward_loss(model, batch, deterministic, loss_weights) -> (loss, metrics)``
    replaces the decoder's; its micro-batch losses are averaged (each its own mean)."""
    exact = forward_loss is None  # the decoder's loss takes the whole batch's label counts

    def grads_of(params, rest, micro, totals):
        if exact:
            fl = lambda m, b, d, w: decoder_forward_loss(m, b, d, w, totals)  # noqa: E731
        else:
            fl = forward_loss
        grad_fn = jax.value_and_grad(_forward, argnums=1, has_aux=True)
        (loss, (metrics, rest)), grads = grad_fn(
            graphdef, params, rest, micro, False, loss_weights, fl
        )
        return grads, loss, metrics, rest

    def train_step(state: TrainState, batch: Batch):
        if grad_accum == 1:
            grads, loss, metrics, rest = grads_of(state.params, state.rest, batch, None)
        else:
            totals = label_counts(batch) if exact else None

            def body(carry, micro):
                acc, rest = carry
                grads, loss, metrics, rest = grads_of(state.params, rest, micro, totals)
                acc = jax.tree.map(jnp.add, acc, grads)
                return (acc, rest), (loss, metrics)

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            (grads, rest), (losses, metrics) = jax.lax.scan(
                body, (zeros, state.rest), strided_micro_batches(batch, grad_accum)
            )
            if exact:  # shares of the whole batch's means: they add up
                loss = losses.sum()
                metrics = jax.tree.map(lambda m: m.sum(0), metrics)
            else:
                grads = jax.tree.map(lambda g: g / grad_accum, grads)
                loss = losses.mean()
                metrics = jax.tree.map(lambda m: m.mean(0), metrics)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics)
        metrics["loss"] = loss
        metrics["grad_norm"] = optax.global_norm(grads)
        tokens = real_tokens(batch)
        if tokens is not None:
            metrics["real_tokens"] = tokens
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        new_state = state.replace(
            step=state.step + 1, params=params, rest=rest, opt_state=opt_state
        )
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, eval_sums: Callable | None = None):
    """``eval_step(state, batch) -> sums`` with dropout off: masked sums and label counts of each
    loss term (``losses.loss_sums``), so padded rows count for nothing and batches add up.
    ``eval_sums(model, batch) -> sums`` replaces the decoder's for another model family."""

    def eval_step(state: TrainState, batch: Batch):
        model = nnx.merge(graphdef, state.params, state.rest, copy=True)
        if eval_sums is not None:
            return eval_sums(model, batch)
        outputs = model(
            batch["inputs"],
            positions=batch["positions"],
            segment_ids=batch["segment_ids"],
            deterministic=True,
        )
        return loss_sums(outputs, batch)

    return eval_step
