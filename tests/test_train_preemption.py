"""Preemption on several hosts: two processes through ``jax.distributed`` (gloo CPU collectives).

SIGTERM reaches one process only. Both must stop at the same step (JAX's preemption sync point),
save it (one checkpoint with both processes' data-iterator states), and exit 75 ("preempted,
resumable") within 60 s; relaunching resumes to parameters equal bit for bit to a straight run.
The runs use the multi-slice mesh path (``--config.mesh.dcn_data=2``: each process one DCN
granule). Then one process tries to resume the two-process checkpoint: it stops at start saying
how to continue, and continues with ``--config.train.restore_data_iterator=False``.
The timings go to stdout (``pytest -s``) for bench/RESULTS.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO
from tests.test_train import _params_at


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _command(workdir, data_dir, steps: int) -> list[str]:
    return [
        sys.executable, "-m", "launch.train", "--config", "configs/tiny.py",
        "--workdir", str(workdir), "--data_dir", str(data_dir),
        f"--config.train.steps={steps}", "--config.train.decay_steps=1000",
        "--config.train.checkpoint_every=100000", "--config.train.eval_every=100000",
        "--config.train.log_every=1", "--config.train.batch_size=2",
        "--config.data.seq_len=64", "--config.model.dropout=0.1",
    ]  # fmt: skip


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return env


def _launch(workdir, data_dir, steps: int, log_dir) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for pid in range(2):
        cmd = _command(workdir, data_dir, steps) + [
            "--config.mesh.data=1", "--config.mesh.dcn_data=2",
            "--config.distributed.initialize=True", "--config.distributed.cpu_collectives=gloo",
            f"--config.distributed.coordinator_address=localhost:{port}",
            "--config.distributed.num_processes=2", f"--config.distributed.process_id={pid}",
        ]  # fmt: skip
        out = open(log_dir / f"{workdir.name}.{pid}.log", "w")  # noqa: SIM115
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=out, stderr=out))
    return procs


def _wait(procs, timeout: float) -> list[int]:
    deadline = time.time() + timeout
    for p in procs:
        p.wait(timeout=max(deadline - time.time(), 1))
    return [p.returncode for p in procs]


def _log(log_dir, workdir) -> str:
    return "\n".join((log_dir / f"{workdir.name}.{i}.log").read_text()[-3000:] for i in range(2))


@pytest.mark.slow  # three launches of two processes: ~2-5 minutes on 2 loaded cores
def test_two_processes_stop_at_one_step_and_resume_exactly(prepared_sample, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    preempted, straight = tmp_path / "preempted", tmp_path / "straight"
    procs = _launch(preempted, prepared_sample, 100_000, logs)
    try:
        metrics = preempted / "metrics.jsonl"
        deadline = time.time() + 400
        while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            assert time.time() < deadline, _log(logs, preempted)
            assert all(p.poll() is None for p in procs), _log(logs, preempted)
            time.sleep(0.5)
        sent = time.time()
        procs[1].send_signal(signal.SIGTERM)  # one host only
        codes = _wait(procs, 60)
        took = time.time() - sent
    finally:
        for p in procs:
            p.kill()
    assert codes == [75, 75], (codes, _log(logs, preempted))
    steps = sorted(int(p.name) for p in (preempted / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) == 1, steps
    saved = steps[0]
    data = preempted / "checkpoints" / str(saved) / "data"
    states = sorted(p.name for p in data.iterdir() if p.name.startswith("process_"))
    assert states == ["process_0-of-2.json", "process_1-of-2.json"]
    log0 = (logs / "preempted.0.log").read_text()
    assert f"preempted (resumable) at step {saved}" in log0
    print(
        f"\nPREEMPTION: TERM to process 1 -> both saved step {saved} and exited 75 in {took:.1f} s"
    )

    target = saved + 3
    started = time.time()
    runs = _launch(preempted, prepared_sample, target, logs) + _launch(
        straight, prepared_sample, target, logs
    )
    try:
        codes = _wait(runs, 400)
    finally:
        for p in runs:
            p.kill()
    assert codes == [0, 0, 0, 0], (codes, _log(logs, preempted), _log(logs, straight))
    print(f"PREEMPTION: resume + straight run (4 processes) took {time.time() - started:.1f} s")
    a, b = _params_at(straight, target), _params_at(preempted, target)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)

    # One process cannot take over the two processes' data positions: it says so at start...
    one = subprocess.run(
        _command(preempted, prepared_sample, target + 1),
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert one.returncode == 1
    assert "written by 2 processes and this job has 1" in one.stderr
    assert "restore_data_iterator=False" in one.stderr
    # ...and with the data stream restarted it continues from the saved model and optimizer.
    one = subprocess.run(
        _command(preempted, prepared_sample, target + 1)
        + ["--config.train.restore_data_iterator=False"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    assert f"resumed model and optimizer from step {target}" in one.stdout
    assert f"trained to step {target + 1}" in one.stdout
