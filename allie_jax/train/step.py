"""Pure, jittable train and eval steps (gradient accumulation by a scan over micro-batches)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from allie_jax.model.losses import loss_fn, loss_sums
from allie_jax.train.state import TrainState

Batch = Mapping[str, jax.Array]


def decoder_forward_loss(model, batch: Batch, deterministic: bool, loss_weights):
    """The decoder's forward + loss; other model families pass their own ``forward_loss``."""
    outputs = model(
        batch["inputs"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        deterministic=deterministic,
    )
    return loss_fn(outputs, batch, weights=loss_weights)


def _forward(
    graphdef, params, rest, batch: Batch, deterministic: bool, loss_weights, forward_loss=None
):
    # copy=True: fresh Variables owned by this trace, so dropout may advance its RNG counter.
    model = nnx.merge(graphdef, params, rest, copy=True)
    loss, metrics = (forward_loss or decoder_forward_loss)(
        model, batch, deterministic, loss_weights
    )
    _, _, new_rest = nnx.split(model, nnx.Param, ...)
    return loss, (metrics, new_rest)


def make_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    *,
    grad_accum: int = 1,
    loss_weights=(1.0, 1.0, 1.0),
    schedule: optax.Schedule | None = None,
    forward_loss: Callable | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """Build ``train_step(state, batch) -> (state, metrics)``; batch rows split into micro-batches."""

    def grads_of(params, rest, micro):
        grad_fn = jax.value_and_grad(_forward, argnums=1, has_aux=True)
        (loss, (metrics, rest)), grads = grad_fn(
            graphdef, params, rest, micro, False, loss_weights, forward_loss
        )
        return grads, loss, metrics, rest

    def train_step(state: TrainState, batch: Batch):
        if grad_accum == 1:
            grads, loss, metrics, rest = grads_of(state.params, state.rest, batch)
        else:
            micro_batches = jax.tree.map(
                lambda x: x.reshape((grad_accum, x.shape[0] // grad_accum) + x.shape[1:]), batch
            )

            def body(carry, micro):
                acc, rest = carry
                grads, loss, metrics, rest = grads_of(state.params, rest, micro)
                acc = jax.tree.map(jnp.add, acc, grads)
                return (acc, rest), (loss, metrics)

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            (grads, rest), (losses, metrics) = jax.lax.scan(
                body, (zeros, state.rest), micro_batches
            )
            grads = jax.tree.map(lambda g: g / grad_accum, grads)
            loss = losses.mean()
            metrics = jax.tree.map(jnp.mean, metrics)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics)
        metrics["loss"] = loss
        metrics["grad_norm"] = optax.global_norm(grads)
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
