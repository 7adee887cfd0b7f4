"""allie_jax.data.paths: epath helpers on local and (in-memory) gs:// paths."""

from __future__ import annotations

import os

import pytest
from etils import epath

from allie_jax.data import paths
from tests.support.memory_fs import memory_gcs


def test_glob_local_and_remote(tmp_path):
    for name in ("a.pgn", "b.pgn", "c.txt"):
        (tmp_path / name).write_text(name)
    assert paths.glob(str(tmp_path / "*.pgn")) == [str(tmp_path / "a.pgn"), str(tmp_path / "b.pgn")]
    with memory_gcs():
        for name in ("a.pgn", "b.pgn", "c.txt"):
            epath.Path(f"gs://bkt/d/{name}").write_text(name)
        assert paths.glob("gs://bkt/d/*.pgn") == ["gs://bkt/d/a.pgn", "gs://bkt/d/b.pgn"]
        assert paths.glob("gs://bkt/d/c.txt") == ["gs://bkt/d/c.txt"]
        assert paths.glob("gs://bkt/none/*.pgn") == []
        with pytest.raises(FileNotFoundError, match="gs://bkt/none"):
            paths.expand_inputs(["gs://bkt/none/*.pgn"])


def test_local_copy_is_cached_and_refreshed(tmp_path):
    with memory_gcs():
        src = epath.Path("gs://bkt/x.bin")
        src.write_bytes(b"one")
        a = paths.local_copy("gs://bkt/x.bin", cache=str(tmp_path))
        assert open(a, "rb").read() == b"one"
        assert paths.local_copy("gs://bkt/x.bin", cache=str(tmp_path)) == a
        src.write_bytes(b"three")  # changed: a new copy
        b = paths.local_copy("gs://bkt/x.bin", cache=str(tmp_path))
        assert open(b, "rb").read() == b"three"
    assert paths.local_copy(str(tmp_path / "local")) == str(tmp_path / "local")


@pytest.mark.parametrize("remote", [False, True])
def test_staged_output_all_or_nothing(tmp_path, remote):
    with memory_gcs():
        out = "gs://bkt/out" if remote else str(tmp_path / "deep" / "out")
        with pytest.raises(RuntimeError):
            with paths.staged_output(out, ["a", "b.json"]) as stage:
                os.makedirs(os.path.join(stage, "a"))
                raise RuntimeError("fail mid-way")
        assert not epath.Path(out).exists()
        assert not (tmp_path / "deep").exists() and os.listdir(tmp_path) == []
        with paths.staged_output(out, ["a", "b.json"]) as stage:
            os.makedirs(os.path.join(stage, "a"))
            open(os.path.join(stage, "a", "f"), "w").write("new")
            open(os.path.join(stage, "b.json"), "w").write("{}")
        assert (epath.Path(out) / "a" / "f").read_text() == "new"
        assert (epath.Path(out) / "b.json").read_text() == "{}"
        (epath.Path(out) / "keep.txt").write_text("not ours")
        with paths.staged_output(out, ["a", "b.json"]) as stage:  # replaces only its entries
            open(os.path.join(stage, "b.json"), "w").write("[]")
        assert not (epath.Path(out) / "a").exists()
        assert (epath.Path(out) / "b.json").read_text() == "[]"
        assert (epath.Path(out) / "keep.txt").read_text() == "not ours"
        names = sorted(p.name for p in epath.Path(out).iterdir())
        assert names == ["b.json", "keep.txt"]  # no staging folder left inside
