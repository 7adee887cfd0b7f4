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
from allie_jax.data.pipeline import make_iterator
from allie_jax.model import AllieModel, ModelConfig, board_family
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

SCRATCH = "scratch"  # --config.model.init_from_gpt2=scratch: random initial weights


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


OPTIONAL_MODEL_FIELDS = (
    "attention_impl",
    "remat",
    "scan_layers",
    "max_segments_per_row",
    "embd_pdrop",
    "resid_pdrop",
    "attn_pdrop",
)


def model_config_from(config: ml_collections.ConfigDict) -> ModelConfig:
    if board_family.is_board(config):  # the board-state family (model.family = "board")
        return board_family.model_config_from(config)
    model = config.model
    # Fields a config may leave out or unset take ModelConfig's own defaults (one copy of them).
    overrides = {key: model[key] for key in OPTIONAL_MODEL_FIELDS if model.get(key) is not None}
    return ModelConfig.named(
        model.name, dtype=model.dtype, dropout=float(model.dropout), **overrides
    )


def gpt2_init_path(config: ml_collections.ConfigDict) -> str | None:
    """The GPT-2 file to start from, or None for random weights.

    Configs that must not train from random weights by accident (``allie_medium``) leave the field
    unset; the run then stops and asks for a path or ``scratch``.
    """
    value = config.model.init_from_gpt2
    if value is None:
        raise ValueError(
            f"config.model.init_from_gpt2 is required for {config.model.name}: pass "
            "--config.model.init_from_gpt2=/path/to/gpt2-medium/model.safetensors (the paper's "
            f"start) or --config.model.init_from_gpt2={SCRATCH} (random weights)"
        )
    return None if value in ("", SCRATCH) else str(value)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Fail fast on everything a misconfigured pod job would otherwise discover late."""
    if not config.data.data_dir:
        raise ValueError(
            "config.data.data_dir is empty: pass --data_dir (output of launch.prepare_data)"
        )
    # prepare_data's DATA_DIR/train or a TFDS build; FileNotFoundError says what to run.
    shards.find_shards(config.data.data_dir, "train")
    gpt2 = gpt2_init_path(config)
    if gpt2 and not as_path(gpt2).is_file():
        raise FileNotFoundError(f"config.model.init_from_gpt2 names a missing file: {gpt2}")
    # The batch rules the compile check applies to devices it does not have (one copy).
    programs.check_batch(config, jax.device_count(), jax.process_count())
    # Raises on an unknown size, dtype, attention_impl or remat, and on attention dropout with a
    # kernel that has none.
    model_config = model_config_from(config)
    if hasattr(model_config, "check_attention_dropout"):
        model_config.check_attention_dropout(jax.default_backend())


def create_sharded_state(model_config: ModelConfig, config, mesh, tx, init_params=None):
    """Initialise parameters directly into their shardings (no full copy on one device)."""

    def build():
        if board_family.is_board(config):
            return board_family.build_model(model_config, int(config.train.seed))
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
    shardings = programs.replicate_unsharded(state_shardings_of(state), mesh)
    return graphdef, jax.device_put(state, shardings)


def state_shardings_of(state: TrainState):
    return jax.tree.map(lambda x: x.sharding, state)


def _data_iterator(
    config, split: str, *, local_batch: int, augment: bool, num_epochs=None, seed=None
):
    if board_family.is_board(config):
        return board_family.data_iterator(
            config,
            split,
            local_batch=local_batch,
            shard_index=jax.process_index(),
            shard_count=jax.process_count(),
            augment=augment,
            num_epochs=num_epochs,
            seed=seed,
        )
    train = split == "train"
    return make_iterator(
        config.data.data_dir,
        split,
        batch_size=local_batch,
        seq_len=int(config.data.seq_len),
        seed=int(config.data.seed if seed is None else seed),
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
        augment=augment,
        num_epochs=num_epochs,
        worker_count=int(config.data.get("worker_count", 0)) if train else 0,
        # One segment slot of the cuDNN kernel's static layout stays for the padding run.
        max_games_per_row=model_config_from(config).max_segments_per_row - 1,
        worker_buffer_size=int(config.data.get("worker_buffer_size", 1)),
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


def build_trainer(config, model_config: ModelConfig, mesh) -> Trainer:
    tx = make_optimizer(config.train)
    init_params = None
    path = gpt2_init_path(config)
    if path:
        from allie_jax.convert.gpt2 import gpt2_to_params, read_safetensors

        init_params = gpt2_to_params(
            read_safetensors(path), model_config, seed=int(config.train.seed), source=path
        )
    graphdef, state = create_sharded_state(model_config, config, mesh, tx, init_params)
    board = board_family.is_board(config)
    forward_loss = board_family.forward_loss if board else None
    eval_sums = board_family.eval_sums if board else None
    state_sh = state_shardings_of(state)
    # The same jitted programs launch.compile_check compiles for accelerators (train/programs.py).
    train_step = programs.jit_train_step(config, graphdef, tx, state_sh, mesh, forward_loss)
    eval_step = programs.jit_eval_step(graphdef, state_sh, mesh, eval_sums)
    return Trainer(graphdef, state, train_step, eval_step, shd.batch_sharding(mesh), mesh)


def build_validator(config, trainer: Trainer, local_batch: int) -> Validator:
    if board_family.is_board(config):
        return board_family.build_validator(config, trainer, local_batch, _data_iterator)
    return Validator(
        lambda: _data_iterator(config, "val", local_batch=local_batch, augment=False, num_epochs=1),
        trainer.eval_step,
        trainer.batch_sharding,
        rows=local_batch,
        seq_len=int(config.data.seq_len),
        max_batches=int(config.train.eval_batches),
        weights=tuple(config.train.loss_weights),
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
    gpt2 = gpt2_init_path(config)
    console.say(f"workdir {workdir}  (checkpoints/, best/, metrics.jsonl, tensorboard/)")
    console.say(f"library log {log_file}")
    console.say(
        f"model {config.model.name}, {'GPT-2 weights from ' + gpt2 if gpt2 else 'random initial weights (scratch)'}, "
        f"attention {model_config.resolved_attention_impl(jax.default_backend())}, remat {model_config.remat}; "
        f"mesh {dict(mesh.shape)} over {jax.process_count()} process(es)"
    )
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
