"""What one accelerator chip can do: the three numbers a roofline needs, with their sources.

Per JAX device, which is one chip on every target here (v4 and v5p run their two TensorCores as
one "megacore" device). Peak is dense bf16 matrix FLOP/s (no sparsity), the figure MFU is quoted
against; HBM is the chip's memory; bandwidth is HBM bandwidth.

=======  ==============  ==========  =============  ===============================================
chip     peak bf16       HBM         HBM bandwidth  source
=======  ==============  ==========  =============  ===============================================
v4       275 TFLOP/s     32 GiB      1,200 GB/s     https://cloud.google.com/tpu/docs/v4
v5e      197 TFLOP/s     16 GiB      819 GB/s       https://cloud.google.com/tpu/docs/v5e
v5p      459 TFLOP/s     95 GiB      2,765 GB/s     https://cloud.google.com/tpu/docs/v5p
v6e      918 TFLOP/s     32 GiB      1,640 GB/s     https://cloud.google.com/tpu/docs/v6e
H100     989 TFLOP/s     80 GiB      3,350 GB/s     NVIDIA H100 Tensor Core GPU datasheet (SXM5)
H200     989 TFLOP/s     141 GiB     4,800 GB/s     NVIDIA H200 Tensor Core GPU datasheet (SXM)
=======  ==============  ==========  =============  ===============================================

NVIDIA's "80 GB" and "141 GB" are what ``nvidia-smi`` shows as about 80 and 141 GiB, so they are
taken as GiB. The usable HBM is a little less than the table's (the runtime reserves some; JAX on
GPU preallocates 75% unless ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise), which is why the
TPU compiler's own out-of-memory verdict, when it gives one, is reported beside the table's.
The peaks agree with ``train.metrics.PEAK_FLOPS_BY_DEVICE_KIND`` (checked by the tests).
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    device_kind: str  # what jax.Device.device_kind says for it
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: int
    hbm_bandwidth: float  # bytes/s

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip("v4", "TPU v4", 275e12, 32 * GiB, 1200e9),
        Chip("v5e", "TPU v5 lite", 197e12, 16 * GiB, 819e9),
        Chip("v5p", "TPU v5", 459e12, 95 * GiB, 2765e9),
        Chip("v6e", "TPU v6 lite", 918e12, 32 * GiB, 1640e9),
        Chip("h100", "NVIDIA H100 80GB HBM3", 989e12, 80 * GiB, 3350e9),
        Chip("h200", "NVIDIA H200", 989e12, 141 * GiB, 4800e9),
    )
}
