"""Sharded, resumable training (``train_and_evaluate``)."""

from allie_jax.train.loop import NonFiniteLossError, TrainResult, train_and_evaluate, write_summary

__all__ = ["NonFiniteLossError", "TrainResult", "train_and_evaluate", "write_summary"]
