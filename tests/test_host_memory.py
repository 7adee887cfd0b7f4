"""allie_jax.host_memory: XLA's per-call temporaries stop costing page faults once it is on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")

# A jitted call whose temporaries (four 32 MB tree-like arrays) are allocated and freed per call,
# as a search's tree is; the minor page faults of its later calls are counted.
_PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from allie_jax.host_memory import keep_freed_host_memory
    applied = keep_freed_host_memory()
    import jax, jax.numpy as jnp

    shape = (32, 129, 1968)

    @jax.jit
    def step(x):
        # filled, written at data-dependent rows and read back: the buffers must exist
        rows = jnp.arange(32)
        total = jnp.float32(0)
        for fill in (-1, 0, 1, 2):
            t = jnp.full(shape, fill, jnp.float32).at[rows, x % 129].set(x.astype(jnp.float32)[:, None])
            total = total + t[rows, (x * 7) % 129].sum()
        return total

    x = jnp.arange(32, dtype=jnp.int32)
    jax.block_until_ready(step(x))
    faults = []
    for _ in range(30):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        jax.block_until_ready(step(x))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    late = keep_freed_host_memory()  # the backend runs now: too late, and already applied
    print(json.dumps({"applied": applied, "late": late, "faults": faults}))
    """
)


def _probe(**env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_memory_ends_the_page_faults_of_each_call():
    kept = _probe()
    system = _probe(ALLIE_JAX_HOST_MALLOC="system")
    assert kept["applied"] is True and kept["late"] is False
    assert system["applied"] is False
    # glibc's default hands the 130 MB back to the kernel after each call: ~32k faults per call
    assert min(system["faults"]) > 5_000, system
    # kept: the heap grows now and then (by one call's 130 MB, until its free blocks fit every
    # call's layout; a handful of times), and every other call reuses its pages as they are
    quiet = sum(f < 500 for f in kept["faults"])
    assert quiet >= 20 and sum(kept["faults"]) < sum(system["faults"]) / 2, kept


def test_too_late_once_the_backend_runs():
    code = (
        "import jax, jax.numpy as jnp; jnp.ones(2).block_until_ready();"
        "from allie_jax.host_memory import keep_freed_host_memory;"
        "print(keep_freed_host_memory())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
