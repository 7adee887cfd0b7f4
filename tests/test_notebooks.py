"""The colab/ notebooks, run the way Colab runs them: through their install cell, on CPU.

Each notebook runs in a fresh Jupyter kernel (nbclient + ipykernel) whose Python is a throwaway
virtual environment layered on this one (a ``.pth`` adds its packages, so nothing is downloaded:
``PIP_NO_INDEX``), with a stand-in ``google.colab`` module imported at kernel start as Colab
does, and ``REPO_URL`` a ``file://`` git repository holding this working tree. The install cell
therefore really clones it and ``pip install -e`` s it; the kernel imports ``allie_jax`` from that
clone. The released Allie comes from a stand-in Hub (``tests/support/hub_standin.py``) serving a small
released-format ``best.pt``. Parameters are overridden the way papermill does it: a cell inserted
after the one tagged ``parameters``; the modes are the notebooks' own defaults.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = pathlib.Path(__file__).resolve().parents[1]
COLAB = REPO / "colab"
TIMINGS: dict[str, dict[str, float]] = {}

pytestmark = pytest.mark.xdist_group("notebooks")  # one worker: the Colab stand-in is shared

STANDIN_COLAB = """\"\"\"Stand-in for Colab's google.colab (tests only): present, so the notebooks
take their Colab path.\"\"\"
"""


def _working_tree_repo(dest: pathlib.Path) -> str:
    """A git repository holding this working tree (tracked and untracked, not ignored, files);
    its ``file://`` URL."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "working tree"], cwd=dest, check=True)
    return dest.as_uri()


@pytest.fixture(scope="module")
def colab(tmp_path_factory) -> dict:
    """The stand-in Colab runtime: kernel spec, environment, repository URL."""
    root = tmp_path_factory.mktemp("colab")
    url = _working_tree_repo(root / "repo")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = sysconfig.get_paths()["purelib"]
    pathlib.Path(purelib, "zz_base_venv.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n"
    )
    standin = root / "standin"
    (standin / "google" / "colab").mkdir(parents=True)
    (standin / "google" / "colab" / "__init__.py").write_text(STANDIN_COLAB)
    for module in ("output", "files", "drive"):  # what libraries import when on Colab
        (standin / "google" / "colab" / f"{module}.py").write_text(
            "def __getattr__(name):\n"
            "    raise NotImplementedError(f'google.colab stand-in: no {name}')\n"
        )
    startup = root / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # as Colab's kernel does\n")
    spec = root / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Colab stand-in", "language": "python"})
    )
    env = {
        "JUPYTER_PATH": str(root / "jupyter"),
        "IPYTHONDIR": str(root / "ipython"),
        "PYTHONPATH": str(standin),  # the stand-in only: allie_jax must come from the install
        "JAX_PLATFORMS": "cpu",
        "PIP_NO_INDEX": "1",  # everything the install needs is already in the base venv
        "PIP_NO_BUILD_ISOLATION": "0",  # pip's spelling of --no-build-isolation
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    return {"url": url, "env": env, "root": root}


def execute(name: str, params: dict, workdir: pathlib.Path, colab: dict, monkeypatch) -> object:
    """Run ``colab/<name>`` with ``params`` injected in the stand-in Colab; the executed notebook.
    Records seconds from the first cell to the end of each cell in ``TIMINGS[name]``."""
    nb = nbformat.read(COLAB / name, as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name}: exactly one cell must be tagged 'parameters'"
    params = {"REPO_URL": colab["url"], **params}
    source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell("# injected by tests/test_notebooks.py\n" + source)
    nb.cells.insert(tagged[0] + 1, cell)
    for key, value in colab["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HOME", str(workdir / "hf_home"))
    monkeypatch.setenv("ALLIE_JAX_HOME", str(workdir / "allie_home"))
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="colab", resources={"metadata": {"path": str(workdir)}}
    )
    t0 = time.perf_counter()
    client.execute()
    wall = time.perf_counter() - t0
    TIMINGS[name] = {"wall": wall, **_cell_seconds(nb)}
    print(f"{name}: executed in {wall:.1f} s")
    return nb


def _cell_seconds(nb) -> dict[str, float]:
    """Seconds from the start of the first code cell to the end of each code cell (Jupyter's
    own execution timestamps), keyed by the cell's first line."""

    def stamp(cell, key):
        return datetime.datetime.fromisoformat(cell.metadata.execution[key].replace("Z", "+00:00"))

    code = [c for c in nb.cells if c.cell_type == "code" and "execution" in c.metadata]
    start = stamp(code[0], "iopub.execute_input")
    return {
        c.source.splitlines()[0][:60]: (stamp(c, "shell.execute_reply") - start).total_seconds()
        for c in code
    }


def outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def text_of(nb) -> str:
    parts = []
    for o in outputs(nb):
        if o.get("output_type") == "stream":
            parts.append(o["text"])
        for mime in ("text/plain", "text/html", "text/markdown"):
            if mime in o.get("data", {}):
                parts.append(o["data"][mime])
    return "\n".join(parts)


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs(nb))


def test_notebooks_are_thin_and_guarded():
    """Colab-only steps sit behind the google.colab check; every notebook has the same install
    cell (repository or uploaded wheel, the runtime's extra, a restart when jax/numpy changed);
    heavy sizes are parameters; the README has an Open-in-Colab badge per notebook."""
    readme = (REPO / "README.md").read_text()
    installs = set()
    for path in sorted(COLAB.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), path.name
        install = [src for src in code if "pip" in src and "install" in src]
        assert len(install) == 1, path.name
        installs.add(install[0])
        for needle in ('"gpu"', '"tpu"', ".whl", "git", "os.kill(os.getpid()", "REPO_URL"):
            assert needle in install[0], (path.name, needle)
        for src in code:
            for colab_only in ('git", "clone', "drive.mount", "nb.download("):
                if colab_only in src:
                    assert '"google.colab" in sys.modules' in src, (path.name, colab_only)
            if src is not install[0]:  # the install runs before allie_jax exists; the rest call it
                assert len(src.splitlines()) <= 14, f"{path.name}: a cell grew past 14 lines"
        assert not any(o for c in nb.cells for o in c.get("outputs", [])), (
            f"{path.name}: clear outputs"
        )
        badge = f"colab.research.google.com/github/allie-jax/allie-jax/blob/main/colab/{path.name}"
        assert badge in readme, f"README: no Open in Colab badge for {path.name}"
        assert badge in nb.cells[0].source, f"{path.name}: no badge in its first cell"
    assert len(installs) == 1, "the install cell differs between notebooks"


def _install_cell() -> str:
    nb = nbformat.read(COLAB / "quickstart.ipynb", as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "pip" in c.source)


@pytest.mark.parametrize(
    "runtime, wheel, replaced, target, editable",
    [
        ("gpu", False, False, "allie-jax[gpu,weights]", True),
        ("tpu", False, False, "allie-jax[tpu,weights]", True),
        ("cpu", False, True, "allie-jax[weights]", True),
        ("gpu", True, True, "allie_jax-0.1.0-py3-none-any.whl[gpu,weights]", False),
    ],
)
def test_install_cell_picks_the_extra_and_restarts(
    runtime, wheel, replaced, target, editable, tmp_path, monkeypatch
):
    """The install cell's decisions on a simulated Colab runtime (no pip, no git run): the extra
    from the accelerator found, an uploaded wheel before the repository, and a restart exactly
    when pip replaced jax or numpy."""
    import importlib.metadata
    import types

    monkeypatch.chdir(tmp_path)
    if wheel:
        (tmp_path / "allie_jax-0.1.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    if runtime == "tpu":
        monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.2:8470")
    real_exists = os.path.exists
    devices = {"gpu": "/dev/nvidia0", "tpu": "/dev/accel0"}
    monkeypatch.setattr(
        os.path,
        "exists",
        lambda p: p == devices.get(runtime) or (p not in devices.values() and real_exists(p)),
    )
    commands: list[list[str]] = []
    installed = {"done": False}

    def fake_run(cmd, check=False):
        commands.append(list(cmd))
        if "pip" in cmd:
            installed["done"] = True

    versions = importlib.metadata.version
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda p: versions(p) + (".new" if replaced and installed["done"] else ""),
    )
    kills = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(_install_cell(), {"REPO_URL": "file:///repo", "EXTRAS": ["weights"]})
    clones = [c for c in commands if c[:2] == ["git", "clone"]]
    assert bool(clones) == (not wheel)
    pip = next(c for c in commands if "pip" in c)
    assert pip[-1] == str(tmp_path / target)
    assert ("-e" in pip) == editable
    assert kills == ([(os.getpid(), 9)] if replaced else [])


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A stand-in Hub serving a small released-format best.pt (random tiny weights)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.hub_standin import StandInHub
    from tests.test_fetch_weights import released_best_pt

    path, _ = released_best_pt(tmp_path_factory.mktemp("release") / "best.pt")
    data = path.read_bytes()
    with StandInHub({"medium/best.pt": data}) as hub:
        yield hub, hashlib.sha256(data).hexdigest()


def test_quickstart_fetches_plays_and_evaluates_the_released_allie(
    colab, released, tmp_path, monkeypatch
):
    hub, digest = released
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    params = dict(RELEASED_SHA256=digest, EVAL_GAMES=3, SEARCH_POSITIONS=6)
    nb = execute("quickstart.ipynb", params, tmp_path, colab, monkeypatch)
    text = text_of(nb)
    assert f"allie_jax from {tmp_path / 'allie-jax'}" in text  # installed by the install cell
    assert (tmp_path / "allie-jax" / ".git").is_dir()
    assert "downloading " + hub.url in text and "/medium/best.pt" in text
    assert (
        json.loads((tmp_path / "allie_released" / "released.json").read_text())["sha256"] == digest
    )
    assert text.count("Allie played") == 3 and "predicted think time" in text
    assert '[Event "allie-jax play"]' in text and "1. e4" in text
    assert "| Elo bin | policy (n) | adaptive (n) |" in text and "paper (all bins) | 55.7%" in text
    report = json.loads((tmp_path / "quickstart_eval" / "report.json").read_text())
    assert set(report["move_accuracy"]) >= {"policy", "adaptive"}
    for cell, seconds in TIMINGS["quickstart.ipynb"].items():  # figures for bench/RESULTS.md
        print(f"quickstart: {seconds:7.1f} s from the first cell to the end of: {cell}")


def test_evaluate_checkpoint_reproduces_the_table(colab, released, tmp_path, monkeypatch):
    hub, digest = released
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    params = dict(RELEASED_SHA256=digest, MAX_GAMES=3, SEARCH_POSITIONS=6)
    nb = execute("evaluate_checkpoint.ipynb", params, tmp_path, colab, monkeypatch)
    text = text_of(nb)
    assert f"allie_jax from {tmp_path / 'allie-jax'}" in text
    assert "| Elo bin | policy (n) | adaptive (n) |" in text
    assert "paper (all bins) | 55.7% | 55.9% |" in text
    report = json.loads((tmp_path / "evaluate_out" / "eval" / "report.json").read_text())
    assert set(report["move_accuracy"]) >= {"policy", "adaptive"}


def test_train_on_tpu_trains_from_scratch(colab, tmp_path, monkeypatch):
    """Its defaults (INIT="scratch", intervals scaled to STEPS) on the tiny config: it trains."""
    params = dict(USE_SAMPLE=True, CONFIG="tiny", STEPS=2, OVERRIDES={"train.batch_size": 2})
    nb = execute("train_on_tpu.ipynb", params, tmp_path, colab, monkeypatch)
    text = text_of(nb)
    assert f"allie_jax from {tmp_path / 'allie-jax'}" in text
    assert "'data': 1, 'fsdp': 1, 'tensor': 1" in text
    assert "trained to step 2" in text and "tokens/s, MFU" in text and "at step 2" in text
    metrics = [
        json.loads(x) for x in (tmp_path / "tpu_run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    assert [m["step"] for m in metrics if "loss" in m][-1] == 2  # both steps trained and logged
    assert images(nb) == 1


# ------------------------------------------------------------------ the helpers on their own
def test_mesh_for_devices():
    from allie_jax import notebook as nb

    assert nb.mesh_for_devices("tiny", 1) == {"data": 1, "fsdp": 1, "tensor": 1}
    # CPU devices report no memory: with several devices the state is sharded (FSDP)
    assert nb.mesh_for_devices("allie_medium", 8) == {"data": 1, "fsdp": 8, "tensor": 1}


def test_accuracy_table_against_hand_made_report():
    from allie_jax import notebook as nb

    def r(v, n):
        return {"value": v, "n": n}

    report = {
        "move_accuracy": {
            "policy": {"overall": r(0.5, 30), "by_elo": {"1500": r(0.4, 10), "1600": r(0.55, 20)}},
            "adaptive": {"overall": r(0.6, 5), "by_elo": {"1600": r(0.6, 5)}},
        }
    }
    table = nb.accuracy_table(report, ["policy", "adaptive"]).splitlines()
    assert table[2] == "| 1500–1599 | 40.0% (10) | – |"
    assert table[3] == "| 1600–1699 | 55.0% (20) | 60.0% (5) |"
    assert table[4] == "| **all** | 50.0% (30) | 60.0% (5) |"
    assert table[5] == "| paper (all bins) | 55.7% | 55.9% |"
