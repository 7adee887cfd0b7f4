"""Cutting an encoded game into pieces that fit a training row, and the row fields of a piece.

A game longer than the row continues in later rows behind a repeated header (SPEC §3). Piece 0
holds game positions [0, seq_len); each later piece is ``header + game positions [s, e)`` with
e - s = seq_len - header_len. Position t carries the targets of game position t (predicting
token t+1), so every label of the game appears in exactly one piece, in order; the repeated
header carries no labels (it only restores the conditioning on Elo and time control). Positions
restart at 0 in every piece, and packed pieces never attend to each other (segment ids).
"""

from __future__ import annotations

import numpy as np

from allie_jax import vocab
from allie_jax.game import NO_TIME, EncodedGame

FIELDS = (
    "inputs",
    "policy_targets",
    "time_targets",
    "value_targets",
    "policy_mask",
    "time_mask",
    "value_mask",
)
# What a padded position holds (grain's packer pads with these).
PADDING = {
    "inputs": vocab.PAD,
    "policy_targets": 0,
    "time_targets": 0.0,
    "value_targets": 0.0,
    "policy_mask": 0.0,
    "time_mask": 0.0,
    "value_mask": 0.0,
}


def _fields(tokens, policy, times, values, labelled: np.ndarray) -> dict[str, np.ndarray]:
    policy_mask = (policy >= 0) & labelled
    time_mask = (times != NO_TIME) & (times >= 0) & labelled
    value_mask = ~np.isnan(values) & labelled
    return {
        "inputs": tokens.astype(np.int32),
        "policy_targets": np.where(policy_mask, policy, 0).astype(np.int32),
        "time_targets": np.where(time_mask, times, 0.0).astype(np.float32),
        "value_targets": np.where(value_mask, values, 0.0).astype(np.float32),
        "policy_mask": policy_mask.astype(np.float32),
        "time_mask": time_mask.astype(np.float32),
        "value_mask": value_mask.astype(np.float32),
    }


def game_pieces(enc: EncodedGame, seq_len: int) -> list[dict[str, np.ndarray]]:
    """The pieces of one encoded game, each at most ``seq_len`` long."""
    h = enc.header_len
    if seq_len <= h:
        raise ValueError(f"seq_len {seq_len} leaves no room after a {h}-token header")
    n = len(enc.tokens)
    pieces = []
    start, end = 0, min(n, seq_len)
    while True:
        if start == 0:
            sl = slice(0, end)
            pieces.append(
                _fields(
                    enc.tokens[sl],
                    enc.policy_targets[sl],
                    enc.time_targets[sl],
                    enc.value_targets[sl],
                    np.ones(end, dtype=bool),
                )
            )
        else:
            sl = slice(start, end)

            def cat(header_fill, body, dtype):
                return np.concatenate([np.full(h, header_fill, dtype=dtype), body.astype(dtype)])

            labelled = np.concatenate([np.zeros(h, bool), np.ones(end - start, bool)])
            pieces.append(
                _fields(
                    np.concatenate([enc.tokens[:h], enc.tokens[sl]]),
                    cat(-1, enc.policy_targets[sl], np.int32),
                    cat(NO_TIME, enc.time_targets[sl], np.float32),
                    cat(np.nan, enc.value_targets[sl], np.float32),
                    labelled,
                )
            )
        if end >= n:
            return pieces
        start, end = end, min(n, end + seq_len - h)
