"""``bench/gpu_check.sh`` end to end, as its CPU dry run, importing only what the README's
accelerator install (``pip install -e '.[gpu]'``: the core dependencies) provides.

A GPU is lent rarely, so the script must not fail there for a reason a CPU can show: a bench that
imports a test-only package (pytest, torch, transformers, hypothesis), a renamed flag, a kernel
check that no longer runs. A ``sitecustomize`` refuses those imports in the child processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

TEST_ONLY = ("pytest", "torch", "transformers", "hypothesis", "lczero", "playwright", "nbclient")

BLOCKER = f"""
import builtins
_import = builtins.__import__
def _refuse(name, *args, **kwargs):
    if name.split(".")[0] in {TEST_ONLY!r}:
        raise ImportError(f"{{name}} is not installed by the README's accelerator install")
    return _import(name, *args, **kwargs)
builtins.__import__ = _refuse
"""


@pytest.mark.slow
def test_gpu_check_dry_run_needs_only_the_core_install(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ)
    env.update(
        PY=sys.executable,
        PYTHONPATH=str(tmp_path),
        JAX_PLATFORMS="cpu",
        SIZE="tiny",
        BATCH="8",
        ACCUM="2",
        STEPS="1",
        ROUNDS="1",
        WORKERS="0",
        SEARCH_SIZE="tiny",
        SEARCH_BATCH="4",
        DTYPE="float32",
        LEAF_BATCHES="1 4",
    )
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "not installed by the README" not in out, out[-3000:]
    assert "attention kernel xla" in out
    assert "MFU" in out and "tok/s" in out, out[-3000:]
    assert "failed or timed out" not in out, out[-3000:]
    # the search rows: batch 1 with one and four leaves per step, and the batch of SEARCH_BATCH
    for b, k in ((1, 1), (1, 4), (4, 1)):
        assert re.search(rf"tiny\s+search\s+30\s+{b}\s+{k}\s+\d", out), (b, k, out[-3000:])
