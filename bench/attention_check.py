"""Which whole-game attention kernel ``auto`` picks here, and does it agree with XLA?

Runs the picked kernel and XLA's on the same packed rows (bf16 on an accelerator, float32 on
CPU) and prints the kernel, the largest difference and the forward time of each. Used by
``bench/gpu_check.sh``; exits non-zero if the kernel fails or disagrees (then train with
``--config.model.attention_impl=xla``). Usage: ``python bench/attention_check.py [--batch 8]``.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from allie_jax.model import ModelConfig
from allie_jax.model import attention as A


def packed_segments(batch: int, t: int, seed: int = 0) -> np.ndarray:
    """Rows of several games of random lengths, then padding (segment 0), as the packer makes."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((batch, t), np.int32)
    for row in range(batch):
        pos, game = 0, 1
        while pos < t - 8:
            n = int(rng.integers(8, t // 2))
            seg[row, pos : pos + n] = game
            pos, game = pos + n, game + 1
    return seg


def timed(fn, *args, reps: int = 5) -> tuple[jax.Array, float]:
    out = jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    jax.block_until_ready(out)
    return out, (time.perf_counter() - start) / reps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head_dim", type=int, default=64)
    args = parser.parse_args()
    backend = jax.default_backend()
    dtype = "float32" if backend == "cpu" else "bfloat16"
    impl = ModelConfig(dtype=dtype).resolved_attention_impl(backend)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.seq_len, args.heads, args.head_dim)
    q, k, v = (jnp.asarray(rng.normal(size=shape), dtype) for _ in range(3))
    seg = jnp.asarray(packed_segments(args.batch, args.seq_len))
    ref, t_xla = timed(jax.jit(lambda q, k, v, s: A.xla_attention(q, k, v, s)), q, k, v, seg)
    print(f"backend {backend} ({jax.devices()[0].device_kind}), {dtype}: attention kernel {impl}")
    if impl == "xla":
        print(f"xla forward {1e3 * t_xla:.2f} ms (nothing to compare)")
        return 0
    try:
        out, t_impl = timed(
            jax.jit(lambda q, k, v, s: A.game_attention(impl, q, k, v, s)), q, k, v, seg
        )
    except Exception as err:  # noqa: BLE001 - report any kernel failure and how to continue
        print(f"FAILED: {impl} kernel raised {type(err).__name__}: {err}")
        print("train with --config.model.attention_impl=xla")
        return 1
    real = np.asarray(seg) > 0  # padding rows' outputs are never used
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))[real]))
    ok = diff < 0.05  # bf16 inputs, two different summation orders
    print(
        f"{impl} forward {1e3 * t_impl:.2f} ms, xla {1e3 * t_xla:.2f} ms, max |diff| on real "
        f"tokens {diff:.4f}: {'agree' if ok else 'DISAGREE'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
