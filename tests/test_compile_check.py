"""``launch.compile_check``: deviceless compiles for TPU (and GPU) targets on this CPU host.

The TPU compiler is libtpu (the ``tpu`` extra), installed by ``make test`` in ``.venv-tpu``, an
environment layered on ``.venv``; ``.venv`` itself stays without it, and a test shows that the CPU
suite's JAX there is what it was (CPU backend, nothing from libtpu on stderr). Where libtpu
cannot be installed the compile tests fail under ``CI=true`` and skip elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from allie_jax.compile_check import analysis, hlo
from allie_jax.compile_check.chips import CHIPS
from allie_jax.compile_check.targets import TARGETS, CompileCheckError, parse_target

REPO = pathlib.Path(__file__).resolve().parents[1]
TPU_PYTHON = REPO / ".venv-tpu" / "bin" / "python"
GPU_PYTHON = REPO / ".venv-gpu" / "bin" / "python"
KEYS = {
    "topology",
    "devices",
    "fits",
    "hbm_bytes",
    "bytes_per_device",
    "flops_per_step",
    "predicted_step_seconds",
    "predicted_mfu",
    "collectives",
    "compile_seconds",
}

compile_group = pytest.mark.xdist_group("compile_check")  # one worker: compiles are CPU-heavy


def _tpu_python() -> pathlib.Path:
    """``.venv-tpu``'s interpreter when it has libtpu; fail under CI=true, skip elsewhere."""
    has_libtpu = TPU_PYTHON.exists() and (
        subprocess.run(
            [str(TPU_PYTHON), "-c", "import importlib.util as u; assert u.find_spec('libtpu')"],
            capture_output=True,
        ).returncode
        == 0
    )
    if not has_libtpu:
        message = "libtpu (the tpu extra) is missing: make .venv-tpu/installed"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required under CI=true)")
        pytest.skip(message)
    return TPU_PYTHON


def _compile_check(python: pathlib.Path, *args: str, timeout: float = 900):
    return subprocess.run(
        [str(python), "-m", "launch.compile_check", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------------- the CPU suite's JAX
def test_cpu_suite_venv_has_no_libtpu():
    """libtpu lives in .venv-tpu only: JAX in the suite's own environment starts as before."""
    assert importlib.util.find_spec("libtpu") is None, (
        "libtpu is importable in the CPU suite's environment; it belongs in .venv-tpu"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend(), jax.device_count())"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "cpu"
    assert "tpu" not in proc.stderr.lower(), proc.stderr


# ------------------------------------------------------------------- names, chips, HLO parsing
def test_targets_by_name():
    for name in ("v4-8", "v5e-16", "v5e-256", "v5p-8", "v5p-128", "h100-8", "h200-8"):
        assert name in TARGETS
    two = parse_target("2xv5e-16")
    assert (two.num_slices, two.topology, two.chip.name) == (2, "v5e:4x4", "v5e")
    with pytest.raises(CompileCheckError, match="--topology 'v9-8'.*v5e-16"):
        parse_target("v9-8")


def test_chip_peaks_agree_with_the_mfu_table():
    from allie_jax.train.metrics import device_peak_flops

    class Device:
        def __init__(self, kind):
            self.device_kind = kind

    for chip in CHIPS.values():
        peak, known = device_peak_flops(Device(chip.device_kind))
        if known:
            assert peak == chip.peak_flops, chip


def _scan_program(length: int) -> str:
    def f(w, xs):
        def body(c, x):
            return c + jnp.tanh(x @ w).sum(), None

        return jax.lax.scan(body, 0.0, xs)[0]

    w, xs = jnp.ones((64, 64)), jnp.ones((length, 32, 64))
    return jax.jit(f).lower(w, xs).compile().as_text()


def test_hlo_loops_count_their_trips():
    text = _scan_program(7)
    summary = hlo.summarize(text)
    assert (summary.loops_known, summary.loops_unknown) == (1, 0)
    assert summary.flops_scale == pytest.approx(7.0)
    assert summary.matmul_flops == pytest.approx(7 * 2 * 32 * 64 * 64)
    # Without XLA's known_trip_count (XLA:TPU writes none) the condition's bound is read.
    bare = text.replace(',"known_trip_count":{"n":"7"}', "")
    assert hlo.summarize(bare).flops_scale == pytest.approx(7.0)

    def g(w, x, n):
        step = lambda c: (c[0] + 1, jnp.tanh(c[1] @ w))  # noqa: E731
        return jax.lax.while_loop(lambda c: c[0] < n, step, (0, x))[1]

    dynamic = jax.jit(g).lower(jnp.ones((64, 64)), jnp.ones((32, 64)), 3).compile().as_text()
    summary = hlo.summarize(dynamic)
    assert (summary.loops_known, summary.loops_unknown, summary.flops_scale) == (0, 1, 1.0)


def test_hlo_bytes_count_the_slice_a_loop_reads_not_the_stack():
    """A scan over stacked weights reads one layer per iteration: its bytes per step must be the
    unrolled loop's, not the whole ``[layers, ...]`` stack once per layer (what counting every
    operand whole gave: 5.8x the unrolled forward's bytes at 16 layers)."""
    layers = 16

    def scanned(ws, x):
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)[0].sum()

    def unrolled(ws, x):
        for i in range(layers):
            x = jnp.tanh(x @ ws[i])
        return x.sum()

    ws, x = jnp.ones((layers, 256, 256)), jnp.ones((8, 256))
    moved = {}
    for f in (scanned, unrolled):
        for name, g in (("forward", f), ("grad", jax.grad(f))):
            text = jax.jit(g).lower(ws, x).compile().as_text()
            moved[f.__name__, name] = hlo.summarize(text).bytes_moved
    weights = ws.size * 4
    assert moved["scanned", "forward"] == pytest.approx(moved["unrolled", "forward"], rel=0.1)
    assert moved["unrolled", "forward"] < 4 * weights
    assert moved["scanned", "grad"] < 2 * moved["unrolled", "grad"]


def test_hlo_collectives_by_kind():
    text = """HloModule m
ENTRY %main (p: f32[8,128]) -> f32[64,128] {
  %p = f32[8,128]{1,0} parameter(0)
  %ar-start = f32[8,128]{1,0} all-reduce-start(%p), replica_groups={{0,1}}, to_apply=%add
  %ar = f32[8,128]{1,0} all-reduce-done(%ar-start)
  %ag-start = (f32[8,128]{1,0}, f32[64,128]{1,0}) all-gather-start(%ar), dimensions={0}
  %ag = f32[64,128]{1,0} all-gather-done(%ag-start)
  %rs = bf16[1,128]{1,0} reduce-scatter(%p), dimensions={0}, to_apply=%add
  ROOT %cp = f32[64,128]{1,0} collective-permute(%ag), source_target_pairs={{0,1}}
}
"""
    summary = hlo.summarize(text)
    assert summary.collectives == {
        "all-reduce": 1,
        "all-gather": 1,
        "reduce-scatter": 1,
        "collective-permute": 1,
        "all-to-all": 0,
    }
    assert summary.collective_bytes["all-gather"] == 64 * 128 * 4
    assert summary.collective_bytes["reduce-scatter"] == 128 * 2


def test_hbm_refusal_is_read_from_the_compiler_message():
    message = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (18.97G) exceeds available HBM (15.75G)."
    )
    used, capacity, temporaries = analysis.hbm_refusal(message)
    assert (used, capacity, temporaries) == (int(18.97 * 2**30), int(15.75 * 2**30), True)
    assert analysis.hbm_refusal("INTERNAL: something else") is None


def test_bad_topology_is_one_line_without_libtpu():
    proc = _compile_check(
        pathlib.Path(sys.executable), "--config", "configs/tiny.py", "--topology", "v9-8"
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("launch.compile_check: error: --topology")


# --------------------------------------------------------------------- compiles for a TPU slice
@compile_group
def test_tiny_on_v4_8(tmp_path):
    """The real train and eval steps of configs/tiny.py, compiled for a v4-8 (4 chips)."""
    python = _tpu_python()
    out = tmp_path / "report.json"
    proc = _compile_check(
        python,
        "--config",
        "configs/tiny.py",
        "--topology",
        "v4-8",
        "--programs",
        "train,eval",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert KEYS <= set(report), KEYS - set(report)
    assert set(report["bytes_per_device"]) == {"argument", "output", "temp", "total"}
    assert set(report["collectives"]) == set(hlo.COLLECTIVES)
    assert report["topology"] == "v4-8" and report["devices"] == 4
    assert report["fits"] is True
    assert report["hbm_bytes"] == CHIPS["v4"].hbm_bytes
    assert 0 < report["bytes_per_device"]["total"] < report["hbm_bytes"]
    assert report["flops_per_step"] > 0 and report["predicted_step_seconds"] > 0
    assert 0 < report["predicted_mfu"] <= 1
    # data parallel over 4 devices: the gradients are all-reduced
    assert report["collectives"]["all-reduce"] >= 1
    assert report["compile_seconds"] > 0
    assert report["model"]["attention"] == "splash"  # auto, resolved for the TPU target
    assert set(report["programs"]) == {"train", "eval"}
    assert "fits" in proc.stdout and "all-reduce" in proc.stdout


@compile_group
def test_state_that_does_not_fit_exits_1(tmp_path):
    python = _tpu_python()
    out = tmp_path / "report.json"
    proc = _compile_check(
        python,
        "--config",
        "configs/tiny.py",
        "--topology",
        "v5e-4",
        "--programs",
        "train",
        "--config.train.batch_size=8192",
        "--json",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["fits"] is False
    assert (
        report["bytes_per_device"]["total"]
        > report["programs"]["train"]["bytes_per_device"]["compiler_hbm_limit"]
    )
    assert "DOES NOT FIT" in proc.stdout and "exceeds available HBM" in proc.stdout


@compile_group
def test_batch_that_does_not_divide_over_the_slice():
    python = _tpu_python()
    proc = _compile_check(
        python,
        "--config",
        "configs/tiny.py",
        "--topology",
        "v5e-16",
        "--config.train.batch_size=8",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("launch.compile_check: error: ") and "data x fsdp" in last


@pytest.mark.slow
@compile_group
def test_two_slices_and_the_search(tmp_path):
    """2 x v5e-4 over DCN (the slices go on dcn_data) with the search of 8 roots on one chip."""
    python = _tpu_python()
    out = tmp_path / "report.json"
    proc = _compile_check(
        python,
        "--config",
        "configs/tiny.py",
        "--topology",
        "2xv5e-4",
        "--search_batch",
        "8",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert (report["devices"], report["slices"], report["hosts"]) == (8, 2, 2)
    assert report["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
    search = report["programs"]["search"]
    assert search["fits"] and search["flops_per_step"] > 0
    assert search["loops"]["run_time_bound"] >= 1  # the simulation loop: counted once


@pytest.mark.slow
def test_tiny_on_h100_8(tmp_path):
    """The gpu extra's CUDA plugin compiles for eight H100s without a GPU (cuDNN attention in
    bf16, through compat.cudnn_compute_capability); skipped without .venv-gpu."""
    if not GPU_PYTHON.exists():
        pytest.skip("the gpu extra is not installed: make .venv-gpu/installed")
    out = tmp_path / "report.json"
    proc = _compile_check(
        GPU_PYTHON,
        "--config",
        "configs/tiny.py",
        "--topology",
        "h100-8",
        "--programs",
        "train,eval",
        "--config.model.dtype=bfloat16",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["fits"] and report["model"]["attention"] == "cudnn"
    assert report["flops_per_step"] > 0 and report["collectives"]["all-reduce"] >= 1
