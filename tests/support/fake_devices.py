"""Run a test script in a fresh process that sees eight CPU devices.

XLA fixes the host device count when the backend starts, so a test that needs a (2,2,2) or (8,1,1)
mesh runs its body in a child process with ``--xla_force_host_platform_device_count=8``. The
script prints one line ``RESULT<json>``; that JSON is what the test asserts on.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_on_eight_devices(script: str, *args: str, timeout: float = 600) -> dict:
    """The ``RESULT`` JSON the script printed; the child's stderr tail if it failed."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])
