"""``train_and_evaluate``: the main job, from prepared shards to checkpoints and metrics.

Everything that can fail for a configuration reason (missing data, missing GPT-2 file, a batch
that does not divide over the mesh, a checkpoint from a different process count) is checked
before the first compile, so a pod job fails in seconds rather than after minutes of start-up.

The loop never waits on the host between steps: the next batch is fetched and sent to the devices
while the step runs (``feed.DeviceFeed``), and metrics stay on device until the window is logged
(``metrics.MetricWindow``). Preemption stops every process at the same step
(``preemption.PreemptionWatch``); the run then reports ``preempted`` and ``launch.train`` exits
with ``EXIT_PREEMPTED`` (75) once the checkpoint is committed.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import ml_collections
from etils import epath
from flax import nnx

from allie_jax.data import shards
from allie_jax.data.paths import as_path
from allie_jax.model import family as family_lib
from allie_jax.train import distributed, programs
from allie_jax.train import sharding as shd
from allie_jax.train.checkpoints import Checkpointer
from allie_jax.train.feed import DeviceFeed
from allie_jax.train.logs import library_logs_to_file
from allie_jax.train.metrics import (
    MetricsWriter,
    MetricWindow,
    NonFiniteLossError,
    TrainingClock,
    device_peak_flops,
    model_flops_utilization,
    training_flops_per_token,
)
from allie_jax.train.optimizer import make_optimizer
from allie_jax.train.preemption import PreemptionWatch
from allie_jax.train.state import TrainState, count_params, init_train_state
from allie_jax.train.validation import Validator

log = logging.getLogger(__name__)

__all__ = ["NonFiniteLossError", "TrainResult", "train_and_evaluate", "write_summary"]


@dataclasses.dataclass
class TrainResult:
    workdir: epath.Path
    final_step: int
    first_loss: float | None  # the first step's loss
    last_loss: float | None  # mean over the last logged window
    val_metrics: dict[str, float]
    tokens_per_second: float
    mfu: float
    checkpoint_dir: epath.Path
    preempted: bool = False  # stopped by SIGTERM after its checkpoint committed: relaunch
    log_file: str = ""


def model_config_from(config: ml_collections.ConfigDict) -> Any:
    """The frozen model config of ``config``'s family (errors name an unused or bad field)."""
    return family_lib.of_config(config).model_config(config)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Fail fast on everything a misconfigured pod job would otherwise discover late."""
    if not config.data.data_dir:
        raise ValueError(
            "config.data.data_dir is empty: pass --data_dir (output of launch.prepare_data)"
        )
    family = family_lib.of_config(config)
    family_lib.check_loss_weights(config, family)
    # prepare_data's DATA_DIR/train or a TFDS build; FileNotFoundError says what to run.
    shards.find_shards(config.data.data_dir, "train")
    family.preflight(config, jax.default_backend())
    # The batch rules the compile check applies to devices it does not have (one copy).
    programs.check_batch(config, jax.device_count(), jax.process_count())


def create_sharded_state(model_config: Any, config, mesh, tx, init_params=None):
    """Initialise parameters directly into their shardings (no full copy on one device)."""
    family = family_lib.of_model_config(model_config)

    def build():
        return family.build(model_config, int(config.train.seed))

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
    shardings = programs.replicate_unsharded(state_shardings_of(state), mesh)
    return graphdef, jax.device_put(state, shardings)


def state_shardings_of(state: TrainState):
    return jax.tree.map(lambda x: x.sharding, state)


def _data_iterator(
    config, split: str, *, local_batch: int, augment: bool, num_epochs=None, seed=None
):
    return family_lib.of_config(config).data_iterator(
        config,
        split,
        local_batch=local_batch,
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
        augment=augment,
        num_epochs=num_epochs,
        seed=seed,
    )


@dataclasses.dataclass
class Trainer:
    """The compiled pieces of a run on one mesh (shared by the loop, the tests and bench/train.py)."""

    graphdef: Any
    state: TrainState
    train_step: Any
    eval_step: Any
    batch_sharding: Any
    mesh: Any


def build_trainer(config, model_config: Any, mesh) -> Trainer:
    family = family_lib.of_model_config(model_config)
    tx = make_optimizer(config.train)
    init_params = family.init_params(config, model_config)
    graphdef, state = create_sharded_state(model_config, config, mesh, tx, init_params)
    state_sh = state_shardings_of(state)
    # The same jitted programs launch.compile_check compiles for accelerators (train/programs.py).
    train_step = programs.jit_train_step(config, graphdef, tx, state_sh, mesh, family.forward_loss)
    eval_step = programs.jit_eval_step(graphdef, state_sh, mesh, family.eval_sums)
    return Trainer(graphdef, state, train_step, eval_step, shd.batch_sharding(mesh), mesh)


def build_validator(config, trainer: Trainer, local_batch: int) -> Validator:
    family = family_lib.of_config(config)
    return Validator(
        lambda: _data_iterator(config, "val", local_batch=local_batch, augment=False, num_epochs=1),
        trainer.eval_step,
        trainer.batch_sharding,
        family=family,
        empty=family.example_batch(config, local_batch),
        max_batches=int(config.train.eval_batches),
        weights=family_lib.check_loss_weights(config, family),
    )


class _Console:
    """What the person running the job sees: process 0 only, above the progress bar."""

    def __init__(self) -> None:
        self.enabled = jax.process_index() == 0
        self.bar = None

    def say(self, message: str) -> None:
        log.info("%s", message)
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def start_bar(self, total: int, initial: int) -> None:
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str | epath.PathLike
) -> TrainResult:
    """Train to ``config.train.steps`` (resuming from the workdir's latest checkpoint)."""
    # Join the job the environment or the flags describe; refuse hosts without preemption sync.
    distributed.start(config)
    validate_config(config)
    workdir = as_path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with library_logs_to_file(workdir) as log_file:
        return _train(config, workdir, str(log_file))


def _restore(config, checkpointer: Checkpointer, state, iterator, console: _Console, local_batch):
    """(state, iterator) from the latest checkpoint, or a clear stop when it cannot be resumed."""
    step = checkpointer.latest_step()
    if step is None:
        return state, iterator
    written_by = checkpointer.data_process_count(step)
    restore_data = bool(config.train.get("restore_data_iterator", True))
    if written_by is not None and written_by != jax.process_count() and restore_data:
        raise RuntimeError(
            f"checkpoint step {step} in {checkpointer.directory} was written by {written_by} "
            f"processes and this job has {jax.process_count()}; the data iterators' positions "
            f"belong to the old process count. Relaunch with {written_by} processes to resume "
            "exactly, or pass --config.train.restore_data_iterator=False to restore the model "
            "and optimizer and restart the data stream with a fresh shuffle"
        )
    if restore_data:
        state = checkpointer.restore(state, iterator, step=step)
        console.say(f"resumed from step {step}")
        return state, iterator
    state = checkpointer.restore(state, None, step=step)
    seed = int(config.data.seed) + step
    iterator = _data_iterator(
        config, "train", local_batch=local_batch, augment=bool(config.data.augment), seed=seed
    )
    console.say(
        f"resumed model and optimizer from step {step}; data stream restarted (shuffle seed {seed})"
    )
    return state, iterator


def _train(config, workdir: epath.Path, log_file: str) -> TrainResult:
    console = _Console()
    model_config = model_config_from(config)
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(model_config.to_json())
        (workdir / "train_config.json").write_text(config.to_json_best_effort(indent=2))

    mesh = shd.mesh_from_config(config.mesh)
    console.say(f"workdir {workdir}  (checkpoints/, best/, metrics.jsonl, tensorboard/)")
    console.say(f"library log {log_file}")
    described = family_lib.of_config(config).describe(config, model_config, jax.default_backend())
    console.say(f"{described}; mesh {dict(mesh.shape)} over {jax.process_count()} process(es)")
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
    state, iterator = _restore(config, checkpointer, state, iterator, console, local_batch)
    feed = DeviceFeed(
        iterator, trainer.batch_sharding, depth=int(config.data.get("device_prefetch", 1))
    )
    validator = build_validator(config, trainer, local_batch)

    writer = MetricsWriter(workdir)
    peak, known_peak = device_peak_flops()
    flops_per_token = training_flops_per_token(
        num_params, model_config.num_layers, model_config.embed_dim, int(config.data.seq_len)
    )
    tokens_per_step = global_batch * int(config.data.seq_len)
    log_every, eval_every = int(config.train.log_every), int(config.train.eval_every)
    save_every = int(config.train.checkpoint_every)

    start_step = int(jax.device_get(state.step))
    total_steps = int(config.train.steps)
    first_loss = last_loss = None
    val_metrics: dict[str, float] = {}
    tokens_per_second = mfu = 0.0
    preempted = False
    window = MetricWindow()
    console.start_bar(total_steps, start_step)
    training_clock = TrainingClock()
    watch = PreemptionWatch()
    try:
        step = start_step
        while step < total_steps:
            batch = next(feed)
            state, metrics = trainer.train_step(state, batch)
            step += 1
            window.add(metrics, state.step)
            preempted = watch.reached(step)
            if step < total_steps and not preempted:
                feed.prefetch()  # host work for the next batch overlaps this step
            if console.bar is not None:
                console.bar.update(1)
            if first_loss is None:
                window.check_finite(checkpointer.latest_step())
                first_loss = float(jax.device_get(metrics["loss"]))
            final = step == total_steps or preempted
            if step % log_every == 0 or final:
                window.check_finite(checkpointer.latest_step())
                # Training time only: validations inside the window are not charged to it.
                elapsed = training_clock.elapsed()
                steps_in_window = window.steps
                scalars = window.read()
                tokens_per_second = tokens_per_step * steps_in_window / max(elapsed, 1e-9)
                real_per_step = scalars.get("real_tokens", float(tokens_per_step))
                real_tokens_per_second = real_per_step * steps_in_window / max(elapsed, 1e-9)
                mfu = model_flops_utilization(
                    flops_per_token, real_tokens_per_second, peak * jax.device_count()
                )
                scalars.update(
                    tokens_per_second=tokens_per_second,
                    real_tokens_per_second=real_tokens_per_second,
                    mfu=mfu,
                    step_time=elapsed / max(steps_in_window, 1),
                )
                last_loss = scalars["loss"]
                writer.write(step, scalars, "train")
                if console.bar is not None:
                    console.bar.set_postfix(loss=f"{last_loss:.3f}")
                training_clock.restart()
            if (step % eval_every == 0 or step == total_steps) and not preempted:
                window.check_finite(checkpointer.latest_step())
                jax.block_until_ready(state)  # the steps before it are training time
                with training_clock.excluded():
                    val_metrics = validator(state)
                if val_metrics:
                    writer.write(step, val_metrics, "val")
                    checkpointer.save_if_best(state, val_metrics["loss"])
                    console.say(
                        f"step {step}: val loss {val_metrics['loss']:.4f}  move accuracy "
                        f"{val_metrics['policy_accuracy']:.4f}"
                    )
            if step % save_every == 0 or final:
                window.check_finite(checkpointer.latest_step())
                checkpointer.save(state, feed, force=final)
            if preempted:
                break
        if checkpointer.latest_step() != int(jax.device_get(state.step)):
            window.check_finite(checkpointer.latest_step())
            checkpointer.save(state, feed, force=True)
        checkpointer.wait()  # the last save is committed before anyone is told it is saved
        if preempted:
            console.say(
                f"preempted: step {step} saved and committed in {checkpointer.directory}; "
                "relaunch the same command to resume"
            )
    finally:
        watch.close()
        checkpointer.wait()
        checkpointer.close()
        writer.close()
        feed.close()
        console.close()
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
        preempted=preempted,
        log_file=log_file,
    )


def write_summary(result: TrainResult) -> str:
    lines = [
        ("preempted (resumable) at step " if result.preempted else "trained to step ")
        + f"{result.final_step} in {result.workdir}",
        f"loss: first step {result.first_loss:.4f} -> last logged {result.last_loss:.4f}"
        if result.first_loss is not None and result.last_loss is not None
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
    if result.log_file:
        lines.append(f"library log: {result.log_file}")
    return "\n".join(lines)
