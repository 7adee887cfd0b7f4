"""The paper's optimiser: AdamW with warmup + cosine, decay on matrices only, global-norm clipping."""

from __future__ import annotations

import jax
import ml_collections
import optax


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup to the peak, then cosine down to ``min_learning_rate``."""
    decay_steps = int(train.decay_steps or train.steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=float(train.learning_rate),
        warmup_steps=int(train.warmup_steps),
        decay_steps=max(decay_steps, int(train.warmup_steps) + 1),
        end_value=float(train.min_learning_rate),
    )


def _decay_mask(params):
    """Weight decay applies to matrices (kernels, embeddings), never to biases or LayerNorm scales."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(float(train.grad_clip)),
        optax.adamw(
            learning_rate=learning_rate_schedule(train),
            b1=float(train.b1),
            b2=float(train.b2),
            weight_decay=float(train.weight_decay),
            mask=_decay_mask,
        ),
    )
