"""``uci`` is answered before anything heavy is imported, for Allie and for Maia.

A GUI allows an engine a few seconds (fastchess: 10 s) between ``uci`` and ``uciok``; on a busy
machine importing numpy, python-chess and JAX alone can take longer. The launcher is run under
``python -X importtime``, whose trace (one stderr line per import, written as it happens) shares
one pipe with the protocol on stdout, so the modules listed before ``uciok`` are exactly those
imported before it was sent. No clock is read: the outcome is which modules were loaded.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _imports(trace: list[str]) -> list[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    names = []
    for line in trace:
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":  # the header line
                names.append(name)
    return names


def _run(args: list[str], commands: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=REPO,
        input=commands,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one pipe: the trace and the protocol in the order written
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def start_up() -> set[str]:
    """What the bare interpreter imports (site hooks included): not the engine's doing."""
    return set(_imports(_run(["-c", "pass"], "")))


@pytest.mark.parametrize("family", ["allie", "maia"])
def test_uciok_comes_before_numpy_chess_or_jax(tmp_path, start_up, family):
    """Before ``uciok``: only the standard library and the package's light modules. After it
    (``isready`` runs the loader, which fails on the empty directory): numpy and JAX, which
    shows the trace sees them and that the check above would catch them."""
    empty = tmp_path / "model"
    empty.mkdir()
    spec = str(empty) if family == "allie" else f"maia:{empty}:policy:1500"
    lines = _run(["-m", "launch.uci", "--checkpoint", spec], "uci\nisready\nquit\n")
    assert "uciok" in lines and "readyok" in lines
    cut = lines.index("uciok")
    assert any(line.startswith("option name ") for line in lines[:cut])
    before = [m for m in _imports(lines[:cut]) if m not in start_up]
    after = set(_imports(lines[cut:]))
    stdlib = set(sys.stdlib_module_names)
    ours = ("allie_jax", "launch")
    # a name no installed package provides is a failed probe (the standard library's copy
    # tries Jython's org.python.core), not a module that was loaded
    tops = {m.split(".")[0] for m in before}
    foreign = sorted(t for t in tops - stdlib - set(ours) if importlib.util.find_spec(t))
    assert not foreign, f"packages imported before uciok: {foreign}"
    for heavy in ("numpy", "jax"):
        assert heavy in after, f"{heavy} never imported: is the trace read right?"
    assert "allie_jax.engine.uci" in before  # the handler itself answered
