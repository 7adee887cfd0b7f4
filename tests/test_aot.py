"""The executable store (``allie_jax.aot``): a second store on the same directory (a new process,
as far as the store knows) loads what the first compiled instead of tracing, answers exactly as
``jax.jit``, and falls back to compiling on any damaged or mismatched entry."""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax import aot
from allie_jax.model.kv_cache import KVCache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES: list[str] = []


@functools.partial(aot.jit, static_argnames=("scale",), donate_argnames=("cache",))
def _step(x, cache: KVCache, mask=None, *, scale: int):
    TRACES.append("step")  # runs only while tracing
    y = jnp.tanh(x) * scale
    if mask is not None:
        y = jnp.where(mask, y, 0.0)
    return {"y": y, "cache": KVCache(cache.k + y.sum(), cache.v, cache.length + 1)}


def _inputs(n: int = 4):
    x = jnp.asarray(np.linspace(-2, 2, n, dtype=np.float32))
    cache = KVCache(jnp.zeros(3), jnp.ones(3), jnp.int32(2))
    return x, cache


def _reference(n: int = 4, scale: int = 3):
    x, cache = _inputs(n)
    return jax.device_get(_step.jitted(x, cache, scale=scale))


def _fresh(path):
    """A new store object on ``path``: what a new process sees (nothing in memory)."""
    aot.disable_store()
    return aot.enable_store(path)


def test_second_store_loads_instead_of_tracing(tmp_path):
    try:
        first = _fresh(tmp_path / "exe")
        x, cache = _inputs()
        out = jax.device_get(_step(x, cache, scale=3))
        assert first.stats["compiled"] == 1 and first.stats["loaded"] == 0
        TRACES.clear()
        second = _fresh(tmp_path / "exe")
        for _ in range(3):  # loaded once, then served from memory
            x, cache = _inputs()
            again = jax.device_get(_step(x, cache, scale=3))
        assert TRACES == [] and second.stats == {"loaded": 1}
        ref = _reference()
        for got in (out, again):
            np.testing.assert_array_equal(got["y"], ref["y"])
            np.testing.assert_array_equal(got["cache"].k, ref["cache"].k)
            assert int(got["cache"].length) == 3
        # another static value or input shape is another program, compiled and stored
        x, cache = _inputs(8)
        _step(x, cache, scale=3)
        _step(*_inputs(), scale=5)
        _step(*_inputs(), jnp.asarray([True, False, True, True]), scale=5)
        assert second.stats["compiled"] == 3
        second.flush()
        assert len(list(second.directory.glob("*.exe"))) == 4
    finally:
        aot.disable_store()


def test_damaged_or_mismatched_entries_are_replaced(tmp_path):
    try:
        first = _fresh(tmp_path / "exe")
        _step(*_inputs(), scale=3)
        first.flush()
        (entry,) = first.directory.glob("*.exe")
        entry.write_bytes(entry.read_bytes()[:100])  # truncated
        second = _fresh(tmp_path / "exe")
        got = jax.device_get(_step(*_inputs(), scale=3))
        np.testing.assert_array_equal(got["y"], _reference()["y"])
        assert second.stats["bad_entries"] == 1 and second.stats["compiled"] == 1
        second.flush()
        # an entry whose key text differs (e.g. a hash collision) is not trusted either
        record = pickle.loads(entry.read_bytes())
        record["key"] = record["key"].replace("scale=3", "scale=4")
        entry.write_bytes(pickle.dumps(record))
        third = _fresh(tmp_path / "exe")
        _step(*_inputs(), scale=3)
        assert third.stats["bad_entries"] == 1 and third.stats["compiled"] == 1
        third.flush()
        assert not list(third.directory.glob("*.tmp"))
    finally:
        aot.disable_store()


def test_environment_change_uses_a_new_directory_and_prunes_old_ones(tmp_path, monkeypatch):
    try:
        dirs = []
        for i in range(aot.KEEP_ENVIRONMENTS + 2):
            monkeypatch.setattr(aot, "environment_fingerprint", lambda i=i: f"environment {i}")
            store = _fresh(tmp_path / "exe")
            _step(*_inputs(), scale=3)
            assert store.stats["compiled"] == 1  # nothing from another environment is used
            dirs.append(store.directory)
            store.flush()  # an entry written later would touch the directory's mtime
            # distinct mtimes even on coarse filesystems
            os.utime(store.directory, (1000.0 + i, 1000.0 + i))
        left = sorted(p for p in (tmp_path / "exe").iterdir())
        assert len(left) <= aot.KEEP_ENVIRONMENTS + 1 and dirs[-1] in left and dirs[0] not in left
    finally:
        aot.disable_store()


def test_without_a_store_it_is_jax_jit():
    aot.disable_store()
    TRACES.clear()
    got = jax.device_get(_step(*_inputs(), scale=3))
    np.testing.assert_array_equal(got["y"], _reference()["y"])
    assert _step.lower(*_inputs(), scale=3).compile() is not None


def test_environment_fingerprint_names_what_shapes_a_program():
    text = aot.environment_fingerprint()
    for part in ("source=", "jax=", "jaxlib=", "backend=", "host=", "jax_enable_x64="):
        assert part in text
    assert aot.source_fingerprint() in text


@pytest.mark.slow  # two engine launches, the first compiling from scratch (~75 s on 2 cores)
def test_engine_restart_loads_every_program_and_a_move_compiles_nothing(tmp_path):
    """Two launches of the real engine on one cache directory: the second loads every engine
    program from the store (none traced), and in both a searched move after the warm-up traces
    and compiles nothing at all (``Allie.warmup`` covers every shape the move meets)."""
    from flax import nnx

    from allie_jax.model import AllieModel, ModelConfig
    from allie_jax.model.checkpoint import save_model

    ckpt = tmp_path / "tiny"
    save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), ckpt)
    script = (
        "import sys\n"
        "from allie_jax.engine.compile_cache import enable_compilation_cache\n"
        "enable_compilation_cache(sys.argv[2])\n"
        "from allie_jax import aot\n"
        "aot.preload = aot.preload if sys.argv[3:] == ['preload'] else (lambda source: 0)\n"
        "from allie_jax.engine.api import Allie\n"
        "from allie_jax.game import Game\n"
        "a = Allie.load(sys.argv[1])\n"
        "a.warmup('search', 1, mean_sims=4, max_sims=4)\n"
        "if a.long_warmup is not None:  # a warm start loads long games' shapes after it\n"
        "    a.long_warmup.join()\n"
        "import jax\n"
        "events = []\n"
        "jax.monitoring.register_event_duration_secs_listener(\n"
        "    lambda e, s, **k: events.append(e) if e.startswith('/jax/core/compile') else None)\n"
        "for moves in (['e2e4'], ['e2e4', 'e7e5', 'g1f3']):\n"
        "    d = a.play([Game(moves, 1500, 1500, '180+2', game_id='g')], 'search', 0,\n"
        "               mean_sims=4, max_sims=4, should_stop=lambda: False)[0]\n"
        "print('EVENTS', len(events))\n"
        "print('STATS', dict(aot.active_store().stats), d.sims)\n"
    )
    stats = []
    for launch in ("compile", "load", "preload"):
        out = subprocess.run(
            [sys.executable, "-c", script, str(ckpt), str(tmp_path / "cache"), launch],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
            cwd=REPO,
        ).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("STATS"))
        stats.append(eval(line.split(" ", 1)[1].rsplit(" ", 1)[0]))
        # the warm-up compiles or loads each program without running it (aot.compile_only)
        assert stats[-1].pop("not_run", 0) > 5
        assert int(line.rsplit(" ", 1)[1]) == 4
        assert "EVENTS 0" in out, out
    assert stats[0].get("compiled", 0) > 5 and stats[0].get("loaded", 0) == 0
    assert stats[1] == {"loaded": stats[0]["compiled"]}
    # the third launch read the first's executables ahead (its record, under the checkpoint's
    # path) while the engine imported, and used every one of them
    n = stats[0]["compiled"]
    assert stats[2] == {"preload_started": n, "preloaded": n}


def test_read_ahead_entries_are_checked_like_any_other(tmp_path):
    """``preload`` reads what a launch with the same tag used; a damaged entry among them is
    removed and compiled again, and an unknown tag reads nothing."""
    try:
        first = _fresh(tmp_path / "exe")
        _step(*_inputs(), scale=3)
        _step(*_inputs(8), scale=3)
        first.flush()
        first.save_manifest("engine-a")
        second = _fresh(tmp_path / "exe")
        assert second.preload("engine-b") == 0
        assert second.preload("engine-a") == 2
        out = jax.device_get(_step(*_inputs(), scale=3))
        np.testing.assert_array_equal(out["y"], _reference()["y"])
        assert second.stats["preloaded"] == 1 and second.stats["compiled"] == 0
        for exe in second.directory.glob("*.exe"):
            exe.write_bytes(b"not an executable")
        third = _fresh(tmp_path / "exe")
        assert third.preload("engine-a") == 2
        out = jax.device_get(_step(*_inputs(8), scale=3))
        np.testing.assert_array_equal(out["y"], _reference(8)["y"])
        assert third.stats["bad_entries"] == 1 and third.stats["compiled"] == 1
    finally:
        aot.disable_store()


_PROGRAM = """
import sys
from allie_jax.engine.compile_cache import enable_compilation_cache
enable_compilation_cache(sys.argv[1], executables=sys.argv[2] == "store")
import jax, jax.numpy as jnp
from allie_jax import aot

@aot.jit
def f(x, y):
    return jnp.where(x > 0, -x, y).sum(0) + jnp.sort(y, axis=0)[0]

x, y = jnp.ones((8, 5)), jnp.arange(40.0).reshape(8, 5)
print("OUT", [float(v) for v in f(x, y)], dict(aot.active_store().stats) if aot.active_store() else {})
"""


def test_an_executable_from_jaxs_cache_is_not_stored_broken(tmp_path):
    """Regression: an executable that JAX's persistent cache deserialized, serialized again,
    failed at run time in the next process ("Function region_1.3 not found"). The store
    compiles its entries afresh, so the third process below runs the stored one."""
    cache = str(tmp_path / "cache")
    expected = None
    for mode, stats in (("jax-only", {}), ("store", {"compiled": 1}), ("store", {"loaded": 1})):
        out = subprocess.run(
            [sys.executable, "-c", _PROGRAM, cache, mode],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,  # this checkout's allie_jax
        )
        assert out.returncode == 0, out.stderr[-2000:]
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("OUT"))
        values, got = line[4:].split("] ", 1)
        assert eval(got) == stats, out.stderr[-3000:]
        expected = expected or values
        assert values == expected
