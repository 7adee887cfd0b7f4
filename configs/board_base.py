"""What every board-state transformer config changes in ``base_config`` (``model.family``)."""

from __future__ import annotations

import ml_collections


def board_overrides(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """Select the board family, size ``name``, and its data / loss settings."""
    config.model.family = "board"  # the trainer dispatches model, loss and batches on this
    config.model.name = name  # a BoardConfig.named() size
    # Any BoardConfig field, e.g. refinement / mask_illegal / flip / piece_scheme.
    config.model.board = ml_collections.ConfigDict(
        {
            # None: the named size's value (separate placeholders: they are references)
            "num_layers": ml_collections.config_dict.placeholder(int),
            "embed_dim": ml_collections.config_dict.placeholder(int),
            "num_heads": ml_collections.config_dict.placeholder(int),
            "refinement": True,
            "mask_illegal": True,
            "flip": False,
            "piece_scheme": "13",
            "halfmove_degree": 1,
            "use_elo": True,
            "feedback_cycles": 0,
            "feedback_from": 0,
            "feedback_to": -1,
        }
    )
    config.data.seq_len = 87  # tokens per position (for the tokens/s and MFU log lines)
    config.data.augment = False
    config.data.curriculum = False  # seed 001's rating buckets, one epoch each, then the last
    config.data.shuffle_window = 2048  # positions mixed across games before batching
    config.train.loss_weights = (1.0, 1.0, 0.5, 1.0)  # policy, choice, rights, value
    return config
