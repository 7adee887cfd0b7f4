"""launch.fetch_weights and Allie.from_released against a local stand-in Hub and file:// Maia.

No test reaches the network: the Hub is ``tests/support/hub_standin.py`` on 127.0.0.1 (``HF_ENDPOINT``),
serving a small ``best.pt`` laid out like the release (a released-structure PyTorch clone with
random weights, its optimizer state, ``iter_num`` and ``best_val_loss``), which the test writes;
the Maia nets are the real files from the shared folder, served through ``file://``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from allie_jax import weights
from tests.support.hub_standin import COMMIT, StandInHub
from tests.support.maia_support import maia_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

REPO = pathlib.Path(__file__).resolve().parents[1]


def released_best_pt(path: pathlib.Path, *, extra: dict | None = None):
    """A best.pt as the released trainer saves it, tiny; returns (path, torch model)."""
    from bench.torch_allie import ControlToken, RegressionHead

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=1997, n_layer=2, n_embd=64, n_head=4, n_positions=128,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = RegressionHead(ControlToken(transformers.GPT2LMHeadModel(config))).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))
    model(torch.tensor([[1997 + 1500, 1997 + 1500, 1968, 5]]))[0].sum().backward()
    optimizer.step()
    state = {"iter_num": 7, "best_val_loss": 1.3535, "model": model.state_dict()}
    state["optimizer"] = optimizer.state_dict()
    state.update(extra or {})
    torch.save(state, path)
    return path, model


@pytest.fixture(scope="module")
def best_pt(tmp_path_factory):
    return released_best_pt(tmp_path_factory.mktemp("release") / "best.pt")


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """A private Hub cache and weights cache for one test; returns a function that points
    HF_ENDPOINT at a stand-in Hub."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("ALLIE_JAX_HOME", str(tmp_path / "allie_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")

    def point(hub: StandInHub) -> None:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)

    return point


def _torch_outputs(model, tokens: np.ndarray):
    with torch.no_grad():
        logits, value, time = model(torch.tensor(tokens, dtype=torch.long))
    return logits.numpy(), value.numpy(), time.numpy()


TOKENS = np.array([[1997 + 1500, 1997 + 1620, 1968, 757, 890, 12]])


def test_fetch_converts_and_matches_torch_then_caches(best_pt, hub_env, tmp_path):
    path, model = best_pt
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    with StandInHub({"medium/best.pt": data}) as hub:
        hub_env(hub)
        out = weights.fetch_released_allie(tmp_path / "allie", sha256=digest)
        gets = [r for r in hub.requests if r[0] == "GET"]
        # the download asks for the commit the Hub's metadata named, not the moving branch
        assert [g[1] for g in gets] == [
            f"/datasets/yimingzhang/allie-models/resolve/{COMMIT}/medium/best.pt"
        ]
        record = json.loads((out / "released.json").read_text())
        assert record["sha256"] == digest and record["size"] == len(data)
        # the converted model gives the released PyTorch module's outputs
        from allie_jax.model.checkpoint import load_model

        ours = load_model(out)(TOKENS)
        logits, value, time = _torch_outputs(model, TOKENS)
        np.testing.assert_allclose(np.asarray(ours.policy_logits), logits, atol=1e-4)
        np.testing.assert_allclose(np.asarray(ours.value), value, atol=1e-4)
        # cached: a second fetch asks the Hub for metadata only, and converts nothing
        mtime = (out / "released.json").stat().st_mtime_ns
        assert weights.fetch_released_allie(tmp_path / "allie") == out
        assert [r[0] for r in hub.requests].count("GET") == 1
        assert (out / "released.json").stat().st_mtime_ns == mtime
    # offline (the Hub gone): the converted model is still found; a new folder is an error
    assert weights.fetch_released_allie(tmp_path / "allie", sha256=digest) == out
    with pytest.raises(weights.FetchError, match="resolve/main/medium/best.pt"):
        weights.fetch_released_allie(tmp_path / "other")


def test_an_interrupted_download_resumes_with_a_range(best_pt, hub_env, tmp_path):
    """A transfer cut mid-file is retried; a partial file left by an earlier, killed run (the Hub
    client's ``blobs/<sha256>.incomplete``) is continued from its end with an HTTP range."""
    path, _ = best_pt
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    cut = len(data) // 3
    with StandInHub({"medium/best.pt": data}, cut_first_get_at=cut) as hub:
        hub_env(hub)
        out = weights.fetch_released_allie(tmp_path / "allie")
        ranges = [r[2] for r in hub.requests if r[0] == "GET"]
    assert ranges == [None, f"bytes={cut}-"]  # cut, then continued where it stopped
    assert json.loads((out / "released.json").read_text())["sha256"] == digest

    download = next(pathlib.Path(os.environ["HF_HUB_CACHE"]).rglob("*best.pt*"))
    download.with_name(download.name + ".part").write_bytes(data[:cut])  # a killed run's part
    download.unlink()
    with StandInHub({"medium/best.pt": data}) as hub:
        hub_env(hub)
        out = weights.fetch_released_allie(tmp_path / "allie2")
        ranges = [r[2] for r in hub.requests if r[0] == "GET"]
    assert ranges == [f"bytes={cut}-"]
    assert json.loads((out / "released.json").read_text())["sha256"] == digest


def test_bytes_that_disagree_with_the_hub_are_refused_and_forgotten(best_pt, hub_env, tmp_path):
    path, _ = best_pt
    wrong = "ab" * 32
    with StandInHub(
        {"medium/best.pt": path.read_bytes()}, listed_sha256={"medium/best.pt": wrong}
    ) as hub:
        hub_env(hub)
        with pytest.raises(weights.FetchError) as err:
            weights.fetch_released_allie(tmp_path / "allie")
        msg = str(err.value)
        assert hub.url + "/datasets/yimingzhang/allie-models/resolve/main/medium/best.pt" in msg
        assert f"the Hub lists {wrong}" in msg
        assert not (tmp_path / "allie").exists()
        assert not [f for f in pathlib.Path(os.environ["HF_HUB_CACHE"]).rglob("*") if f.is_file()]
        # a pinned digest the Hub does not list: refused before any byte is downloaded
        gets = [r for r in hub.requests if r[0] == "GET"]
        with pytest.raises(weights.FetchError, match="not the pinned " + "cd" * 32):
            weights.fetch_released_allie(tmp_path / "allie", sha256="cd" * 32)
        assert [r for r in hub.requests if r[0] == "GET"] == gets


def test_unreachable_hub_names_the_url(hub_env, monkeypatch, tmp_path):
    with StandInHub({}) as hub:
        url = hub.url
    monkeypatch.setenv("HF_ENDPOINT", url)  # closed: nothing listens there now
    with pytest.raises(weights.FetchError) as err:
        weights.fetch_released_allie(tmp_path / "allie")
    assert f"{url}/datasets/yimingzhang/allie-models/resolve/main/medium/best.pt" in str(err.value)
    with StandInHub({}) as hub:  # the Hub answers, but has no such file
        hub_env(hub)
        with pytest.raises(weights.FetchError, match="resolve/main/medium/best.pt"):
            weights.fetch_released_allie(tmp_path / "allie")


def test_extra_classes_only_through_safe_globals(hub_env, tmp_path):
    """A numpy float in the file is built through torch's safe globals; a class outside that
    list is refused by name, and never loaded through the full unpickler."""
    import datetime

    ok, _ = released_best_pt(tmp_path / "np.pt", extra={"best_val_loss": np.float64(1.35)})
    bad, _ = released_best_pt(tmp_path / "dt.pt", extra={"saved": datetime.date(2024, 1, 1)})
    files = {"medium/best.pt": ok.read_bytes(), "other/best.pt": bad.read_bytes()}
    with StandInHub(files) as hub:
        hub_env(hub)
        assert (weights.fetch_released_allie(tmp_path / "a") / "config.json").is_file()
        with pytest.raises(weights.FetchError, match=r"datetime\.date") as err:
            weights.fetch_released_allie(tmp_path / "b", filename="other/best.pt")
        assert "resolve/main/other/best.pt" in str(err.value)


def test_allie_from_released(best_pt, hub_env, tmp_path):
    from allie_jax.engine.api import Allie
    from allie_jax.game import Game

    path, model = best_pt
    with StandInHub({"medium/best.pt": path.read_bytes()}) as hub:
        hub_env(hub)
        allie = Allie.from_released(tmp_path / "allie")
    game = Game(moves=["e2e4"], white_elo=1500, black_elo=1500, time_control="300+0")
    pred = allie.predict([game])[0]
    assert pred.move_probs and abs(sum(pred.move_probs.values()) - 1) < 1e-4


def test_fetch_weights_command(best_pt, tmp_path):
    path, _ = best_pt
    data = path.read_bytes()
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "ALLIE_JAX_HOME": str(tmp_path / "h")}
    env.pop("HF_HUB_CACHE", None)
    cmd = [sys.executable, "-m", "launch.fetch_weights", "allie", "--output", str(tmp_path / "m")]
    with StandInHub({"medium/best.pt": data}) as hub:
        env["HF_ENDPOINT"] = hub.url
        proc = subprocess.run(
            [*cmd, "--sha256", hashlib.sha256(data).hexdigest()],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (
            proc.stdout.strip()
            == f"released Allie: {tmp_path / 'm'}  (use --checkpoint {tmp_path / 'm'})"
        )
        bad = subprocess.run(
            [*cmd[:-1], str(tmp_path / "n"), "--file", "nope.pt"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert bad.returncode == 1 and bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch.fetch_weights: error: ")
    assert hub.url + "/datasets/yimingzhang/allie-models/resolve/main/nope.pt" in lines[0]


# ------------------------------------------------------------------------------------ Maia-1
def test_fetch_maia_from_file_url_checks_and_resumes(tmp_path):
    src = maia_dir()
    out = tmp_path / "maia"
    out.mkdir()
    first = (src / "maia-1500.pb.gz").read_bytes()
    (out / "maia-1500.pb.gz.part").write_bytes(first[: len(first) // 2])  # an interrupted run
    done = weights.fetch_maia(out, base_url=src.as_uri())
    assert done["resumed"] == {"maia-1500.pb.gz": len(first) // 2}
    assert len(done["fetched"]) == 9 and not list(out.glob("*.part"))
    for rating, (size, digest) in weights.MAIA_FILES.items():
        f = out / f"maia-{rating}.pb.gz"
        assert f.stat().st_size == size and weights.sha256_of(f) == digest
    from allie_jax.baselines.maia import find_maia_files

    assert sorted(find_maia_files(out)) == sorted(weights.MAIA_FILES)
    assert weights.fetch_maia(out, base_url=src.as_uri())["fetched"] == []  # already there


def test_fetch_maia_refuses_a_wrong_file_naming_its_url(tmp_path):
    src = tmp_path / "mirror"
    src.mkdir()
    (src / "maia-1100.pb.gz").write_bytes(b"\x1f\x8b not maia")
    with pytest.raises(weights.FetchError) as err:
        weights.fetch_maia(tmp_path / "out", ratings=[1100], base_url=src.as_uri())
    assert f"{src.as_uri()}/maia-1100.pb.gz" in str(err.value) and "sha256" in str(err.value)
    assert not list((tmp_path / "out").iterdir())  # no partial file left to resume from
    with pytest.raises(weights.FetchError, match=f"{src.as_uri()}/maia-1200.pb.gz"):
        weights.fetch_maia(tmp_path / "out", ratings=[1200], base_url=src.as_uri())
