"""Compile seconds of the real train step, unrolled against scanned layers (``scan_layers``).

The step is the trainer's: ``make_train_step`` with the named config's optimizer
(``make_optimizer``), jitted with the state donated. Nothing is allocated: the model, the train
state and the batch are abstract (``nnx.eval_shape``, ``jax.eval_shape``, ``ShapeDtypeStruct``),
so a 24- or 36-layer model compiles on a laptop. One layout per process, so neither compile
reuses the other's caches:

    python -m bench.compile_layers --config allie_medium --scan_layers=false
    python -m bench.compile_layers --config allie_medium --scan_layers=true

Prints one JSON line: trace + lower seconds, XLA compile seconds, and the compiled step's
temporary memory (what the backward pass keeps), which a scan must not blow up.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

import jax
from flax import nnx

from allie_jax.data.synthetic import synthetic_batch
from allie_jax.model import AllieModel
from allie_jax.train.loop import model_config_from
from allie_jax.train.optimizer import learning_rate_schedule, make_optimizer
from allie_jax.train.state import init_train_state
from allie_jax.train.step import make_train_step


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1")


def abstract_step_inputs(config, batch: int, seq_len: int):
    """(graphdef, abstract TrainState, abstract batch, optimizer) for ``config``: shapes only."""
    model_config = model_config_from(config)
    abstract = nnx.eval_shape(lambda: AllieModel(model_config, rngs=nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    tx = make_optimizer(config.train)
    state = jax.eval_shape(lambda p, r: init_train_state(p, r, tx), params, rest)
    example = synthetic_batch(batch, seq_len)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in example.items()}
    return graphdef, state, shapes, tx


def measure(config, batch: int, seq_len: int) -> dict:
    """Seconds to trace + lower and to compile the train step, and its temporary bytes."""
    graphdef, state, shapes, tx = abstract_step_inputs(config, batch, seq_len)
    step = make_train_step(
        graphdef,
        tx,
        grad_accum=int(config.train.grad_accum),
        loss_weights=tuple(config.train.loss_weights),
        schedule=learning_rate_schedule(config.train),
    )
    start = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=(0,)).lower(state, shapes)
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    memory = compiled.memory_analysis()
    temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
    return {
        "trace_lower_s": round(traced - start, 1),
        "compile_s": round(done - traced, 1),
        "total_s": round(done - start, 1),
        "temp_gib": None if temp is None else round(temp / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="allie_medium", help="a configs/ module name")
    parser.add_argument("--scan_layers", type=_flag, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention_impl", default="xla")
    parser.add_argument("--remat", default=None, help="override config.model.remat")
    parser.add_argument("--grad_accum", type=int, default=1)
    args = parser.parse_args()
    config = importlib.import_module(f"configs.{args.config}").get_config()
    config.model.scan_layers = args.scan_layers
    config.model.dtype = args.dtype
    config.model.attention_impl = args.attention_impl
    if args.remat is not None:
        config.model.remat = args.remat
    config.train.batch_size = args.batch
    config.train.grad_accum = args.grad_accum
    result = measure(config, args.batch, args.seq_len)
    layers = model_config_from(config).num_layers
    print(
        json.dumps(
            {
                "config": args.config,
                "layers": layers,
                "scan_layers": args.scan_layers,
                "batch": [args.batch, args.seq_len],
                "dtype": args.dtype,
                "attention_impl": args.attention_impl,
                "remat": config.model.remat,
                "backend": jax.default_backend(),
                "jax": jax.__version__,
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()
