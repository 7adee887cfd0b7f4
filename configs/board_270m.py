"""The board-state transformer at DeepMind's largest searchless size (about 270M parameters).

21 blocks of width 1,024 with the seed's 8 heads and MLP ×4 (268.7M parameters with the Elo
tokens). For accelerators; ``--config.data.curriculum=True`` runs the seed's rating curriculum.
"""

from configs.base import base_config
from configs.board_base import board_overrides


def get_config():
    config = board_overrides(base_config(), "board_270m")
    config.model.dtype = "bfloat16"
    config.data.curriculum = True
    config.train.steps = 200_000
    config.train.batch_size = 1024  # positions per optimizer step
    config.train.learning_rate = 3e-4
    config.train.warmup_steps = 2_000
    config.train.decay_steps = 200_000
    config.train.eval_every = 2_000
    config.train.checkpoint_every = 2_000
    config.train.log_every = 50
    return config
