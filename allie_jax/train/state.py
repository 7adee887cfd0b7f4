"""The functional training state: parameters, the rest of the model state, optimiser state, step.

Keeping the state a plain pytree (rather than a stateful ``nnx.Optimizer``) is what lets one
jitted step carry explicit in/out shardings and lets Orbax save and restore it as-is.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any  # nnx.State of nnx.Param
    rest: Any  # nnx.State of everything else (dropout RNG counters)
    opt_state: optax.OptState


def init_train_state(params, rest, tx: optax.GradientTransformation) -> TrainState:
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, rest=rest, opt_state=tx.init(params)
    )


def count_params(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))
