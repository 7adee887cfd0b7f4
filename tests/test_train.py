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
    """The saved params onto this process's first device, whatever topology wrote them."""
    import jax

    path = workdir / "checkpoints" / str(step) / "params"
    checkpointer = ocp.StandardCheckpointer()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
        checkpointer.metadata(path).item_metadata,
    )
    restored = checkpointer.restore(path, target)
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
        "real_tokens_per_second",
        "real_tokens",
        "mfu",
        "step_time",
    } <= set(train_records[-1])
    # MFU counts game tokens only: the packed rows' padding slots are no model work.
    last = train_records[-1]
    assert 0 < last["real_tokens"] < 4 * 128  # batch 4 x 128 slots, some of them padding
    assert last["real_tokens_per_second"] < last["tokens_per_second"]
    assert last["mfu"] / last["real_tokens_per_second"] == pytest.approx(
        train_records[0]["mfu"] / train_records[0]["real_tokens_per_second"], rel=1e-6
    )
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


def _write_gpt2_safetensors(path, num_layers=2, d=64, positions=512, vocab=50257):
    """A GPT-2 state dict with the real HF key names (random values), tiny geometry."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    t = {
        "wte.weight": rng.normal(0.1, 0.3, (vocab, d)),
        "wpe.weight": rng.normal(0, 0.01, (positions, d)),
        "ln_f.weight": rng.normal(1, 0.1, (d,)),
        "ln_f.bias": rng.normal(0, 0.1, (d,)),
    }
    for i in range(num_layers):
        p = f"h.{i}."
        t.update(
            {
                p + "ln_1.weight": rng.normal(1, 0.1, (d,)),
                p + "ln_1.bias": rng.normal(0, 0.1, (d,)),
                p + "attn.c_attn.weight": rng.normal(0, 0.02, (d, 3 * d)),
                p + "attn.c_attn.bias": rng.normal(0, 0.02, (3 * d,)),
                p + "attn.c_proj.weight": rng.normal(0, 0.02, (d, d)),
                p + "attn.c_proj.bias": rng.normal(0, 0.02, (d,)),
                p + "ln_2.weight": rng.normal(1, 0.1, (d,)),
                p + "ln_2.bias": rng.normal(0, 0.1, (d,)),
                p + "mlp.c_fc.weight": rng.normal(0, 0.02, (d, 4 * d)),
                p + "mlp.c_fc.bias": rng.normal(0, 0.02, (4 * d,)),
                p + "mlp.c_proj.weight": rng.normal(0, 0.02, (4 * d, d)),
                p + "mlp.c_proj.bias": rng.normal(0, 0.02, (d,)),
            }
        )
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(path))
    return t


def test_init_from_gpt2_copies_blocks_and_reinitialises_embeddings(prepared_sample, tmp_path):
    from allie_jax.train import sharding as shd
    from allie_jax.train.loop import build_trainer, model_config_from

    source = _write_gpt2_safetensors(tmp_path / "model.safetensors")
    config = _config(prepared_sample, 2)
    config.model.init_from_gpt2 = str(tmp_path / "model.safetensors")
    trainer = build_trainer(config, model_config_from(config), shd.make_mesh((-1, 1, 1)))
    params = trainer.state.params
    np.testing.assert_allclose(np.asarray(params["wpe"][...]), source["wpe.weight"], atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(params["ln_f"]["scale"][...]), source["ln_f.weight"], atol=1e-6
    )
    wte = np.asarray(params["wte"][...])
    assert wte.shape == (1997, 64)
    # Re-initialised with the source's statistics, not copied.
    assert abs(wte.mean() - source["wte.weight"].mean()) < 0.02
    assert abs(wte.std() - source["wte.weight"].std()) < 0.02


def test_gradient_accumulation_matches_one_big_batch():
    """Two identical micro-batches accumulate to exactly the one-batch update."""
    import jax

    from allie_jax.data.synthetic import synthetic_batch
    from allie_jax.train import sharding as shd
    from allie_jax.train.loop import build_trainer, model_config_from

    half = synthetic_batch(2, 32, seed=3)
    doubled = {k: np.concatenate([v, v]) for k, v in half.items()}
    results = []
    for accum, batch in ((1, half), (2, doubled)):
        config = get_config()
        config.train.batch_size = len(batch["inputs"])
        config.train.grad_accum = accum
        trainer = build_trainer(config, model_config_from(config), shd.make_mesh((-1, 1, 1)))
        state = trainer.state
        for _ in range(2):
            state, metrics = trainer.train_step(
                state, jax.device_put(batch, trainer.batch_sharding)
            )
        results.append((jax.tree.leaves(state.params), float(metrics["loss"])))
    (a, loss_a), (b, loss_b) = results
    assert abs(loss_a - loss_b) < 1e-5
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_sigterm_saves_and_exits(prepared_sample, tmp_path):
    """A preempted job (SIGTERM) checkpoints the step it reached and exits "preempted, resumable"
    (75), after the checkpoint committed; the console is not flooded by library INFO lines."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    workdir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "launch.train", "--config", "configs/tiny.py",
        "--workdir", str(workdir), "--data_dir", str(prepared_sample),
        "--config.train.steps=100000", "--config.train.checkpoint_every=100000",
        "--config.train.eval_every=100000", "--config.train.log_every=1",
        "--config.train.batch_size=2", "--config.data.seq_len=64",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        metrics = workdir / "metrics.jsonl"
        while time.time() < deadline and not (
            metrics.exists() and metrics.read_text().count("\n") >= 3
        ):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    from allie_jax.train.preemption import EXIT_PREEMPTED

    assert proc.returncode == EXIT_PREEMPTED == 75, err[-3000:]
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and max(steps) >= 3
    assert f"preempted (resumable) at step {max(steps)}" in out
    assert "random initial weights (scratch)" in out  # says how it started
    # Orbax's per-save INFO lines went to the log file, not the console.
    assert "Saving checkpoint" not in err + out and "orbax" not in (err + out).lower()
    assert "checkpoint" in (workdir / "logs" / "train.log").read_text().lower()


def test_paper_config_requires_an_explicit_start(prepared_sample):
    """allie_medium refuses to guess between GPT-2 weights and random ones; the flag sets it."""
    from absl import flags
    from ml_collections import config_flags

    from allie_jax.model.decoder_family import gpt2_init_path
    from allie_jax.train.loop import validate_config

    def parse(*overrides):
        argv = ["train", "--config=configs/allie_medium.py", *overrides]
        values = flags.FlagValues()
        config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
        values(argv)
        config = values.config
        config.data.data_dir = str(prepared_sample)
        return config

    config = parse()
    with pytest.raises(ValueError, match="init_from_gpt2=scratch"):
        validate_config(config)
    scratch = parse("--config.model.init_from_gpt2=scratch")
    validate_config(scratch)  # also: 256 rows in 2 micro-batches divide over this host's devices
    assert gpt2_init_path(scratch) is None
    path = parse("--config.model.init_from_gpt2=/nowhere/model.safetensors")
    with pytest.raises(FileNotFoundError, match="init_from_gpt2"):
        validate_config(path)


def test_validation_time_is_not_charged_to_the_training_window():
    from allie_jax.train.metrics import TrainingClock, model_flops_utilization

    now = [100.0]
    clock = TrainingClock(lambda: now[0])
    now[0] += 2.0  # two seconds of steps
    with clock.excluded():
        now[0] += 30.0  # a validation
    now[0] += 1.0
    assert clock.elapsed() == 3.0
    clock.restart()
    assert clock.elapsed() == 0.0
    assert model_flops_utilization(6e9, 1e3, 1e14) == pytest.approx(0.06)
