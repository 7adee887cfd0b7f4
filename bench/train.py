"""Training throughput: tokens/s and MFU of the jitted, sharded train step.

Baseline in the same run: the textbook Flax NNX loop (``nnx.Optimizer`` updated inside
``nnx.jit``, no donation), on the same model, batch and optimiser. Usage::

    python bench/train.py [--sizes tiny,allie_124m] [--batch 8] [--seq_len 512] [--steps 5]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx

from allie_jax.data.synthetic import synthetic_batch
from allie_jax.model import AllieModel
from allie_jax.model.losses import loss_fn
from allie_jax.train import sharding as shd
from allie_jax.train.loop import build_trainer, model_config_from
from allie_jax.train.metrics import device_peak_flops, training_flops_per_token
from allie_jax.train.optimizer import make_optimizer
from allie_jax.train.state import count_params
from configs.tiny import get_config


def time_steps(step, state, batch, steps: int) -> tuple[float, object]:
    state, metrics = step(state, batch)  # compile
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / steps, state


def bench_size(name: str, batch: int, seq_len: int, steps: int, dtype: str) -> dict:
    config = get_config()
    config.model.name = name
    config.model.dtype = dtype
    config.model.dropout = 0.1
    config.train.batch_size = batch
    mesh = shd.make_mesh((-1, 1, 1))
    trainer = build_trainer(config, model_config_from(config), mesh)
    host_batch = synthetic_batch(batch, seq_len)
    device_batch = jax.device_put(host_batch, trainer.batch_sharding)
    ours_s, _ = time_steps(trainer.train_step, trainer.state, device_batch, steps)

    # Baseline: stateful NNX optimizer inside nnx.jit.
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
    base_s = (time.perf_counter() - start) / steps

    mc = model_config_from(config)
    n = count_params(trainer.state.params)
    tokens = batch * seq_len
    peak, known = device_peak_flops()
    flops = training_flops_per_token(n, mc.num_layers, mc.embed_dim, seq_len)
    return {
        "size": name,
        "params": n,
        "tokens_per_s": tokens / ours_s,
        "baseline_tokens_per_s": tokens / base_s,
        "ratio": base_s / ours_s,
        "mfu": flops * tokens / ours_s / (peak * jax.device_count()),
        "peak_known": known,
        "device": jax.devices()[0].device_kind,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="tiny,allie_124m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    print(
        f"device: {jax.devices()[0].device_kind} x{jax.device_count()}  batch {args.batch}x{args.seq_len}"
    )
    for name in args.sizes.split(","):
        r = bench_size(name, args.batch, args.seq_len, args.steps, args.dtype)
        print(
            f"{r['size']:>12}: {r['params'] / 1e6:7.1f}M params  {r['tokens_per_s']:10.0f} tok/s  "
            f"baseline (nnx.Optimizer in nnx.jit) {r['baseline_tokens_per_s']:10.0f} tok/s  "
            f"ratio {r['ratio']:.2f}x  MFU {100 * r['mfu']:.1f}%"
            + ("" if r["peak_known"] else " (nominal CPU peak 1e11 FLOP/s)")
        )


if __name__ == "__main__":
    main()
