"""Pods by default: ``jax.distributed`` starts where the environment names a multi-process job, and
several processes without JAX's preemption sync refuse to start (``train/distributed.py``).

The two-process test starts two hosts the way ``srun`` would (SLURM variables only, no
``--config.distributed.*`` flag): they join each other by themselves, and each builds its training
iterator from a ``gs://`` split on the local Cloud Storage emulator, fetching only its own files.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import jax
import ml_collections
import pytest

from allie_jax.train import distributed
from configs.tiny import get_config
from tests.conftest import REPO
from tests.test_train_preemption import _free_port

SRUN_STEP = {  # an srun step of 4 tasks, as SLURM sets it
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_NODELIST": "node[001-004]",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
}


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "JAX"),
        (SRUN_STEP, "SLURM"),
        ({**SRUN_STEP, "SLURM_NTASKS": "1"}, None),  # a single-task step: nothing to join
        ({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}, None),  # the batch script, not an srun step
        ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "3"}, "Open MPI"),
        ({"OMPI_COMM_WORLD_SIZE": "1"}, None),
        ({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3", "TPU_WORKER_ID": "1"}, "Cloud TPU"),
        ({"TPU_PROCESS_ADDRESSES": "10.0.0.2:8471,10.0.0.3:8471"}, "Cloud TPU"),
        ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),  # a single-host slice
        ({"MEGASCALE_COORDINATOR_ADDRESS": "t-0"}, "Cloud TPU multislice"),
        ({"MEGASCALE_NUM_SLICES": "2"}, "Cloud TPU multislice"),
        ({"MEGASCALE_NUM_SLICES": "1", "SLURM_NTASKS": "x"}, None),
        ({}, None),
    ],
)
def test_detect_cluster(env, kind):
    found = distributed.detect_cluster(env)
    assert (found.kind if found else None) == kind


def _dist(**fields) -> ml_collections.ConfigDict:
    dist = get_config().distributed
    for key, value in fields.items():
        dist[key] = value
    return dist


def test_decide_explicit_flag_wins_and_auto_follows_the_environment():
    assert distributed.decide(_dist(), {}) == (False, "auto: no cluster in the environment")
    assert distributed.decide(_dist(), SRUN_STEP) == (True, "auto: SLURM (SLURM_NTASKS=4)")
    assert distributed.decide(_dist(initialize=False), SRUN_STEP)[0] is False
    assert distributed.decide(_dist(initialize="False"), SRUN_STEP)[0] is False  # from the CLI
    assert distributed.decide(_dist(initialize=True), {})[0] is True
    assert distributed.decide(_dist(num_processes=2), {})[0] is True
    assert distributed.decide(_dist(coordinator_address="h:1"), {})[0] is True
    with pytest.raises(ValueError, match=r"--config.distributed.initialize='maybe': use auto"):
        distributed.decide(_dist(initialize="maybe"), {})


def test_start_passes_the_flags_and_names_them_when_jax_cannot_join(monkeypatch):
    calls = []

    def fake_initialize(**kwargs):
        calls.append(kwargs)
        if "num_processes" not in kwargs:
            raise ValueError("Number of processes must be defined.")

    monkeypatch.setattr(jax.distributed, "initialize", fake_initialize)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    config = get_config()
    config.distributed.coordinator_address = "h:1"
    config.distributed.num_processes = 1
    config.distributed.process_id = 0
    distributed.start(config, env={})
    assert calls == [{"coordinator_address": "h:1", "num_processes": 1, "process_id": 0}]

    with pytest.raises(ValueError) as err:
        distributed.start(get_config(), env={"JAX_COORDINATOR_ADDRESS": "h:1"})
    message = str(err.value)
    assert "\n" not in message and "JAX_COORDINATOR_ADDRESS=h:1" in message
    assert "Number of processes must be defined" in message
    assert "--config.distributed.coordinator_address, num_processes and process_id" in message

    calls.clear()
    distributed.start(get_config(), env={})  # auto, nothing in the environment: no call
    assert calls == []


def test_several_processes_without_preemption_sync_refuse_to_start(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    config = get_config()
    config.distributed.initialize = False  # e.g. a Cloud TPU pod whose hosts joined via libtpu
    with pytest.raises(RuntimeError) as err:
        distributed.start(config, env={})
    message = str(err.value)
    assert "\n" not in message and "2 processes but no preemption sync" in message
    assert "--config.distributed.initialize=True" in message

    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    distributed.require_preemption_sync(2)  # initialized, service on: fine
    with _preemption_service_off():
        with pytest.raises(RuntimeError, match="jax_enable_preemption_service is off"):
            distributed.require_preemption_sync(2)
        distributed.require_preemption_sync(1)  # one process has nothing to agree on


@contextlib.contextmanager
def _preemption_service_off():
    saved = jax.config.jax_enable_preemption_service
    jax.config.update("jax_enable_preemption_service", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_preemption_service", saved)


def test_preemption_watch_uses_the_flag_without_the_service(monkeypatch):
    from allie_jax.train.preemption import PreemptionWatch

    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    with _preemption_service_off(), PreemptionWatch() as watch:
        assert not watch.synced  # a SIGTERM handler of its own, not a sync that never comes


WORKER = textwrap.dedent(
    r"""
    import json, sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from allie_jax.train import distributed, loop
    from configs.tiny import get_config

    config = get_config()
    config.data.data_dir = sys.argv[1]
    config.data.seq_len = 64
    config.distributed.cpu_collectives = "gloo"  # no --config.distributed.initialize: auto
    distributed.start(config)
    ids = multihost_utils.process_allgather(np.int32(jax.process_index()))
    make = lambda: loop._data_iterator(config, "train", local_batch=2, augment=True)
    it = make()
    for _ in range(3):
        next(it)
    state = it.get_state()
    want = [next(it) for _ in range(2)]
    again = make()
    again.set_state(state)
    got = [next(again) for _ in want]
    same = all(np.array_equal(g[k], w[k]) for g, w in zip(got, want) for k in w)
    print("RESULT" + json.dumps({
        "index": jax.process_index(), "count": jax.process_count(), "gathered": ids.tolist(),
        "synced": distributed.preemption_sync_available(), "resumes": same,
    }))
    """
)


def test_two_hosts_join_by_themselves_and_read_only_their_gs_files(tmp_path, sample_pgn):
    """~12 s on 2 cores: two JAX processes joining over gloo, five shard files on gs://."""
    from tests.test_gcs_paths import _require_gcs_extra

    _require_gcs_extra()
    from etils import epath

    from allie_jax.data import shards
    from allie_jax.data.prepare import PrepareConfig, prepare
    from tests.support.gcs_emulator import client_env, emulated_gcs

    local = tmp_path / "data"
    config = PrepareConfig(events="all", val_frac=0.05, test_frac=0.05, records_per_shard=200)
    prepare([str(sample_pgn)], local, config)
    files = [os.path.basename(f) for f in shards.find_shards(local, "train")]
    assert len(files) == 5  # host 0 owns 3 files, host 1 owns 2
    port = _free_port()
    with emulated_gcs() as gcs:
        for name in files:
            epath.Path(f"gs://bucket/data/train/{name}").write_bytes(
                (local / "train" / name).read_bytes()
            )
        procs = []
        for i in range(2):
            env = dict(os.environ, **gcs.env(), **client_env(f"host-{i}"), JAX_PLATFORMS="cpu")
            env.pop("XLA_FLAGS", None)
            env.update(
                SLURM_JOB_ID="77",
                SLURM_STEP_NODELIST="localhost",
                SLURM_NTASKS="2",
                SLURM_PROCID=str(i),
                SLURM_LOCALID="0",
                JAX_COORDINATOR_PORT=str(port),
                ALLIE_JAX_CACHE=str(tmp_path / f"cache-{i}"),  # each host its own disk
                PYTHONPATH=str(REPO),
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, "gs://bucket/data"],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        try:
            outs = [p.communicate(timeout=300) for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert gcs.unsupported == []
        reads = [r for r in gcs.reads if r.name.startswith("data/train/")]
        sizes = {name: len(gcs.read("bucket", f"data/train/{name}")) for name in files}

    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [
        json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[6:])
        for out, _ in outs
    ]
    for i, result in enumerate(results):
        assert result == {
            "index": i,
            "count": 2,
            "gathered": [0, 1],
            "synced": True,
            "resumes": True,
        }
    readers: dict[str, set[str]] = {}
    read_bytes: dict[str, int] = {}
    per_host: dict[str, int] = {}
    for r in reads:
        name = r.name.rsplit("/", 1)[1]
        readers.setdefault(name, set()).add(r.client)
        read_bytes[name] = read_bytes.get(name, 0) + r.nbytes
        per_host[r.client] = per_host.get(r.client, 0) + r.nbytes
    assert readers == {name: {f"host-{i % 2}"} for i, name in enumerate(files)}
    assert read_bytes == sizes  # each object read once, whole, by one host
    print(f"\nHOST SHARDS: {len(files)} train objects, {sum(sizes.values())} bytes; read per host:")
    print("HOST SHARDS: " + json.dumps(dict(sorted(per_host.items()))))
