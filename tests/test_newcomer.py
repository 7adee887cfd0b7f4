"""A newcomer's first hour: the released ``best.pt`` where a directory is expected, the converter's
safe loading, and one-line errors from ``launch.evaluate`` (issue 14)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
from absl import flags
from absl.testing import flagsaver
from flax import nnx

from allie_jax.model.checkpoint import CheckpointError, load_model, save_model
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("newcomer") / "tiny"
    return save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), path)


@pytest.fixture
def best_pt(tmp_path) -> pathlib.Path:
    """A file laid out like torch.save's output (a zip archive), named like the release."""
    path = tmp_path / "best.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return path


# ------------------------------------------------------------------ best.pt given as a checkpoint
def test_load_model_on_best_pt_says_how_to_convert(best_pt):
    with pytest.raises(CheckpointError) as err:
        load_model(best_pt)
    msg = str(err.value)
    assert str(best_pt) in msg
    assert "python -m launch.convert --format allie" in msg and "--input" in msg


def test_allie_load_on_best_pt_says_how_to_convert(best_pt):
    from allie_jax.engine.api import Allie

    with pytest.raises(CheckpointError, match="launch.convert --format allie"):
        Allie.load(best_pt)


def test_load_model_on_other_files(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(CheckpointError, match="is a file; expected a model directory"):
        load_model(other)
    st = tmp_path / "model.safetensors"
    st.write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match="load_safetensors"):
        load_model(st)


def test_uci_on_best_pt_exits_with_one_line(best_pt):
    proc = subprocess.run(
        [sys.executable, "-m", "launch.uci", "--checkpoint", str(best_pt)],
        cwd=REPO,
        capture_output=True,
        text=True,
        input="uci\nquit\n",
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "launch.convert --format allie" in proc.stderr.splitlines()[-1]


# ------------------------------------------------------------------ launch.evaluate's user errors
def _evaluate_error(capsys, **values) -> str:
    """Run launch.evaluate's main in-process with these flags; return its one stderr line."""
    import launch.evaluate as cli

    flag_values = {"max_games": 2, "plots": False, "random_games": 2, **values}
    with flagsaver.flagsaver(**flag_values), pytest.raises(SystemExit) as exit_:
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        cli.main([])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("launch.evaluate: error: "), err
    return err[0]


def test_evaluate_user_errors_are_one_line(capsys, checkpoint, sample_pgn, tmp_path, best_pt):
    out = str(tmp_path / "out")
    games = str(sample_pgn)
    missing = str(tmp_path / "nope")
    line = _evaluate_error(capsys, checkpoint=missing, games=games, output=out)
    assert "nope" in line and "no such checkpoint" in line
    line = _evaluate_error(capsys, checkpoint=str(best_pt), games=games, output=out)
    assert "launch.convert" in line
    line = _evaluate_error(capsys, checkpoint=str(checkpoint), games=missing, output=out)
    # the evaluator now reads the games' bytes (their digest names the job) before the PGN
    # reader opens them: either way one line naming the file and the OS's reason
    assert "nope" in line and ("cannot open PGN input" in line or "No such file" in line)
    empty = tmp_path / "empty.pgn"
    empty.write_text("")
    line = _evaluate_error(capsys, checkpoint=str(checkpoint), games=str(empty), output=out)
    assert "no usable game" in line and "empty.pgn" in line
    junk = tmp_path / "junk.pgn.zst"
    junk.write_bytes(os.urandom(256))
    line = _evaluate_error(capsys, checkpoint=str(checkpoint), games=str(junk), output=out)
    assert "cannot read PGN input" in line and "junk.pgn.zst" in line


def test_evaluate_cli_junk_input_exits_nonzero_without_traceback(checkpoint, tmp_path):
    junk = tmp_path / "junk.pgn.zst"
    junk.write_bytes(b"this is not zstandard" * 20)
    cmd = [sys.executable, "-m", "launch.evaluate", "--checkpoint", str(checkpoint)]
    cmd += ["--games", str(junk), "--output", str(tmp_path / "out"), "--noplots"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("launch.evaluate: error: cannot read")


# ------------------------------------------------------------------ the converter's safe loading
torch_only = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("torch"), reason="needs the [torch] extra"
)


class _RunsCode:
    """An object whose unpickling runs a function: what weights_only=True exists to stop."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


@torch_only
def test_converter_refuses_unsafe_pickles_unless_told(tmp_path):
    import torch

    from allie_jax.convert import ConversionError
    from allie_jax.convert.allie_torch import read_torch_checkpoint

    marker = tmp_path / "code_ran"
    path = tmp_path / "best.pt"
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save({"model": {"w": weight}, "config": _RunsCode(marker)}, path)
    with pytest.raises(ConversionError, match="--allow_unsafe_pickle") as err:
        read_torch_checkpoint(path)
    assert "arbitrary code" in str(err.value)
    assert not marker.exists()  # refused, not retried with the full unpickler
    state = read_torch_checkpoint(path, allow_unsafe_pickle=True)
    assert marker.exists()  # the risk the flag names is real
    assert state["w"].tolist() == weight.tolist()


def _peak_rss_since_reset() -> int:
    """Peak resident bytes since the last reset (VmHWM, reset through /proc/self/clear_refs)."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _rss() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@torch_only
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_converter_reads_only_the_model_entries(tmp_path):
    """A 256 MB optimizer state next to a small model must not be read into memory."""
    import torch

    from allie_jax.convert.allie_torch import read_torch_checkpoint

    path = tmp_path / "best.pt"
    model = {"w": torch.ones(1000, 100)}
    optimizer = {"state": {0: {"exp_avg": torch.ones(64_000_000)}}}
    torch.save({"model": model, "optimizer": optimizer, "iter_num": 7}, path)
    del optimizer
    assert path.stat().st_size > 250e6
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    before = _rss()
    state = read_torch_checkpoint(path)
    grew = _peak_rss_since_reset() - before
    assert set(state) == {"w"} and state["w"].shape == (1000, 100)
    assert grew < 64e6, f"peak RSS grew by {grew / 1e6:.0f} MB reading a 256 MB file"


@torch_only
def test_converter_calls_damaged_files_corrupt_not_unsafe(tmp_path):
    """Random bytes or a cut download is corrupt: the message must not steer to the unsafe
    loader, and the unsafe loader is not tried even when allowed."""
    import torch

    from allie_jax.convert import ConversionError
    from allie_jax.convert.allie_torch import read_torch_checkpoint

    good = tmp_path / "best.pt"
    torch.save({"model": {"w": torch.ones(64, 64)}, "iter_num": 3}, good)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(4096))
    for path in (cut, junk):
        for unsafe in (False, True):
            with pytest.raises(ConversionError) as err:
                read_torch_checkpoint(path, allow_unsafe_pickle=unsafe)
            msg = str(err.value)
            assert msg.startswith(f"{path}: corrupt or truncated"), msg
            assert "unsafe" not in msg and "arbitrary code" not in msg


@torch_only
def test_converter_builds_numpy_scalars_through_safe_globals_only(tmp_path):
    """A numpy number beside the tensors loads through torch's safe globals (the listed numpy
    classes); without them the same file is refused naming the classes."""
    import numpy as np
    import torch

    from allie_jax.convert import ConversionError
    from allie_jax.convert.allie_torch import read_torch_checkpoint

    path = tmp_path / "best.pt"
    torch.save({"model": {"w": torch.ones(2, 3)}, "best_val_loss": np.float64(1.35)}, path)
    assert read_torch_checkpoint(path)["w"].shape == (2, 3)
    with pytest.raises(ConversionError, match=r"numpy\.dtype.*--allow_unsafe_pickle"):
        read_torch_checkpoint(path, safe_globals=())
