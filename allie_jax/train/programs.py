"""The training job's jitted programs over *abstract* inputs: compiled without allocating a byte.

``launch.train`` builds its train and eval steps in ``loop.build_trainer`` after initialising the
state on the devices. An ahead-of-time check (``allie_jax.compile_check``) needs the very same
programs for devices it does not have, so this module rebuilds them from the same public pieces
(``make_optimizer``, ``make_train_step``, ``make_eval_step``, the logical-axis shardings, the
batch sharding, ``with_activation_sharding``) with ``jax.ShapeDtypeStruct`` inputs that carry
their ``NamedSharding``: the state from ``nnx.eval_shape`` and ``jax.eval_shape``, never
``jax.jit(init)()``.

The optimiser state's shardings are the ones the real run gets: ``loop.create_sharded_state``
lets the compiler propagate them from the parameters through ``init_train_state``; here the same
``jit`` is compiled for the target mesh and its output shardings read back (scalars the compiler
leaves unsharded are replicated, as the loop does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from allie_jax.model import family as family_lib
from allie_jax.train import sharding as shd
from allie_jax.train.optimizer import learning_rate_schedule, make_optimizer
from allie_jax.train.state import init_train_state
from allie_jax.train.step import make_eval_step, make_train_step


@dataclasses.dataclass
class AbstractPrograms:
    """The train and eval steps (``jax.jit`` objects) and the abstract arguments to lower them."""

    train_step: Any
    eval_step: Any
    state: Any  # TrainState of ShapeDtypeStruct, each with its NamedSharding
    batch: dict[str, jax.ShapeDtypeStruct]  # one global batch, sharded as the feed shards it
    num_params: int
    mesh: Mesh


def check_batch(config: ml_collections.ConfigDict, num_devices: int, num_processes: int) -> None:
    """The batch rules of ``loop.validate_config`` for a device count that is not this host's.

    Raises ValueError naming the config field when a micro-batch would not split over the mesh.
    """
    train = config.train
    if train.batch_size % train.grad_accum:
        raise ValueError(
            f"train.batch_size {train.batch_size} is not divisible by grad_accum {train.grad_accum}"
        )
    if train.batch_size % num_processes:
        raise ValueError(
            f"train.batch_size {train.batch_size} does not split over {num_processes} hosts"
        )
    shape = shd.mesh_shape_from_config(config.mesh, num_devices)
    micro = train.batch_size // train.grad_accum
    if micro % (shape[0] * shape[1]):
        raise ValueError(
            f"the micro-batch (train.batch_size {train.batch_size} / grad_accum "
            f"{train.grad_accum} = {micro} rows) does not divide over the mesh's data x fsdp = "
            f"{shape[0]} x {shape[1]} devices"
        )


def with_sharding(tree: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct`` leaves of ``tree`` carrying the matching leaf of ``shardings``."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def abstract_batch(config: ml_collections.ConfigDict, rows: int, sharding) -> dict:
    """The pipeline's batch layout (the family's keys and dtypes) for ``rows`` rows."""
    example = family_lib.of_config(config).example_batch(config, 1)
    return {
        k: jax.ShapeDtypeStruct((rows,) + v.shape[1:], v.dtype, sharding=sharding)
        for k, v in example.items()
    }


def replicate_unsharded(shardings: Any, mesh: Mesh) -> Any:
    """Shardings with every one that is not a ``NamedSharding`` replaced by replication: scalars
    a jit creates (the step, Adam's count) carry none (``loop.create_sharded_state`` too)."""
    return jax.tree.map(
        lambda s: s if isinstance(s, NamedSharding) else shd.replicated(mesh), shardings
    )


def abstract_state(model_config: Any, config, mesh: Mesh, tx) -> tuple[Any, Any, int]:
    """(graphdef, abstract TrainState with shardings, parameter count) for ``mesh``."""
    seed = int(config.train.seed)
    family = family_lib.of_model_config(model_config)
    abstract = nnx.eval_shape(lambda: family.build(model_config, seed))
    graphdef, abs_params, abs_rest = nnx.split(abstract, nnx.Param, ...)
    params = with_sharding(abs_params, shd.state_shardings(abs_params, mesh))
    rest = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shd.replicated(mesh)), abs_rest
    )
    init = jax.jit(lambda p, r: init_train_state(p, r, tx))
    state_sh = init.lower(params, rest).compile().output_shardings
    state_sh = replicate_unsharded(state_sh, mesh)
    state = with_sharding(jax.eval_shape(init, params, rest), state_sh)
    num_params = int(sum(math.prod(x.shape) for x in jax.tree.leaves(abs_params)))
    return graphdef, state, num_params


def jit_train_step(config, graphdef, tx, state_sh, mesh: Mesh, forward_loss: Callable | None):
    """``launch.train``'s train step: donated state, the batch split over data x fsdp."""
    return jax.jit(
        shd.with_activation_sharding(
            make_train_step(
                graphdef,
                tx,
                grad_accum=int(config.train.grad_accum),
                loss_weights=tuple(config.train.loss_weights),
                schedule=learning_rate_schedule(config.train),
                forward_loss=forward_loss,
            ),
            mesh,
        ),
        in_shardings=(state_sh, shd.batch_sharding(mesh)),
        out_shardings=(state_sh, shd.replicated(mesh)),
        donate_argnums=(0,),
    )


def jit_eval_step(graphdef, state_sh, mesh: Mesh, eval_sums: Callable | None):
    """``launch.train``'s eval step (dropout off, masked loss sums)."""
    return jax.jit(
        shd.with_activation_sharding(make_eval_step(graphdef, eval_sums), mesh),
        in_shardings=(state_sh, shd.batch_sharding(mesh)),
        out_shardings=shd.replicated(mesh),
    )


def build_abstract_programs(config, model_config: Any, mesh: Mesh) -> AbstractPrograms:
    """The train and eval steps of ``config`` on ``mesh`` with abstract, sharded arguments.

    Batches are ``train.batch_size`` rows of ``data.seq_len`` tokens for both steps (the
    validator feeds each process its share of the same global batch).
    """
    family = family_lib.of_model_config(model_config)
    tx = make_optimizer(config.train)
    graphdef, state, num_params = abstract_state(model_config, config, mesh, tx)
    state_sh = jax.tree.map(lambda x: x.sharding, state)
    batch = abstract_batch(config, int(config.train.batch_size), shd.batch_sharding(mesh))
    return AbstractPrograms(
        train_step=jit_train_step(config, graphdef, tx, state_sh, mesh, family.forward_loss),
        eval_step=jit_eval_step(graphdef, state_sh, mesh, family.eval_sums),
        state=state,
        batch=batch,
        num_params=num_params,
        mesh=mesh,
    )
