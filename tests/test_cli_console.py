"""What each ``launch`` command prints on the console, on success and on each user error.

Library logs (Orbax, absl, JAX) belong in the run's log file: no INFO line reaches the console,
nor JAX's "Unable to initialize backend 'tpu'" on this CPU host. A user error is exactly one line
on stderr and a non-zero exit: no traceback, no flag help. The counts are printed (run with -s)
and recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
INFO = re.compile(r"^I\d{4} |\bINFO\b")
COUNTS: dict[str, int] = {}

pytestmark = pytest.mark.xdist_group("cli_console")


def run(name: str, args: list[str], tmp_path: pathlib.Path, ok: bool = True) -> list[str]:
    """Run ``python -m launch.<args>``; its console lines (stdout + stderr, progress bars as one
    line each), or on an expected error its one stderr line; asserts the exit status and that no
    library INFO line reached the console."""
    env = {**os.environ, "ALLIE_JAX_HOME": str(tmp_path / "home"), "JAX_PLATFORMS": ""}
    env.pop("JAX_PLATFORMS")
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    # a progress bar redrawn with carriage returns is one console line
    out = [line for line in proc.stdout.split("\n") if line.strip()]
    err = [line for line in proc.stderr.split("\n") if line.strip()]
    lines = out + err
    COUNTS[name] = len(lines)
    print(f"{name}: exit {proc.returncode}, {len(lines)} console lines")
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    assert not [line for line in lines if INFO.search(line)], lines
    assert not any("Unable to initialize backend" in line for line in lines), lines
    assert not any("Traceback" in line for line in lines), proc.stderr[-3000:]
    if not ok:
        assert len(err) == 1 and ": error: " in err[0], err
        assert err[0].split(": error: ")[0] in (args[0], args[0].removeprefix("launch.")), err
        assert "--helpfull" not in proc.stderr and "flags:" not in proc.stderr
        return err  # the error line
    return lines


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> pathlib.Path:
    from flax import nnx

    from allie_jax.model.checkpoint import save_model
    from allie_jax.model.config import ModelConfig
    from allie_jax.model.transformer import AllieModel

    path = tmp_path_factory.mktemp("console") / "tiny"
    return save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), path)


def test_evaluate_console(tiny_checkpoint, sample_pgn, tmp_path):
    out = tmp_path / "eval"
    args = ["launch.evaluate", "--checkpoint", str(tiny_checkpoint), "--games", str(sample_pgn)]
    args += ["--output", str(out), "--max_games", "3", "--systems", "policy", "--noplots"]
    lines = run("launch.evaluate", [*args, "--random_games", "2"], tmp_path)
    assert any(line.startswith("wrote ") for line in lines) and len(lines) <= 5, lines
    log = (out / "logs" / "evaluate.log").read_text()
    assert "Restoring checkpoint" in log or "orbax" in log.lower()  # the INFO lines went here
    missing = [*args[:1], "--checkpoint", str(tmp_path / "nope"), *args[3:]]
    line = run("launch.evaluate (missing checkpoint)", missing, tmp_path, ok=False)[0]
    assert "nope" in line


def test_train_console(prepared_sample, sample_pgn, tmp_path):
    work = tmp_path / "run"
    base = ["launch.train", "--config", "configs/tiny.py", "--workdir", str(work)]
    small = ["--config.train.steps=1", "--config.train.batch_size=2"]
    lines = run("launch.train", [*base, "--data_dir", str(prepared_sample), *small], tmp_path)
    assert any("trained to step 1" in line for line in lines) and len(lines) <= 16, lines

    nope = ["launch.train", "--config", "configs/nope.py", "--workdir", str(work)]
    line = run("launch.train (missing config)", nope, tmp_path, ok=False)[0]
    assert "configs/nope.py" in line
    line = run(
        "launch.train (missing data dir)",
        [*base, "--data_dir", str(tmp_path / "no_data"), *small],
        tmp_path,
        ok=False,
    )[0]
    assert "no_data" in line and "launch.prepare_data" in line
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(sample_pgn, raw)
    line = run("launch.train (raw PGN data dir)", [*base, "--data_dir", str(raw), *small],
               tmp_path, ok=False)[0]  # fmt: skip
    assert "PGN" in line and "launch.prepare_data" in line
    misspelt = [*base, "--config.train.steps=1", "--config.model.mlp_ratio=4"]
    line = run("launch.train (misspelt setting)", misspelt, tmp_path, ok=False)[0]
    assert "--config.model.mlp_ratio: not a setting" in line, line

    # a damaged checkpoint: the data files of the saved step cut to 7 bytes (a truncated copy)
    step = next((work / "checkpoints").iterdir())
    damaged = [f for f in step.rglob("*") if f.is_file() and f.parent.name == "d"]
    assert damaged
    for f in damaged:
        f.write_bytes(b"\0" * 7)
    more = [*base, "--data_dir", str(prepared_sample), "--config.train.steps=2"]
    line = run("launch.train (corrupt checkpoint)", [*more, small[1]], tmp_path, ok=False)[0]
    assert "corrupt" in line and "unsafe" not in line, line


def test_convert_console(tmp_path):
    from tests.test_fetch_weights import released_best_pt

    best, _ = released_best_pt(tmp_path / "best.pt")
    args = ["launch.convert", "--format", "allie", "--output", str(tmp_path / "m")]
    lines = run("launch.convert", [*args, "--input", str(best)], tmp_path)
    assert len(lines) == 1 and lines[0].startswith("wrote "), lines
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(4096))
    line = run("launch.convert (random bytes)", [*args, "--input", str(junk)], tmp_path,
               ok=False)[0]  # fmt: skip
    assert "corrupt" in line and "unsafe" not in line and "junk.pt" in line
    cut = tmp_path / "cut.pt"
    cut.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    line = run("launch.convert (truncated)", [*args, "--input", str(cut)], tmp_path, ok=False)[0]
    assert "corrupt" in line and "unsafe" not in line and "cut.pt" in line
    line = run("launch.convert (missing)", [*args, "--input", str(tmp_path / "no.pt")],
               tmp_path, ok=False)[0]  # fmt: skip
    assert "no.pt" in line


def test_prepare_data_console(sample_pgn, tmp_path):
    args = ["launch.prepare_data", "--input", str(sample_pgn), "--output", str(tmp_path / "d")]
    lines = run("launch.prepare_data", [*args, "--events", "all"], tmp_path)
    moved = [line for line in lines if "moved games from train" in line]
    assert len(moved) == 1 and "split minimums" in moved[0], lines
    missing = ["launch.prepare_data", "--input", str(tmp_path / "none.pgn"), "--output",
               str(tmp_path / "e")]  # fmt: skip
    err = run("launch.prepare_data (missing input)", missing, tmp_path, ok=False)
    assert "none.pgn" in err[0]
