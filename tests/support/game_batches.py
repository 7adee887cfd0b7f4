"""Training batches of real games, one game per row, for tests that drive the train step directly
(the multi-device workers of test_train_sharding and test_grad_accum import it in their child
processes)."""

from __future__ import annotations

import numpy as np

from allie_jax.game import encode_game

INT_FIELDS = ("inputs", "segment_ids", "positions", "policy_targets")
FLOAT_FIELDS = ("time_targets", "value_targets", "policy_mask", "time_mask", "value_mask")


def game_rows(games, seq_len: int, lengths=None) -> dict[str, np.ndarray]:
    """One row per game, cut at ``lengths[i]`` tokens (default ``seq_len``), padding after it."""
    rows = len(games)
    b = {k: np.zeros((rows, seq_len), np.int32) for k in INT_FIELDS}
    b.update({k: np.zeros((rows, seq_len), np.float32) for k in FLOAT_FIELDS})
    for i, game in enumerate(games):
        e = encode_game(game, max_len=seq_len if lengths is None else lengths[i])
        n = len(e.tokens)
        b["inputs"][i, :n] = e.tokens
        b["segment_ids"][i, :n] = 1
        b["positions"][i, :n] = np.arange(n)
        b["policy_targets"][i, :n] = np.maximum(e.policy_targets, 0)
        b["policy_mask"][i, :n] = e.policy_targets >= 0
        b["time_targets"][i, :n] = np.maximum(e.time_targets, 0)
        b["time_mask"][i, :n] = e.time_targets >= 0
        b["value_targets"][i, :n] = np.nan_to_num(e.value_targets)
        b["value_mask"][i, :n] = ~np.isnan(e.value_targets)
    return b
