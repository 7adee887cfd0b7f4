"""What every board-state transformer config changes in ``base_config`` (``model.family``)."""

from __future__ import annotations

import ml_collections

from allie_jax.model import board_family


def board_overrides(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Select the board family, size ``name``, and its data / loss settings."""
    # The board family's settings replace the decoder's: ``config.model.board.<field>`` is any
    # BoardConfig field (unset = the named size's value); a decoder setting is then an error.
    config.model = board_family.model_section(
        name, dtype=config.model.dtype, dropout=config.model.dropout
    )
    config.data.seq_len = 87  # tokens per position (for the tokens/s and MFU log lines)
    config.data.augment = False
    config.data.curriculum = False  # seed 001's rating buckets, one epoch each, then the last
    config.data.shuffle_window = 2048  # positions mixed across games before batching
    config.train.loss_weights = (1.0, 1.0, 0.5, 1.0)  # policy, choice, rights, value
    return config
