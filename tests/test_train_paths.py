"""User paths in training go through etils.epath: a ``gs://`` workdir is never turned into a
local ``./gs:/...`` directory. An in-memory fsspec filesystem stands in for Cloud Storage.

Orbax on a ``gs://`` path writes arrays through TensorStore's own GCS driver (the Cloud Storage
JSON API, not fsspec), so checkpoints on ``gs://`` are tested against a local emulator of that API
in tests/test_gcs_paths.py.
"""

from __future__ import annotations

import json

import pytest
from etils import epath
from fsspec.implementations.memory import MemoryFileSystem

from allie_jax.train import paths
from allie_jax.train.logs import library_logs_to_file
from allie_jax.train.metrics import MetricsWriter


@pytest.fixture
def fake_gcs(monkeypatch, tmp_path):
    import importlib

    registry = importlib.import_module("fsspec.registry")  # the module, not fsspec.registry's proxy
    for name in ("gs", "gcs"):
        monkeypatch.setitem(registry._registry, name, MemoryFileSystem)
    monkeypatch.chdir(tmp_path)  # a pathlib mistake would create ./gs:/... here
    root = epath.Path("gs://bucket/run")
    yield root
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]
    assert not (tmp_path / "gs:").exists()


def test_metrics_and_logs_on_a_remote_workdir(fake_gcs):
    assert paths.is_remote(fake_gcs) and paths.absolute(fake_gcs) == fake_gcs
    writer = MetricsWriter(fake_gcs, tensorboard=False)
    writer.write(1, {"loss": 2.0})
    writer.close()
    again = MetricsWriter(fake_gcs, tensorboard=False)  # a resumed run appends
    again.write(2, {"loss": 1.5})
    again.close()
    lines = (fake_gcs / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    with library_logs_to_file(fake_gcs) as log_file:
        assert "://" not in str(log_file) and log_file.parent.is_dir()
