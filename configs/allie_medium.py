"""The paper's recipe: GPT-2 medium shape (305M with our vocabulary), 2M steps of 131,072 tokens.

AdamW lr 6e-4, betas 0.9/0.95, weight decay 0.01 on matrices, warmup 2,000 then cosine to 1e-5,
clip 1.0, bf16 compute, initialised from OpenAI GPT-2 medium through the converter
(`--config.model.init_from_gpt2=/path/to/gpt2-medium/model.safetensors`).
"""

from configs.base import base_config


def get_config():
    config = base_config()
    config.model.name = "allie_medium"
    config.model.dtype = "bfloat16"
    config.model.init_from_gpt2 = ""
    config.train.steps = 2_000_000
    config.train.decay_steps = 2_000_000
    config.train.batch_size = 256  # x 512 tokens = 131,072 tokens per step
    config.train.learning_rate = 6e-4
    config.train.min_learning_rate = 1e-5
    config.train.warmup_steps = 2_000
    config.train.eval_every = 5_000
    config.train.eval_batches = 32
    config.train.checkpoint_every = 5_000
    config.train.log_every = 100
    config.mesh.data = -1
    config.mesh.fsdp = 1
    return config
