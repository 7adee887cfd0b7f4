"""The board-state transformer (seed 001) at CPU size: trains in minutes on the bundled sample.

``--config.model.board.<field>=...`` sets any ``BoardConfig`` field (the seed's ablations:
``refinement``, ``mask_illegal``, ``flip``, ``piece_scheme``, ``halfmove_degree``, ``feedback_cycles``).
"""

from configs.base import base_config
from configs.board_base import board_overrides


def get_config():
    config = board_overrides(base_config(), "board_tiny")
    config.model.dropout = 0.0
    config.train.steps = 300
    config.train.batch_size = 64  # positions per optimizer step
    config.train.learning_rate = 1e-3
    config.train.min_learning_rate = 1e-4
    config.train.warmup_steps = 20
    config.train.log_every = 10
    config.train.eval_every = 100
    config.train.eval_batches = 8
    config.train.checkpoint_every = 100
    return config
