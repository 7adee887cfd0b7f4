"""Where tests find Stockfish, and the one rule for when it is missing.

Debian's ``stockfish`` package puts the binary in /usr/games, which is not always on PATH. Under
``CI=true`` a missing Stockfish is a failure (CI installs it); elsewhere the test is skipped with
the reason.
"""

from __future__ import annotations

import os
import shutil

import pytest

STOCKFISH: str | None = shutil.which("stockfish") or (
    "/usr/games/stockfish" if os.path.exists("/usr/games/stockfish") else None
)


def require_stockfish() -> str:
    """The Stockfish binary's path, or fail (under CI) / skip (elsewhere) saying why."""
    if STOCKFISH is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Stockfish is required under CI=true (apt-get install stockfish)")
        pytest.skip("Stockfish not installed (looked on PATH and at /usr/games/stockfish)")
    return STOCKFISH
