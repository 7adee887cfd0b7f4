"""Metric logging (TensorBoard event files + metrics.jsonl) and throughput / MFU accounting."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Mapping

import jax

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


class MetricsWriter:
    """Writes scalars to TensorBoard and one JSON object per line to ``metrics.jsonl``.

    Only process 0 writes, so a pod job produces one log.
    """

    def __init__(self, workdir: str | pathlib.Path):
        self.enabled = jax.process_index() == 0
        self._jsonl = None
        self._tb = None
        if not self.enabled:
            return
        workdir = pathlib.Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float], prefix: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        record = {"step": int(step), "split": prefix, "time": time.time(), **clean}
        self._jsonl.write(json.dumps(record) + "\n")
        for key, value in clean.items():
            self._tb.add_scalar(f"{prefix}/{key}", value, int(step))

    def flush(self) -> None:
        if self.enabled:
            self._tb.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            self._tb.close()
            self._jsonl.close()
            self.enabled = False
