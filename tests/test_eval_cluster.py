"""Evaluation jobs on a cluster: the shard comes from the scheduler's variables (or is an error),
shards lock, a merge error names the differing keys, and the two launch files in docs/cluster/
run as 4 tasks (one killed mid-run and relaunched) whose merged report equals a single-process
run, for deterministic systems (policy, greedy) and a sampling one (gumbel)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from allie_jax.eval import records, stream

REPO = pathlib.Path(__file__).resolve().parents[1]
VOLATILE_META = (
    "timings_s", "elapsed_s", "policy_positions_per_s", "records", "shards", "games_file",
    "checkpoint", "plots",
)  # fmt: skip


def test_shard_from_the_scheduler():
    slurm = {
        "SLURM_ARRAY_TASK_ID": "7",
        "SLURM_ARRAY_TASK_COUNT": "10",
        "SLURM_ARRAY_TASK_MIN": "5",
    }
    assert stream.resolve_shard(None, None, slurm) == (10, 2)
    assert stream.resolve_shard(10, None, slurm) == (10, 2)
    with pytest.raises(ValueError, match="must agree"):
        stream.resolve_shard(4, None, slurm)
    assert stream.resolve_shard(4, None, {"JOB_COMPLETION_INDEX": "3"}) == (4, 3)
    with pytest.raises(ValueError, match="--num_shards"):
        stream.resolve_shard(None, None, {"JOB_COMPLETION_INDEX": "3"})
    with pytest.raises(ValueError, match="must lie in"):
        stream.resolve_shard(2, None, {"JOB_COMPLETION_INDEX": "3"})
    # no scheduler, one jax process: --num_shards 4 alone would run shard 0 everywhere
    with pytest.raises(ValueError, match="without --shard_index"):
        stream.resolve_shard(4, None, {})
    assert stream.resolve_shard(4, 1, {"JOB_COMPLETION_INDEX": "3"}) == (4, 1)  # flags win
    assert stream.resolve_shard(None, None, {}) == (1, 0)


def test_a_shard_is_locked_and_a_dead_holder_is_taken_over(tmp_path):
    a = records.ShardStore(tmp_path, 0, 2, {"x": 1})
    a.open()
    b = records.ShardStore(tmp_path, 0, 2, {"x": 1})
    with pytest.raises(records.RecordsError, match="is being written by"):
        b.open()
    a.close()
    b.open()  # released: free
    b.close()
    # a lock left by a process that is gone (kill -9) is stale
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    lock = tmp_path / "shard-00000-of-00002.lock"
    lock.write_text(json.dumps({"host": os.uname().nodename, "pid": int(dead), "time": 0}))
    c = records.ShardStore(tmp_path, 0, 2, {"x": 1})
    c.open()
    c.close()


def test_gcs_locks_are_created_only_if_absent():
    """On gs:// a lock is a create-if-absent upload (ifGenerationMatch=0): the emulator answers a
    second create with 412, so of tasks racing for one lock exactly one holds it; a stale lock is
    taken over by deleting only the generation judged stale, so two tasks taking over the same
    stale lock cannot both succeed; a holder whose lock was taken over learns it on touch."""
    import threading
    import urllib.error
    import urllib.request

    from tests.support.gcs_emulator import emulated_gcs

    with emulated_gcs() as gcs:
        # the emulator itself honours the precondition (independently of any client)
        url = f"{gcs.url}/upload/storage/v1/b/bucket/o?uploadType=media&name=p&ifGenerationMatch=0"
        for expect in (200, 412):
            req = urllib.request.Request(url, data=b"x", method="POST")
            try:
                status = urllib.request.urlopen(req).status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == expect

        path = "gs://bucket/job/records/shard-00000-of-00004.lock"
        for _ in range(3):  # tasks started together: one holder each round
            barrier = threading.Barrier(6)
            won: list[records.Lock] = []

            def take(barrier: threading.Barrier, won: list) -> None:
                lock = records.Lock(path, "shard 0")
                _ = lock.file  # the client is built before the race starts
                barrier.wait()
                if lock.acquire():
                    won.append(lock)

            threads = [threading.Thread(target=take, args=(barrier, won)) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(won) == 1
            assert isinstance(won[0].file, records._GcsObject)
            won[0].release()
            assert "job/records/shard-00000-of-00004.lock" not in gcs.objects()

        # a lock left on another host, untouched for long: stale, taken over exactly once
        old = records.Lock(path, "shard 0")
        assert old.acquire()
        stale = json.dumps({"host": "gone-host", "pid": 1, "time": 0})
        gen = old.file.overwrite(stale, old._token)
        assert gen is not None
        first, second = records.Lock(path, "shard 0"), records.Lock(path, "shard 0")
        text, seen = second.file.read()
        assert text == stale and seen == gen
        assert first.acquire()  # deletes generation `gen`, creates its own
        assert not second.file.delete(seen)  # the generation it judged stale is gone
        assert not second.acquire()  # and the new one is live
        old.touch()  # the old holder's refresh is refused: it no longer holds the lock
        assert not old.held
        assert json.loads(gcs.read("bucket", path.removeprefix("gs://bucket/")))["pid"] == (
            os.getpid()
        )
        first.release()
        assert 412 in gcs.statuses and not gcs.unsupported


def test_merge_error_names_the_differing_keys(tmp_path):
    for k, games in ((0, "sha256:aa"), (1, "sha256:bb")):
        s = records.ShardStore(tmp_path, k, 2, {"games_file": games, "config": {"seed": 0}})
        s.open()
        s.commit_extra("calibration", "c.json", b"{}")
        s.manifest["chunks"] = [{"file": "c.json"}]
        s.finish({})
    with pytest.raises(records.RecordsError, match="games_file differ"):
        records.open_job(tmp_path)


def _strip(report: dict) -> dict:
    for k in VOLATILE_META:
        report["meta"].pop(k, None)
    report["meta"]["config"].pop("num_shards")
    return report


def _wait_for_chunk(manifest: pathlib.Path, timeout: float = 900) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if manifest.exists():
            m = json.loads(manifest.read_text())
            if m["chunks"]:
                assert not m["complete"], "the shard finished before it could be killed"
                return
        time.sleep(0.2)
    raise AssertionError(f"no chunk committed in {manifest.parent}")


FLAGS = [
    "--systems=policy,greedy,gumbel", "--max_games=16", "--chunk_games=1",
    "--search_positions=12", "--search_batch_size=4", "--random_games=2", "--noplots",
]  # fmt: skip


@pytest.mark.slow
def test_slurm_array_and_indexed_job_with_a_killed_task(checkpoint_dir, plain_pgn, tmp_path):
    env0 = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
    cache = f"--compile_cache={tmp_path / 'cache'}"
    single = tmp_path / "single"
    cmd = [sys.executable, "-m", "launch.evaluate", f"--checkpoint={checkpoint_dir}",
           f"--games={plain_pgn}", f"--output={single}", cache, *FLAGS]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=REPO, env=env0, capture_output=True, timeout=1500)
    want = _strip(json.loads((single / "report.json").read_text()))

    # SLURM: 4 array tasks, each staging the games at its own path; task 2 killed and rerun
    out = tmp_path / "slurm"
    script = REPO / "docs" / "cluster" / "slurm_evaluate.sh"

    def slurm(k: int) -> subprocess.Popen:
        env = {**env0, "SLURM_ARRAY_JOB_ID": "42", "SLURM_ARRAY_TASK_ID": str(k),
               "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
               "STAGE": "1", "SCRATCH_DIR": str(tmp_path / f"node{k}"),
               "CHECKPOINT": str(checkpoint_dir),
               "GAMES": str(plain_pgn), "OUT": str(out)}  # fmt: skip
        return subprocess.Popen(["bash", str(script), cache, *FLAGS], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip

    procs = {k: slurm(k) for k in range(4)}
    _wait_for_chunk(out / "records" / "shard-00002-of-00004" / "manifest.json")
    os.killpg(procs[2].pid, signal.SIGKILL)
    procs[2].wait()
    for k in (0, 1, 3):
        assert procs[k].wait(timeout=1500) == 0
    assert slurm(2).wait(timeout=1500) == 0  # the relaunch resumes, then builds the report
    got = _strip(json.loads((out / "report.json").read_text()))
    assert got == want

    # Kubernetes Indexed Job: per-task folders, pod 1 killed and restarted, then --report_only
    spec = yaml.safe_load((REPO / "docs" / "cluster" / "k8s_evaluate.yaml").read_text())
    job = spec["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == 4
    container = job["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in container["env"]}
    kube = tmp_path / "kube"
    pod_env.update(CHECKPOINT=str(checkpoint_dir), GAMES=str(plain_pgn), OUT=str(kube),
                   EXTRA_FLAGS=" ".join([cache, *FLAGS]))  # fmt: skip
    assert int(pod_env["NUM_SHARDS"]) == job["completions"]

    def pod(k: int) -> subprocess.Popen:
        staged = tmp_path / f"pod{k}" / "games.pgn"  # another path per pod, the same bytes
        staged.parent.mkdir(exist_ok=True)
        shutil.copy(plain_pgn, staged)
        env = {**env0, **pod_env, "GAMES": str(staged), "JOB_COMPLETION_INDEX": str(k)}
        return subprocess.Popen(container["command"], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip

    pods = {k: pod(k) for k in range(4)}
    _wait_for_chunk(kube / "task-1" / "records" / "shard-00001-of-00004" / "manifest.json")
    os.killpg(pods[1].pid, signal.SIGKILL)
    pods[1].wait()
    for k in (0, 2, 3):
        assert pods[k].wait(timeout=1500) == 0
    assert pod(1).wait(timeout=1500) == 0
    merged = tmp_path / "merged"
    cmd = [sys.executable, "-m", "launch.evaluate", f"--report_only={kube}",
           f"--output={merged}", "--noplots"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=REPO, env=env0, capture_output=True, timeout=900)
    got = _strip(json.loads((merged / "report.json").read_text()))
    assert got == want


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    from flax import nnx

    from allie_jax.model import AllieModel, ModelConfig
    from allie_jax.model.checkpoint import save_model

    return save_model(
        AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)),
        tmp_path_factory.mktemp("ckpt") / "model",
    )


@pytest.fixture(scope="module")
def plain_pgn(sample_pgn, tmp_path_factory):
    """The sample games as a plain .pgn file."""
    from allie_jax.pgn import open_text

    path = tmp_path_factory.mktemp("games") / "games.pgn"
    with open_text(sample_pgn) as f:
        path.write_text(f.read())
    return path
