"""An in-memory ``gs://`` for tests: etils.epath's real gs:// code path, storage in this process.

etils.epath sends ``gs://`` paths to its fsspec backend when TensorFlow is absent; registering
fsspec's memory filesystem under the ``gs``/``gcs`` protocols makes those paths live in a dict.
A plain ``pathlib`` path would instead turn ``gs://b/run`` into a local ``gs:/b/run`` folder, so
a test on such a path fails for any code that bypasses epath (and the test also checks that no
local ``gs:`` folder appeared).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

PROTOCOLS = ("gs", "gcs")


class MemoryGCS(MemoryFileSystem):
    """fsspec's memory filesystem answering to gs:// (keys are "bucket/path", like gcsfs)."""

    protocol = PROTOCOLS
    root_marker = ""

    def __init__(self, *args, **kwargs):  # etils passes gcsfs options (finalize_on_close=...)
        super().__init__()

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        for p in PROTOCOLS:
            if path.startswith(p + "://"):
                path = path[len(p) + 3 :]
        return path.rstrip("/")


@contextlib.contextmanager
def memory_gcs() -> Iterator[MemoryFileSystem]:
    """Route gs:// through memory for the duration; the store is emptied afterwards."""
    from etils.epath import gpath

    if gpath._is_tf_installed():  # then epath would use tf.io.gfile, not fsspec
        import pytest

        pytest.skip("TensorFlow is installed: etils.epath sends gs:// to tf.io.gfile")
    previous = {p: fsspec.registry.get(p) for p in PROTOCOLS}
    for p in PROTOCOLS:
        fsspec.register_implementation(p, MemoryGCS, clobber=True)
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()
    fs = fsspec.filesystem("gs")
    try:
        yield fs
    finally:
        fs.store.clear()
        fs.pseudo_dirs.clear()
        for p, impl in previous.items():
            if impl is None:
                sys.modules["fsspec.registry"]._registry.pop(p, None)  # its writable dict
            else:
                fsspec.register_implementation(p, impl, clobber=True)
        backend.fsspec_backend._get_filesystem.cache_clear()
