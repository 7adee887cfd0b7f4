"""The colab/ notebooks, executed top to bottom on CPU with tiny parameters, so they cannot rot.

Each runs in a fresh Jupyter kernel (nbclient + ipykernel), with its parameters cell overridden
the way papermill does it: a cell inserted right after the one tagged ``parameters``.
"""

from __future__ import annotations

import json
import pathlib
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = pathlib.Path(__file__).resolve().parents[1]
COLAB = REPO / "colab"
TIMINGS: dict[str, float] = {}


def execute(name: str, params: dict, workdir: pathlib.Path, monkeypatch) -> object:
    """Run ``colab/<name>`` with ``params`` injected; the executed notebook."""
    nb = nbformat.read(COLAB / name, as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name}: exactly one cell must be tagged 'parameters'"
    source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell("# injected by tests/test_notebooks.py\n" + source)
    nb.cells.insert(tagged[0] + 1, cell)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # this checkout's allie_jax in the kernel
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    t0 = time.perf_counter()
    client.execute()
    TIMINGS[name] = time.perf_counter() - t0
    print(f"{name}: executed in {TIMINGS[name]:.1f} s")
    return nb


def outputs(nb, kind: str | None = None) -> list[dict]:
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
    """Colab-only steps sit behind the google.colab check; heavy sizes are parameters."""
    for path in sorted(COLAB.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), path.name
        for src in code:
            for colab_only in ('git", "clone', "drive.mount", "nb.download("):
                if colab_only in src:
                    assert '"google.colab" in sys.modules' in src, (path.name, colab_only)
            # the install cell is the longest (it runs before allie_jax exists); the rest are calls
            assert len(src.splitlines()) <= 14, f"{path.name}: a cell grew past 14 lines"
        assert not any(o for c in nb.cells for o in c.get("outputs", [])), (
            f"{path.name}: clear outputs"
        )


pytestmark = pytest.mark.xdist_group("notebooks")  # one worker: the quickstart run is shared


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart notebook, executed once; its workdir (data + trained run) is reused."""
    workdir = tmp_path_factory.mktemp("quickstart")
    params = dict(
        TRAIN_STEPS=3,
        BATCH_SIZE=2,
        EVAL_GAMES=6,
        EVAL_SYSTEMS=["policy"],
        RANDOM_GAMES=2,
        PLAY_MODE="policy",
    )
    with pytest.MonkeyPatch.context() as mp:
        nb = execute("quickstart.ipynb", params, workdir, mp)
    return nb, workdir


def test_quickstart(quickstart):
    nb, workdir = quickstart
    text = text_of(nb)
    assert "trained to step 3" in text
    assert "tokens_per_second" in text
    assert "| Elo bin | policy (n) |" in text and "paper (all bins) | 55.7%" in text
    assert images(nb) >= 3  # the loss curve and the evaluation plots
    assert text.count("Allie played") == 3 and "predicted think time" in text
    assert text.count("<svg") >= 3
    assert '[Event "allie-jax play"]' in text and "1. e4" in text
    metrics = (workdir / "quickstart" / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["step"] == 3


def _released_best_pt(path: pathlib.Path) -> pathlib.Path:
    """A best.pt laid out like the release (random tiny weights, an optimizer entry)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bench.torch_allie import ControlToken, RegressionHead
    from tests.test_convert import _hf_config

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(_hf_config(vocab_size=1997, n_positions=512))
    model = RegressionHead(ControlToken(gpt2)).eval()
    torch.save({"model": model.state_dict(), "optimizer": {}, "iter_num": 1}, path)
    return path


def _evaluate_checkpoint(tmp_path, monkeypatch, systems: list[str]) -> None:
    best = _released_best_pt(tmp_path / "best.pt")
    params = dict(
        BEST_PT=str(best), SYSTEMS=systems, MAX_GAMES=4, SEARCH_POSITIONS=6, RANDOM_GAMES=2
    )
    nb = execute("evaluate_checkpoint.ipynb", params, tmp_path, monkeypatch)
    text = text_of(nb)
    assert (tmp_path / "evaluate_out" / "model" / "config.json").exists()
    assert "| Elo bin | " + " | ".join(f"{s} (n)" for s in systems) + " |" in text
    assert "paper (all bins) | 55.7% |" in text
    report = json.loads((tmp_path / "evaluate_out" / "eval" / "report.json").read_text())
    assert set(report["move_accuracy"]) == set(systems)


def test_evaluate_checkpoint_converts_best_pt(tmp_path, monkeypatch):
    """CI: policy and greedy (one forward pass each); the slow variant adds the search."""
    _evaluate_checkpoint(tmp_path, monkeypatch, ["policy", "greedy"])


@pytest.mark.slow
def test_evaluate_checkpoint_policy_vs_adaptive(tmp_path, monkeypatch):
    """The notebook's own comparison (compiles the adaptive tree search: minutes on CPU)."""
    _evaluate_checkpoint(tmp_path, monkeypatch, ["policy", "adaptive"])


def test_train_on_tpu_resumes_the_quickstart_run(quickstart, tmp_path, monkeypatch):
    """CI: point the notebook at the quickstart's run (already at step 3): mesh, resume, speed and
    loss curve without a second training compile; the slow variant trains from scratch."""
    _, workdir = quickstart
    params = dict(
        DATA_DIR=str(workdir / "quickstart" / "data"),
        WORKDIR=str(workdir / "quickstart" / "run"),
        CONFIG="tiny",
        STEPS=3,
        OVERRIDES={"train.batch_size": 2},
    )
    nb = execute("train_on_tpu.ipynb", params, tmp_path, monkeypatch)
    text = text_of(nb)
    assert "'data': 1, 'fsdp': 1, 'tensor': 1" in text
    assert "tokens/s, MFU" in text and "at step 3" in text
    assert images(nb) == 1


@pytest.mark.slow
def test_train_on_tpu_trains(tmp_path, monkeypatch, prepared_sample):
    params = dict(
        DATA_DIR=str(prepared_sample), CONFIG="tiny", STEPS=3, OVERRIDES={"train.batch_size": 2}
    )
    nb = execute("train_on_tpu.ipynb", params, tmp_path, monkeypatch)
    text = text_of(nb)
    assert "trained to step 3" in text and "tokens/s, MFU" in text and "at step 3" in text
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
