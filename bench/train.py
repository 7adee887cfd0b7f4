"""Training throughput: can the input pipeline feed the step, and how fast is the step?

Three timings per model size, interleaved round by round (A B C A B C ...) so machine load hits
them alike, medians over rounds:

- **pipeline**: ArrayRecord shards -> grain (decode, augment, pack; ``--workers`` processes) ->
  host batches, alone. Tokens/s of this host process (batch x seq_len slots per batch).
- **step**: the jitted, sharded train step on a batch already on the device.
- **real**: the training loop's path, shards -> grain -> ``DeviceFeed`` (next batch fetched and
  transferred while the step runs) -> step.

The ratio pipeline/step says how much head-room the input has (> 1: it keeps up); real/step says
what the feed costs. ``--baseline`` adds the textbook Flax NNX loop (``nnx.Optimizer`` inside
``nnx.jit``, no donation) on the same model and batch. Usage::

    python bench/train.py [--sizes tiny,allie_124m] [--batch 8] [--seq_len 512] [--steps 3]
        [--rounds 5] [--workers 0] [--pipeline_batches 16] [--data_dir DIR] [--dtype float32]
        [--grad_accum 1] [--attention_impl auto] [--remat none] [--baseline]

Without ``--data_dir`` the bundled sample games are prepared into a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
from flax import nnx

from allie_jax.data.pipeline import make_iterator
from allie_jax.data.synthetic import synthetic_batch
from allie_jax.model import AllieModel
from allie_jax.model.losses import loss_fn
from allie_jax.train import sharding as shd
from allie_jax.train.feed import DeviceFeed
from allie_jax.train.loop import build_trainer, model_config_from
from allie_jax.train.metrics import (
    device_peak_flops,
    model_flops_utilization,
    training_flops_per_token,
)
from allie_jax.train.optimizer import make_optimizer
from allie_jax.train.state import count_params
from allie_jax.train.step import real_tokens as step_real_tokens
from configs.tiny import get_config

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "sample", "lichess_sample.pgn.zst")


def prepared_sample() -> str:
    from allie_jax.data.prepare import PrepareConfig, prepare

    out = tempfile.mkdtemp(prefix="bench_train_")
    prepare([SAMPLE], out, PrepareConfig(events="all", val_frac=0.05, test_frac=0.05))
    return out


def pipeline_iterator(data_dir: str, batch: int, seq_len: int, workers: int):
    return make_iterator(
        data_dir, "train", batch_size=batch, seq_len=seq_len, augment=True, worker_count=workers
    )


def time_pipeline(iterator, batches: int) -> float:
    """Seconds per batch, host batches only."""
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - start) / batches


def time_steps(step, state, batch, steps: int):
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / steps, state


def time_real(step, state, feed: DeviceFeed, steps: int):
    """The loop's order: take the prefetched batch, dispatch the step, fetch the next one."""
    start = time.perf_counter()
    for _ in range(steps):
        batch = next(feed)
        state, metrics = step(state, batch)
        feed.prefetch()
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / steps, state


def time_baseline(config, host_batch, steps: int) -> float:
    model = AllieModel(model_config_from(config), rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, make_optimizer(config.train), wrt=nnx.Param)

    @nnx.jit
    def baseline_step(model, optimizer, batch):
        def loss_of(model):
            out = model(
                batch["inputs"],
                positions=batch["positions"],
                segment_ids=batch["segment_ids"],
                deterministic=False,
            )
            return loss_fn(out, batch)[0]

        loss, grads = nnx.value_and_grad(loss_of)(model)
        optimizer.update(model, grads)
        return loss

    jb = {k: jnp.asarray(v) for k, v in host_batch.items()}
    jax.block_until_ready(baseline_step(model, optimizer, jb))
    start = time.perf_counter()
    for _ in range(steps):
        loss = baseline_step(model, optimizer, jb)
    jax.block_until_ready(loss)
    return (time.perf_counter() - start) / steps


def peak_device_bytes() -> int | None:
    """The most any device held so far (``memory_stats``: GPU/TPU; None on CPU, which has none)."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) if peaks else None


def bench_size(name: str, args, data_dir: str) -> dict:
    config = get_config()
    config.model.name = name
    config.model.dtype = args.dtype
    config.model.dropout = 0.1
    config.train.batch_size = args.batch
    config.train.grad_accum = args.grad_accum
    config.model.attention_impl = args.attention_impl
    config.model.remat = args.remat
    # The paper's sizes train with their layers scanned (configs/allie_medium.py, allie_large.py).
    config.model.scan_layers = name in ("allie_medium", "allie_large")
    config.data.seq_len = args.seq_len
    mesh = shd.make_mesh((-1, 1, 1))
    trainer = build_trainer(config, model_config_from(config), mesh)
    host = pipeline_iterator(data_dir, args.batch, args.seq_len, args.workers)
    feed = DeviceFeed(
        pipeline_iterator(data_dir, args.batch, args.seq_len, args.workers), trainer.batch_sharding
    )
    first = next(host)
    # MFU counts game tokens only (padding slots are no model work), as launch.train does.
    real_tokens = int(step_real_tokens(first))
    device_batch = jax.device_put(first, trainer.batch_sharding)
    state = trainer.state
    state, metrics = trainer.train_step(state, device_batch)  # compile
    jax.block_until_ready(metrics)
    time_pipeline(host, 2)  # start the workers
    feed.prefetch()

    pipe, step, real = [], [], []
    for _ in range(args.rounds):
        pipe.append(time_pipeline(host, args.pipeline_batches))
        s, state = time_steps(trainer.train_step, state, device_batch, args.steps)
        step.append(s)
        r, state = time_real(trainer.train_step, state, feed, args.steps)
        real.append(r)
    for it in (host, feed):
        close = getattr(it, "close", None)
        if close:
            close()

    tokens = args.batch * args.seq_len
    mc = model_config_from(config)
    n = count_params(trainer.state.params)
    peak, known = device_peak_flops()
    flops = training_flops_per_token(n, mc.num_layers, mc.embed_dim, args.seq_len)
    ratios = [s / p for p, s in zip(pipe, step, strict=True)]  # pipeline tok/s over step tok/s
    result = {
        "size": name,
        "params": n,
        "pipeline_tokens_per_s": tokens / statistics.median(pipe),
        "step_tokens_per_s": tokens / statistics.median(step),
        "real_tokens_per_s": tokens / statistics.median(real),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
        "real_over_step": statistics.median(s / r for s, r in zip(step, real, strict=True)),
        "mfu": model_flops_utilization(
            flops, real_tokens / statistics.median(step), peak * jax.device_count()
        ),
        "real_token_share": real_tokens / tokens,
        "peak_known": known,
        "attention": mc.resolved_attention_impl(jax.default_backend()),
        "peak_device_bytes": peak_device_bytes(),
    }
    if args.baseline:
        base = time_baseline(config, synthetic_batch(args.batch, args.seq_len), args.steps)
        result["baseline_tokens_per_s"] = tokens / base
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="tiny,allie_124m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0, help="grain worker processes")
    parser.add_argument(
        "--pipeline_batches",
        type=int,
        default=16,
        help="batches per pipeline timing (well past the workers' buffers)",
    )
    parser.add_argument("--data_dir", default="", help="prepared shards (default: the sample)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--grad_accum", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--attention_impl", default="auto", help="auto | xla | cudnn | splash")
    parser.add_argument("--remat", default="none", help="none | dots_saveable | full")
    parser.add_argument("--baseline", action="store_true")
    args = parser.parse_args()
    data_dir = args.data_dir or prepared_sample()
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?"
    print(
        f"device: {jax.devices()[0].device_kind} x{jax.device_count()}  batch "
        f"{args.batch}x{args.seq_len}  grain workers {args.workers}  rounds {args.rounds}  "
        f"load {' '.join(load)}"
    )
    for name in args.sizes.split(","):
        r = bench_size(name, args, data_dir)
        lo, hi = r["ratio_range"]
        print(
            f"{r['size']:>12}: {r['params'] / 1e6:6.1f}M params  pipeline "
            f"{r['pipeline_tokens_per_s']:9.0f} tok/s/process  step {r['step_tokens_per_s']:9.0f} "
            f"tok/s  pipeline/step {r['ratio']:.2f}x ({lo:.2f}-{hi:.2f})  real path "
            f"{r['real_tokens_per_s']:9.0f} tok/s ({100 * r['real_over_step']:.0f}% of step)  "
            f"MFU {100 * r['mfu']:.1f}% (real tokens, {100 * r['real_token_share']:.0f}% of slots)"
            + ("" if r["peak_known"] else " (nominal CPU peak)")
            + f"  attention {r['attention']}"
            + (
                f"  peak device memory {r['peak_device_bytes'] / 2**30:.1f} GiB"
                if r["peak_device_bytes"] is not None
                else ""
            )
        )
        if "baseline_tokens_per_s" in r:
            print(
                f"{'':>12}  baseline (nnx.Optimizer in nnx.jit) "
                f"{r['baseline_tokens_per_s']:9.0f} tok/s"
            )


if __name__ == "__main__":
    main()
