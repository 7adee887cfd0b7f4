"""``train_and_evaluate``: the main job, from prepared shards to checkpoints and metrics.

Everything that can fail for a configuration reason (missing data, missing GPT-2 file, a batch
that does not divide over the mesh) is checked before the first compile, so a pod job fails in
seconds rather than at step 0 after minutes of start-up.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import signal
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from allie_jax.data.pipeline import make_iterator
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.train import sharding as shd
from allie_jax.train.checkpoints import Checkpointer
from allie_jax.train.metrics import (
    MetricsWriter,
    device_peak_flops,
    training_flops_per_token,
)
from allie_jax.train.optimizer import learning_rate_schedule, make_optimizer
from allie_jax.train.state import TrainState, count_params, init_train_state
from allie_jax.train.step import make_eval_step, make_train_step

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Raised when the loss stops being finite; the offending update is never applied or saved."""


@dataclasses.dataclass
class TrainResult:
    workdir: pathlib.Path
    final_step: int
    first_loss: float | None
    last_loss: float | None
    val_metrics: dict[str, float]
    tokens_per_second: float
    mfu: float
    checkpoint_dir: pathlib.Path


def model_config_from(config: ml_collections.ConfigDict) -> ModelConfig:
    return ModelConfig.named(
        config.model.name, dtype=config.model.dtype, dropout=float(config.model.dropout)
    )


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Fail fast on everything a misconfigured pod job would otherwise discover late."""
    data_dir = pathlib.Path(config.data.data_dir) if config.data.data_dir else None
    if data_dir is None:
        raise ValueError(
            "config.data.data_dir is empty: pass --data_dir (output of launch.prepare_data)"
        )
    if not (data_dir / "train").is_dir():
        raise FileNotFoundError(
            f"no train split under data_dir {data_dir} (run launch.prepare_data)"
        )
    gpt2 = config.model.init_from_gpt2
    if gpt2 and not pathlib.Path(gpt2).is_file():
        raise FileNotFoundError(f"config.model.init_from_gpt2 names a missing file: {gpt2}")
    train = config.train
    if train.batch_size % train.grad_accum:
        raise ValueError(
            f"train.batch_size {train.batch_size} is not divisible by grad_accum {train.grad_accum}"
        )
    if train.batch_size % jax.process_count():
        raise ValueError(
            f"train.batch_size {train.batch_size} does not split over {jax.process_count()} processes"
        )
    model_config_from(config)  # raises on an unknown size or dtype


def _maybe_initialize_distributed(config: ml_collections.ConfigDict) -> None:
    dist = config.distributed
    if not dist.initialize:
        return
    kwargs: dict[str, Any] = {}
    if dist.coordinator_address:
        kwargs["coordinator_address"] = dist.coordinator_address
    if dist.num_processes:
        kwargs["num_processes"] = int(dist.num_processes)
    if dist.process_id >= 0:
        kwargs["process_id"] = int(dist.process_id)
    jax.distributed.initialize(**kwargs)


def create_sharded_state(model_config: ModelConfig, config, mesh, tx, init_params=None):
    """Initialise parameters directly into their shardings (no full copy on one device)."""

    def build():
        return AllieModel(model_config, rngs=nnx.Rngs(int(config.train.seed)))

    abstract = nnx.eval_shape(build)
    graphdef, abs_params, abs_rest = nnx.split(abstract, nnx.Param, ...)
    param_sh = shd.state_shardings(abs_params, mesh)
    rest_sh = jax.tree.map(lambda _: shd.replicated(mesh), abs_rest)

    def init():
        model = build()
        _, params, rest = nnx.split(model, nnx.Param, ...)
        if init_params is not None:
            nnx.replace_by_pure_dict(params, init_params)
        return params, rest

    params, rest = jax.jit(init, out_shardings=(param_sh, rest_sh))()
    state = jax.jit(lambda p, r: init_train_state(p, r, tx))(params, rest)
    # Scalars created inside the jit (step, Adam's count) carry no input sharding: replicate them.
    state = jax.tree.map(
        lambda x: (
            x
            if isinstance(x.sharding, jax.sharding.NamedSharding)
            else jax.device_put(x, shd.replicated(mesh))
        ),
        state,
    )
    return graphdef, state


def state_shardings_of(state: TrainState):
    return jax.tree.map(lambda x: x.sharding, state)


def _global_batch(local: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()
    }


def _data_iterator(config, split: str, *, local_batch: int, augment: bool, num_epochs=None):
    return make_iterator(
        config.data.data_dir,
        split,
        batch_size=local_batch,
        seq_len=int(config.data.seq_len),
        seed=int(config.data.seed),
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
        augment=augment,
        num_epochs=num_epochs,
    )


def evaluate(config, eval_step, state, batch_sharding, local_batch: int) -> dict[str, float]:
    """Mean of the eval metrics over ``eval_batches`` batches of the val split (no augmentation)."""
    try:
        iterator = _data_iterator(
            config, "val", local_batch=local_batch, augment=False, num_epochs=1
        )
    except (FileNotFoundError, ValueError) as err:
        log.warning("no validation data: %s", err)
        return {}
    totals: dict[str, float] = {}
    count = 0
    for i, local in enumerate(iterator):
        if i >= int(config.train.eval_batches):
            break
        metrics = jax.device_get(eval_step(state, _global_batch(local, batch_sharding)))
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + float(v)
        count += 1
    return {k: v / count for k, v in totals.items()} if count else {}


@dataclasses.dataclass
class Trainer:
    """The compiled pieces of a run on one mesh (shared by the loop, the tests and bench/train.py)."""

    graphdef: Any
    state: TrainState
    train_step: Any
    eval_step: Any
    batch_sharding: Any
    mesh: Any


def build_trainer(config, model_config: ModelConfig, mesh) -> Trainer:
    tx = make_optimizer(config.train)
    init_params = None
    if config.model.init_from_gpt2:
        from allie_jax.convert.gpt2 import gpt2_to_params, read_safetensors

        path = config.model.init_from_gpt2
        init_params = gpt2_to_params(
            read_safetensors(path), model_config, seed=int(config.train.seed), source=path
        )
    graphdef, state = create_sharded_state(model_config, config, mesh, tx, init_params)
    state_sh = state_shardings_of(state)
    batch_sh = shd.batch_sharding(mesh)
    train_step = jax.jit(
        make_train_step(
            graphdef,
            tx,
            grad_accum=int(config.train.grad_accum),
            loss_weights=tuple(config.train.loss_weights),
            schedule=learning_rate_schedule(config.train),
        ),
        in_shardings=(state_sh, batch_sh),
        out_shardings=(state_sh, shd.replicated(mesh)),
        donate_argnums=(0,),
    )
    eval_step = jax.jit(
        make_eval_step(graphdef, tuple(config.train.loss_weights)),
        in_shardings=(state_sh, batch_sh),
        out_shardings=shd.replicated(mesh),
    )
    return Trainer(graphdef, state, train_step, eval_step, batch_sh, mesh)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str | pathlib.Path
) -> TrainResult:
    _maybe_initialize_distributed(config)
    validate_config(config)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model_config = model_config_from(config)
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(model_config.to_json())
        (workdir / "train_config.json").write_text(config.to_json_best_effort(indent=2))

    mesh = shd.make_mesh((config.mesh.data, config.mesh.fsdp, config.mesh.tensor))
    trainer = build_trainer(config, model_config, mesh)
    state = trainer.state
    num_params = count_params(state.params)

    global_batch = int(config.train.batch_size)
    local_batch = global_batch // jax.process_count()
    iterator = _data_iterator(
        config, "train", local_batch=local_batch, augment=bool(config.data.augment)
    )

    checkpointer = Checkpointer(
        workdir,
        keep=int(config.train.keep_checkpoints),
        save_every=int(config.train.checkpoint_every),
        async_save=bool(config.train.async_checkpoints),
    )
    if checkpointer.latest_step() is not None:
        state = checkpointer.restore(state, iterator)
        log.info("resumed from step %d", int(state.step))
    train_step, eval_step, batch_sh = trainer.train_step, trainer.eval_step, trainer.batch_sharding

    writer = MetricsWriter(workdir)
    peak, known_peak = device_peak_flops()
    flops_per_token = training_flops_per_token(
        num_params, model_config.num_layers, model_config.embed_dim, int(config.data.seq_len)
    )
    tokens_per_step = global_batch * int(config.data.seq_len)

    stop_requested = {"flag": False}

    def _on_sigterm(signum, frame):
        stop_requested["flag"] = True

    previous_handler = signal.signal(signal.SIGTERM, _on_sigterm)

    start_step = int(jax.device_get(state.step))
    total_steps = int(config.train.steps)
    first_loss = last_loss = None
    val_metrics: dict[str, float] = {}
    tokens_per_second = mfu = 0.0
    progress = None
    if jax.process_index() == 0:
        from tqdm import tqdm

        progress = tqdm(total=total_steps, initial=start_step, desc="train", unit="step")
    window_start, window_steps = time.perf_counter(), 0
    try:
        step = start_step
        while step < total_steps:
            local = next(iterator)
            batch = _global_batch(local, batch_sh)
            new_state, metrics = train_step(state, batch)
            loss = float(jax.device_get(metrics["loss"]))
            if not math.isfinite(loss):
                raise NonFiniteLossError(
                    f"non-finite loss {loss} at step {step + 1}; the update was discarded and "
                    f"the last good checkpoint is step {checkpointer.latest_step()}"
                )
            state = new_state
            step += 1
            window_steps += 1
            if first_loss is None:
                first_loss = loss
            last_loss = loss
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.3f}")
            if step % int(config.train.log_every) == 0 or step == total_steps:
                elapsed = time.perf_counter() - window_start
                tokens_per_second = tokens_per_step * window_steps / max(elapsed, 1e-9)
                mfu = flops_per_token * tokens_per_second / (peak * jax.device_count())
                scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
                scalars.update(
                    tokens_per_second=tokens_per_second,
                    mfu=mfu,
                    step_time=elapsed / max(window_steps, 1),
                )
                writer.write(step, scalars, "train")
                window_start, window_steps = time.perf_counter(), 0
            if step % int(config.train.eval_every) == 0 or step == total_steps:
                val_metrics = evaluate(config, eval_step, state, batch_sh, local_batch)
                if val_metrics:
                    writer.write(step, val_metrics, "val")
                    checkpointer.save_if_best(state, val_metrics["loss"])
                    if progress is not None:
                        progress.write(
                            f"step {step}: val loss {val_metrics['loss']:.4f} "
                            f"move accuracy {val_metrics.get('policy_accuracy', float('nan')):.4f}"
                        )
            checkpointer.save(state, iterator)
            if stop_requested["flag"]:
                log.warning("SIGTERM: saved step %d and stopping", step)
                break
        if checkpointer.latest_step() != int(jax.device_get(state.step)):
            checkpointer.save(state, iterator, force=True)
    finally:
        checkpointer.wait()
        checkpointer.close()
        writer.close()
        if progress is not None:
            progress.close()
        signal.signal(signal.SIGTERM, previous_handler)
    if not known_peak:
        log.info("MFU uses a nominal CPU peak of %.0e FLOP/s", peak)
    return TrainResult(
        workdir=workdir,
        final_step=int(jax.device_get(state.step)),
        first_loss=first_loss,
        last_loss=last_loss,
        val_metrics=val_metrics,
        tokens_per_second=tokens_per_second,
        mfu=mfu,
        checkpoint_dir=workdir / "checkpoints",
    )


def write_summary(result: TrainResult) -> str:
    lines = [
        f"trained to step {result.final_step} in {result.workdir}",
        f"loss: first {result.first_loss:.4f} -> last {result.last_loss:.4f}"
        if result.first_loss is not None
        else "no training steps run (already at the final step)",
    ]
    if result.val_metrics:
        lines.append(
            f"validation: loss {result.val_metrics['loss']:.4f}, move accuracy "
            f"{result.val_metrics.get('policy_accuracy', float('nan')):.4f}"
        )
    lines.append(
        f"checkpoints: {result.checkpoint_dir} (best by val loss: {result.workdir / 'best'})"
    )
    return "\n".join(lines)
