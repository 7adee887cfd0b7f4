"""CPU-sized model for tests and `make demo`: trains in minutes on the bundled sample."""

from configs.base import base_config


def get_config():
    config = base_config()
    config.model.name = "tiny"
    config.model.dropout = 0.0
    config.train.steps = 300
    config.train.batch_size = 8
    config.train.learning_rate = 3e-3
    config.train.min_learning_rate = 3e-4
    config.train.warmup_steps = 20
    config.train.log_every = 10
    config.train.eval_every = 100
    config.train.eval_batches = 4
    config.train.checkpoint_every = 100
    return config
