"""The training loop on real prepared games: resume is exact, a non-finite loss stops cleanly."""

from __future__ import annotations

import json

import numpy as np
import orbax.checkpoint as ocp
import pytest

from allie_jax.train import NonFiniteLossError, train_and_evaluate
from configs.tiny import get_config


def _config(data_dir, steps: int):
    config = get_config()
    config.data.data_dir = str(data_dir)
    config.data.seq_len = 128
    config.model.dropout = 0.1  # the dropout RNG must be restored too
    config.train.steps = steps
    config.train.batch_size = 4
    config.train.log_every = 5
    config.train.eval_every = 10
    config.train.eval_batches = 2
    config.train.checkpoint_every = 5
    config.train.async_checkpoints = False
    return config


def _params_at(workdir, step: int) -> list[np.ndarray]:
    restored = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "params")
    flat = []

    def walk(tree):
        for key in sorted(tree, key=str):
            value = tree[key]
            if isinstance(value, dict):
                walk(value)
            else:
                flat.append(np.asarray(value))

    walk(restored)
    return flat


def test_resume_gives_identical_parameters(prepared_sample, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_and_evaluate(_config(prepared_sample, 20), straight)
    first = train_and_evaluate(_config(prepared_sample, 10), resumed)
    assert first.final_step == 10
    second = train_and_evaluate(_config(prepared_sample, 20), resumed)
    assert second.final_step == 20
    a, b = _params_at(straight, 20), _params_at(resumed, 20)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    # Metrics were logged as JSONL and TensorBoard events.
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["split"] == "train"]
    assert {
        "loss",
        "policy_loss",
        "time_loss",
        "value_loss",
        "learning_rate",
        "grad_norm",
        "tokens_per_second",
        "mfu",
        "step_time",
    } <= set(train_records[-1])
    assert any(r["split"] == "val" and "policy_accuracy" in r for r in records)
    assert list((straight / "tensorboard").iterdir())
    assert (straight / "best").is_dir() and (straight / "config.json").is_file()


def test_non_finite_loss_stops_without_saving(prepared_sample, tmp_path):
    config = _config(prepared_sample, 10)
    config.train.loss_weights = (float("nan"), 1.0, 1.0)
    with pytest.raises(NonFiniteLossError, match="at step 1"):
        train_and_evaluate(config, tmp_path / "nan")
    assert not any((tmp_path / "nan" / "checkpoints").glob("[0-9]*"))


def test_missing_gpt2_file_fails_before_training(prepared_sample, tmp_path):
    config = _config(prepared_sample, 10)
    config.model.init_from_gpt2 = str(tmp_path / "missing" / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="init_from_gpt2"):
        train_and_evaluate(config, tmp_path / "run")
