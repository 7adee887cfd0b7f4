"""GPT-2 small shape (124M): the size for ablations on one accelerator."""

from configs.base import base_config


def get_config():
    config = base_config()
    config.model.name = "allie_124m"
    config.model.dtype = "bfloat16"
    config.train.steps = 200_000
    config.train.batch_size = 256  # 131,072 tokens per step
    config.train.warmup_steps = 2_000
    config.train.decay_steps = 200_000
    config.train.eval_every = 2_000
    config.train.checkpoint_every = 2_000
    config.train.log_every = 50
    return config
