"""Compile seconds of the real train step, unrolled against scanned layers (``scan_layers``).

The step is the trainer's (``train.programs``: the named config's optimizer, the state
donated). Nothing is allocated: the model, the train state and the batch are abstract, so a 24-
or 36-layer model compiles on a laptop. One layout per process, so neither compile
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

from allie_jax.train import sharding as shd
from allie_jax.train.loop import model_config_from
from allie_jax.train.programs import build_abstract_programs


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1")


def measure(config) -> dict:
    """Seconds to trace + lower and to compile the train step, and its temporary bytes.

    The step, its abstract state and batch come from ``train.programs`` (what ``launch.train``
    jits and ``launch.compile_check`` compiles), here on a one-device mesh of this host.
    """
    mesh = shd.make_mesh((1, 1, 1), jax.devices()[:1])
    built = build_abstract_programs(config, model_config_from(config), mesh)
    start = time.perf_counter()
    lowered = built.train_step.lower(built.state, built.batch)
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
    config.data.seq_len = args.seq_len
    result = measure(config)
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
