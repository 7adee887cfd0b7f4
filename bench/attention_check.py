"""Which whole-game attention kernel ``auto`` picks here, and does it agree with XLA, forward
*and* backward, on packed rows?

Runs the picked kernel and XLA's on the same packed rows (several games of random lengths per
row, then padding, as the packer makes them; bf16 on an accelerator, float32 on CPU) and compares
the outputs and the gradients of a scalar loss with respect to q, k and v on the real (non-pad)
tokens. A kernel that reads another game's tokens (a wrong packed layout) disagrees here. Used by
``bench/gpu_check.sh`` before its training bench; exits non-zero if the kernel fails or
disagrees (then train with ``--config.model.attention_impl=xla``).
Usage: ``python bench/attention_check.py [--batch 8]``.
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


def packed_segments(batch: int, t: int, max_games: int, seed: int = 0) -> np.ndarray:
    """Rows of several games of random lengths, then padding (segment 0), as the packer makes."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((batch, t), np.int32)
    for row in range(batch):
        pos, game = 0, 1
        while pos < t - 8 and game <= max_games:
            n = int(rng.integers(8, max(9, t // 6)))
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


def forward_and_grads(kernel, q, k, v, seg):
    """(output, (dq, dk, dv)) of ``sum(out · cos(out))`` over the real tokens, in float32."""
    real = (seg > 0)[:, :, None, None]

    def loss(q, k, v):
        out = kernel(q, k, v, seg).astype(jnp.float32)
        return jnp.sum(jnp.where(real, out * jnp.cos(out), 0.0)), out

    (_, out), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def max_diff(a, b, real) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.max(jnp.where(real[:, :, None, None], jnp.abs(a - b), 0.0)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument(
        "--kernel",
        default="",
        help="check this kernel instead of auto's pick (splash on CPU: "
        "Pallas interpret mode, a dry run of the comparison)",
    )
    args = parser.parse_args()
    backend = jax.default_backend()
    dtype = "float32" if backend == "cpu" else "bfloat16"
    config = ModelConfig(dtype=dtype)
    impl = args.kernel or config.resolved_attention_impl(backend)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.seq_len, args.heads, args.head_dim)
    q, k, v = (jnp.asarray(rng.normal(size=shape), dtype) for _ in range(3))
    seg_np = packed_segments(args.batch, args.seq_len, config.max_segments_per_row - 1)
    seg = jnp.asarray(seg_np)
    games = int(np.asarray(A.segments_per_row(seg)).max())
    xla = jax.jit(lambda q, k, v, s: forward_and_grads(A.xla_attention, q, k, v, s))
    (ref, ref_grads), t_xla = timed(xla, q, k, v, seg)
    print(
        f"backend {backend} ({jax.devices()[0].device_kind}), {dtype}: attention kernel {impl}; "
        f"{args.batch} packed rows of {args.seq_len} tokens, up to {games} segments per row"
    )
    if impl == "xla":
        print(f"xla forward+backward {1e3 * t_xla:.2f} ms (nothing to compare)")
        return 0

    def picked(q, k, v, s):
        if impl == "splash" and backend == "cpu":
            return A.splash_attention(q, k, v, s, interpret=True)
        return A.game_attention(impl, q, k, v, s, max_segments=config.max_segments_per_row)

    try:
        run = jax.jit(lambda q, k, v, s: forward_and_grads(picked, q, k, v, s))
        (out, grads), t_impl = timed(run, q, k, v, seg)
    except Exception as err:  # noqa: BLE001 - report any kernel failure and how to continue
        print(f"FAILED: {impl} kernel raised {type(err).__name__}: {err}")
        print("train with --config.model.attention_impl=xla")
        return 1
    real = seg > 0  # padding rows' outputs are never used
    diffs = {"out": max_diff(out, ref, real)}
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        scale = float(jnp.max(jnp.abs(r.astype(jnp.float32)))) or 1.0
        diffs[name] = max_diff(g, r, real) / scale  # relative to the largest gradient entry
    ok = diffs["out"] < 0.05 and all(diffs[n] < 0.05 for n in ("dq", "dk", "dv"))
    print(
        f"{impl} forward+backward {1e3 * t_impl:.2f} ms, xla {1e3 * t_xla:.2f} ms; max |diff| "
        f"on real tokens: out {diffs['out']:.4f}, dq {diffs['dq']:.4f}, dk {diffs['dk']:.4f}, "
        f"dv {diffs['dv']:.4f} (gradients relative to their largest entry): "
        f"{'agree' if ok else 'DISAGREE'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
