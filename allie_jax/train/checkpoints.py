"""Checkpoints that never lose work: the last K steps (with the data iterator) plus the best one.

Layout of a training workdir::

    WORKDIR/config.json            model config (so a checkpoint loads without the training config)
    WORKDIR/checkpoints/<step>/    params, train state (optimizer, RNG, step), data iterator state
    WORKDIR/best/<step>/           params and train state of the lowest validation loss so far

Two managers, because Orbax's ``best_fn`` replaces "keep the last K" rather than adding to it.

A run resumes in the layer layout it was saved in (``ModelConfig.scan_layers``): a checkpoint of
the other layout is refused with the flag that resumes it, because the optimizer state mirrors
the parameters' tree and is not restacked. The parameters alone load in either layout through
``model.checkpoint.load_model`` (evaluation, play, a fresh run's initial weights).
"""

from __future__ import annotations

import re
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from allie_jax.model import layer_layout
from allie_jax.train import paths
from allie_jax.train.state import TrainState


def _state_items(state: TrainState) -> dict[str, Any]:
    return {
        "params": nnx.to_pure_dict(state.params),
        "train_state": {
            "step": state.step,
            "rest": nnx.to_pure_dict(state.rest),
            "opt_state": state.opt_state,
        },
    }


class Checkpointer:
    def __init__(
        self,
        workdir: str | epath.PathLike,
        *,
        keep: int = 3,
        save_every: int = 1000,
        async_save: bool = True,
    ):
        workdir = paths.absolute(workdir)
        self.directory = workdir / "checkpoints"
        self.latest = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                save_interval_steps=save_every,
                enable_async_checkpointing=async_save,
                create=True,
            ),
        )
        self.best = ocp.CheckpointManager(
            workdir / "best",
            options=ocp.CheckpointManagerOptions(
                max_to_keep=1,
                best_fn=lambda metrics: metrics["loss"],
                best_mode="min",
                enable_async_checkpointing=async_save,
                create=True,
            ),
        )
        self.best_loss = float("inf")
        if self.best.latest_step() is not None:
            metrics = self.best.metrics(self.best.latest_step()) or {}
            self.best_loss = float(metrics.get("loss", float("inf")))

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def data_process_count(self, step: int) -> int | None:
        """How many processes wrote step ``step``'s data-iterator states (None: no data item)."""
        data = self.directory / str(step) / "data"
        if not data.is_dir():
            return None
        for f in data.iterdir():
            match = re.fullmatch(r"process_\d+-of-(\d+)\.json", f.name)
            if match:
                return int(match.group(1))
        return None

    def save(self, state: TrainState, data_iterator=None, *, force: bool = False) -> bool:
        step = int(jax.device_get(state.step))
        items = {k: ocp.args.StandardSave(v) for k, v in _state_items(state).items()}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        return self.latest.save(step, args=ocp.args.Composite(**items), force=force)

    def save_if_best(self, state: TrainState, val_loss: float) -> bool:
        if not val_loss < self.best_loss:
            return False
        self.best_loss = val_loss
        step = int(jax.device_get(state.step))
        items = {k: ocp.args.StandardSave(v) for k, v in _state_items(state).items()}
        return self.best.save(
            step, args=ocp.args.Composite(**items), metrics={"loss": float(val_loss)}, force=True
        )

    def restore(self, abstract_state: TrainState, data_iterator=None, step: int | None = None):
        """Restore into the shapes/shardings of ``abstract_state``; returns the new TrainState."""
        step = self.latest.latest_step() if step is None else step
        target = _state_items(abstract_state)
        self._check_layer_layout(step, target["params"])
        abstract = jax.tree.map(
            lambda x: ocp.utils.to_shape_dtype_struct(x) if hasattr(x, "shape") else x, target
        )
        items = {k: ocp.args.StandardRestore(v) for k, v in abstract.items()}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        restored = self.latest.restore(step, args=ocp.args.Composite(**items))
        params = abstract_state.params
        nnx.replace_by_pure_dict(params, restored["params"])
        rest = abstract_state.rest
        nnx.replace_by_pure_dict(rest, restored["train_state"]["rest"])
        return TrainState(
            step=restored["train_state"]["step"],
            params=params,
            rest=rest,
            opt_state=restored["train_state"]["opt_state"],
        )

    def _check_layer_layout(self, step: int, params: dict) -> None:
        """A clear stop when step ``step`` holds the other layer layout than this run's model."""
        if not {layer_layout.UNROLLED_KEY, layer_layout.SCANNED_KEY} & set(params):
            return  # a family without the decoder's layers (board family)
        saved = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "params")
        saved_keys = set(saved.tree)
        if not {layer_layout.UNROLLED_KEY, layer_layout.SCANNED_KEY} & saved_keys:
            return
        was_scanned = layer_layout.is_scanned(saved.tree)
        if was_scanned != layer_layout.is_scanned(params):
            raise ValueError(
                f"checkpoint step {step} in {self.directory} holds the "
                f"{'scanned' if was_scanned else 'unrolled'} layer layout and this run's model "
                f"the other; resume with --config.model.scan_layers={was_scanned} (the same "
                "model, only compiled differently; the optimizer state is not restacked)"
            )

    def wait(self) -> None:
        self.latest.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.latest.close()
        self.best.close()
