"""The paper's recipe: GPT-2 medium shape (305M with our vocabulary), 2M steps of 131,072 tokens.

AdamW lr 6e-4, betas 0.9/0.95, weight decay 0.01 on matrices, warmup 2,000 then cosine to 1e-5,
clip 1.0, bf16 compute, initialised from OpenAI GPT-2 medium through the converter. The start is
a required choice: `--config.model.init_from_gpt2=/path/to/gpt2-medium/model.safetensors` (the
paper) or `--config.model.init_from_gpt2=scratch` (random weights); the run refuses to guess.

Memory on one H200 (141 GB), 256 x 512 tokens per step, bf16 compute, float32 parameters:
- parameters, gradients, Adam's two moments, the accumulated gradient: 5 x 4 B x 305M = 6.1 GB;
- activations kept for the backward pass, per token and layer, about 34 x d bytes with a flash
  kernel (Korthikanti et al. 2022, no T x T scores kept): 34 x 1024 x 24 layers = 0.84 MB/token;
  with XLA attention add 5 x heads x T bytes (the scores): +0.98 MB/token;
- float32 logits and their gradient: 2 x 4 B x 1997 = 16 KB/token.
Whole batch at once: 131,072 tokens x 0.86 MB = 113 GB of activations: too close to the limit.
Two micro-batches of 128 rows (65,536 tokens): ~56 GB activations + 6 GB state + ~1 GB logits
= ~63 GB with cuDNN flash (the GPU default in bf16), ~127 GB with XLA attention. So grad_accum=2
and no remat; on a smaller card (80 GB) with XLA attention use grad_accum=4 or remat=dots_saveable.
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
    config.train.steps = 2_000_000
    config.train.decay_steps = 2_000_000
    config.train.batch_size = 256  # x 512 tokens = 131,072 tokens per step
    config.train.grad_accum = 2  # two micro-batches of 128 rows: fits one H200 (see above)
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
