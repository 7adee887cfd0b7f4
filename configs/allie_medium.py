"""The paper's recipe: GPT-2 medium shape (305M with our vocabulary), 2M steps of 131,072 tokens.

AdamW lr 6e-4, betas 0.9/0.95, weight decay 0.01 on matrices, warmup 2,000 then cosine to 1e-5,
clip 1.0, bf16 compute, initialised from OpenAI GPT-2 medium through the converter. The start is
a required choice: `--config.model.init_from_gpt2=/path/to/gpt2-medium/model.safetensors` (the
paper) or `--config.model.init_from_gpt2=scratch` (random weights); the run refuses to guess.

Memory and fit are measured, not estimated: the compiled train step for each target, on a CPU
host (deviceless AOT compilation, ``launch.compile_check``):

    .venv-tpu/bin/python -m launch.compile_check --config configs/allie_medium.py --topology v5e-16
    .venv-gpu/bin/python -m launch.compile_check --config configs/allie_medium.py --topology h200-1
    flock /work/bench.lock .venv-tpu/bin/python bench/compile_table.py   # every named slice

The defaults are the table's choice (bench/RESULTS.md, "what fits where"; docs/guide.md): one
256-row micro-batch with ``remat=full`` fits every named slice whose chips hold the state and the
batch divides over, and is the fastest fitting variant on v5e-16. Without remat the step does
not fit a v5e-16 chip at any ``grad_accum`` here, nor one H200 at ``grad_accum=2`` (144 GiB of
141); a second micro-batch only adds an accumulator and a second gradient all-reduce.
"""

from ml_collections import config_dict

from configs.base import base_config


def get_config():
    config = base_config()
    config.model.name = "allie_medium"
    config.model.dtype = "bfloat16"
    config.model.init_from_gpt2 = config_dict.placeholder(str)  # required: a path or "scratch"
    # 24 layers as one scanned block: the step compiles like one layer (bench/RESULTS.md,
    # "scanned layers"); outputs and checkpoints are the unrolled model's.
    config.model.scan_layers = True
    # Keep only each block's input for the backward pass (see above: what fits where).
    config.model.remat = "full"
    config.train.steps = 2_000_000
    config.train.decay_steps = 2_000_000
    config.train.batch_size = 256  # x 512 tokens = 131,072 tokens per step
    config.train.grad_accum = 1  # one pass over the 256 rows (see above: measured, fits)
    config.train.learning_rate = 6e-4
    config.train.min_learning_rate = 1e-5
    config.train.warmup_steps = 2_000
    config.train.eval_every = 5_000
    config.train.eval_batches = 32
    config.train.checkpoint_every = 5_000
    config.train.log_every = 100
    config.mesh.data = -1
    config.mesh.fsdp = 1
    config.data.worker_count = 8  # grain processes per host (tokens/s: bench/train.py)
    return config
