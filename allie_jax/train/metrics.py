"""Metric logging (TensorBoard event files + metrics.jsonl) and throughput / MFU accounting."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
from etils import epath

from allie_jax.data.paths import as_path, is_remote

# Dense bf16 peak FLOP/s per device (the figure MFU is measured against). CPU has no meaningful
# peak; we fall back to a nominal one so the column is still filled (marked in the log).
PEAK_FLOPS_BY_DEVICE_KIND: dict[str, float] = {
    "NVIDIA H200": 989e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100": 312e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,  # what a v5p chip reports as its device_kind
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}
NOMINAL_CPU_PEAK_FLOPS = 1e11


def device_peak_flops(device: jax.Device | None = None) -> tuple[float, bool]:
    """(peak FLOP/s of one device, whether the table knew the device)."""
    device = device or jax.devices()[0]
    kind = device.device_kind
    if kind in PEAK_FLOPS_BY_DEVICE_KIND:
        return PEAK_FLOPS_BY_DEVICE_KIND[kind], True
    for name, flops in PEAK_FLOPS_BY_DEVICE_KIND.items():
        if kind.startswith(name):
            return flops, True
    return NOMINAL_CPU_PEAK_FLOPS, False


def training_flops_per_token(
    num_params: int, num_layers: int, embed_dim: int, seq_len: int
) -> float:
    """6·N for the matmuls plus the attention term of PaLM's appendix B (12·L·d·T)."""
    return 6.0 * num_params + 12.0 * num_layers * embed_dim * seq_len


def model_flops_utilization(
    flops_per_token: float, real_tokens_per_second: float, peak_flops: float
) -> float:
    """MFU: model FLOPs of the *real* tokens (game tokens; padding slots excluded) per second,
    over the peak of all devices. Padding is compute the step spends but no model work, so
    counting slots would report packing waste as utilization."""
    return flops_per_token * real_tokens_per_second / peak_flops


class TrainingClock:
    """Seconds of training in the current log window: time spent in ``excluded()`` blocks
    (validation) is not charged to the window's throughput and MFU."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.restart()

    def restart(self) -> None:
        self._start, self._excluded = self._clock(), 0.0

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        start = self._clock()
        try:
            yield
        finally:
            self._excluded += self._clock() - start

    def elapsed(self) -> float:
        return self._clock() - self._start - self._excluded


class _RewrittenFile:
    """Append-only lines on a store without append (gs://): kept in memory, the whole file
    rewritten at most every ``every_s`` seconds and on close. Lines already in the file (a
    resumed run) are kept."""

    def __init__(self, path: epath.Path, every_s: float = 60.0):
        self.path, self.every_s = path, every_s
        self.lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        self.written = time.monotonic()

    def write(self, line: str) -> None:
        self.lines.append(line)
        if time.monotonic() - self.written > self.every_s:
            self.flush()

    def flush(self) -> None:
        self.path.write_text("".join(self.lines))
        self.written = time.monotonic()

    def close(self) -> None:
        self.flush()


class _UploadedEvents:
    """TensorBoard event files for a remote workdir, written locally and copied up through epath.

    tensorboardX's own gs:// writer bypasses epath and re-uploads from its ``__del__`` (a
    request at interpreter exit, after ``close``); instead events go to a local temporary folder
    and each file is copied to ``WORKDIR/tensorboard/`` at most every ``every_s`` seconds and
    on close. A resumed run writes a new event file beside the old ones, as locally.
    """

    def __init__(self, remote: epath.Path, every_s: float = 60.0):
        import tempfile

        from tensorboardX import SummaryWriter

        self.remote, self.every_s = remote, every_s
        self.local = tempfile.mkdtemp(prefix="allie_tensorboard_")
        self.writer = SummaryWriter(self.local)
        self.uploaded = time.monotonic()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)
        if time.monotonic() - self.uploaded > self.every_s:
            self.flush()

    def flush(self) -> None:
        import os

        self.writer.flush()
        self.remote.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(self.local)):
            with open(os.path.join(self.local, name), "rb") as f:
                (self.remote / name).write_bytes(f.read())
        self.uploaded = time.monotonic()

    def close(self) -> None:
        import shutil

        self.writer.close()
        self.flush()
        shutil.rmtree(self.local, ignore_errors=True)


class MetricsWriter:
    """Writes scalars to TensorBoard and one JSON object per line to ``metrics.jsonl``.

    Only process 0 writes, so a pod job produces one log. ``workdir`` may be remote (epath).
    """

    def __init__(self, workdir: epath.PathLike, *, tensorboard: bool = True):
        self.enabled = jax.process_index() == 0
        self._jsonl = None
        self._tb = None
        if not self.enabled:
            return
        workdir = as_path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "metrics.jsonl"
        if is_remote(workdir):
            self._jsonl = _RewrittenFile(path)
        else:
            self._jsonl = open(path, "a", buffering=1)  # noqa: SIM115
        if tensorboard and is_remote(workdir):
            self._tb = _UploadedEvents(workdir / "tensorboard")
        elif tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float], prefix: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        record = {"step": int(step), "split": prefix, "time": time.time(), **clean}
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(f"{prefix}/{key}", value, int(step))

    def flush(self) -> None:
        if self.enabled:
            if self._tb is not None:
                self._tb.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            if self._tb is not None:
                self._tb.close()
            self._jsonl.close()
            self.enabled = False


class NonFiniteLossError(RuntimeError):
    """The loss stopped being finite; nothing from that step on was evaluated or saved."""


@jax.jit
def _accumulate(sums, first_bad, metrics, step):
    sums = jax.tree.map(jnp.add, sums, metrics)
    bad = ~jnp.isfinite(metrics["loss"])
    return sums, jnp.where((first_bad == 0) & bad, step, first_bad)


class MetricWindow:
    """Step metrics summed on the device; read every ``log_every`` steps as window means.

    Reading a scalar every step would make the host wait for each step to finish before it can
    dispatch the next. Here the host only syncs when it reads the window (or checks, before a
    save or an evaluation, that no step since the last read had a non-finite loss).
    """

    LAST_VALUE = ("learning_rate",)  # reported at the window's last step, not averaged

    def __init__(self) -> None:
        self._sums = None
        self._last = None
        self._first_bad = jnp.zeros((), jnp.int32)
        self.steps = 0

    def add(self, metrics: Mapping[str, jax.Array], step: jax.Array) -> None:
        metrics = dict(metrics)
        if self._sums is None:
            self._sums = jax.tree.map(jnp.zeros_like, metrics)
        self._sums, self._first_bad = _accumulate(self._sums, self._first_bad, metrics, step)
        self._last = metrics
        self.steps += 1

    def check_finite(self, last_saved: int | None) -> None:
        bad = int(jax.device_get(self._first_bad))
        if bad:
            raise NonFiniteLossError(
                f"non-finite loss at step {bad}; nothing from that step on was saved, the last "
                f"checkpoint is step {last_saved}"
            )

    def read(self) -> dict[str, float]:
        """Means over the steps since the last read (then starts a new window)."""
        if not self.steps:
            return {}
        sums, last = jax.device_get((self._sums, self._last))
        out = {k: float(v) / self.steps for k, v in sums.items()}
        out.update({k: float(last[k]) for k in self.LAST_VALUE if k in last})
        self._sums, self.steps = None, 0
        return out
