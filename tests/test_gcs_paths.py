"""prepare → train → resume → evaluate with every path on ``gs://``, offline.

A Cloud Storage emulator on 127.0.0.1 (tests/support/gcs_emulator.py) serves the three clients a
``gs://`` run really uses: gcsfs behind ``etils.epath`` (data, JSON, metrics, Orbax's metadata
and commit files), TensorStore's own gcs driver (Orbax's arrays) and google-cloud-storage (Orbax's
bucket check before listing or deleting steps). Nothing is faked inside the library: a path that
bypassed epath would land in a local ``./gs:/`` folder (checked absent) and its objects would be
missing from the emulator's store (checked present).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _require_gcs_extra() -> None:
    """The ``gcs`` extra (gcsfs, google-cloud-storage): a failure under CI=true, a skip elsewhere."""
    try:
        import gcsfs  # noqa: F401
        import google.cloud.storage  # noqa: F401
        import google_crc32c  # noqa: F401
    except ImportError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the gcs extra is required under CI=true (pip install -e '.[gcs]'): {err}")
        pytest.skip(f"the gcs extra is not installed (pip install -e '.[gcs]'): {err}")


@pytest.fixture
def gcs(tmp_path, monkeypatch, sample_pgn):
    """An emulated bucket ``gs://bucket`` holding the bundled games at ``in/games.pgn.zst``."""
    _require_gcs_extra()
    from etils import epath

    from tests.support.gcs_emulator import emulated_gcs

    monkeypatch.chdir(tmp_path)  # a pathlib mistake would create ./gs:/... here
    monkeypatch.setenv("ALLIE_JAX_CACHE", str(tmp_path / "cache"))
    with emulated_gcs() as emulator:
        epath.Path("gs://bucket/in/games.pgn.zst").write_bytes(sample_pgn.read_bytes())
        yield emulator
        assert emulator.unsupported == [], "a client needed an API the emulator lacks"
    assert not (tmp_path / "gs:").exists() and not pathlib.Path("/gs").exists()
    assert not (REPO / "gs:").exists()


def _config(data_dir: str, steps: int):
    from configs.tiny import get_config

    config = get_config()
    config.data.data_dir = data_dir
    config.data.seq_len = 64
    config.model.dropout = 0.1  # the dropout RNG must be restored too
    config.train.steps = steps
    config.train.batch_size = 2
    config.train.log_every = 2
    config.train.eval_every = 4
    config.train.eval_batches = 1
    config.train.checkpoint_every = 2
    config.train.async_checkpoints = True  # Orbax's background commit, on the bucket
    return config


def _saved_params(path) -> dict[str, np.ndarray]:
    """The params item of a saved step, by name, read straight from its directory."""
    import jax
    import orbax.checkpoint as ocp

    from allie_jax.model.checkpoint import flatten_params

    checkpointer = ocp.StandardCheckpointer()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
        checkpointer.metadata(path).item_metadata,
    )
    return flatten_params(checkpointer.restore(path, target))


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _kvstore_script(kv) -> list[tuple]:
    """Operations whose outcomes OCDBT and Orbax rely on: conditional writes, ranged and
    conditional reads, listings over key ranges, range deletion."""
    import tensorstore as ts

    out = []
    g1 = kv.write("a/x", b"hello world").result()
    kv.write("a/x", b"hello world").result()  # a new generation: g1 is stale now
    current = kv.read("a/x").result()
    out.append(("read", current.state, current.value))
    stale = kv.write("a/x", b"nope", if_equal=g1.generation).result()
    out.append(("stale write applied", bool(stale.generation), kv.read("a/x").result().value))
    ok = kv.write("a/x", b"HELLO", if_equal=current.stamp.generation).result()
    out.append(("current write applied", bool(ok.generation), kv.read("a/x").result().value))
    out.append(("range", kv.read("a/x", byte_range=slice(1, 4)).result().value))
    out.append(("unchanged", kv.read("a/x", if_not_equal=ok.generation).result().state))
    out.append(("missing", kv.read("nope").result().state))
    for i in range(5):
        kv.write(f"b/{i}", b"%d" % i).result()
    out.append(("list", sorted(kv.list().result())))
    out.append(("key range", sorted(kv.list(range=ts.KvStore.KeyRange("b/1", "b/3")).result())))
    kv.delete_range(ts.KvStore.KeyRange("b/", "b0")).result()
    kv.write("a/x", None).result()
    out.append(("after deletes", sorted(kv.list().result()), kv.read("a/x").result().state))
    return out


def test_emulator_answers_tensorstore_like_its_memory_kvstore(gcs):
    """The emulator's semantics, checked against an independent reference: the same operations
    through TensorStore's gcs driver (HTTP to the emulator) and its in-memory kvstore."""
    import json as json_lib
    import urllib.request

    import tensorstore as ts

    reference = _kvstore_script(ts.KvStore.open({"driver": "memory"}).result())
    assert _kvstore_script(
        ts.KvStore.open({"driver": "gcs", "bucket": "bucket", "path": "kv/"}).result()
    ) == (reference)
    # listings page (maxResults / pageToken) without losing or repeating a name
    for i in range(5):
        ts.KvStore.open({"driver": "gcs", "bucket": "bucket"}).result().write(
            f"p/{i}", b""
        ).result()
    names, token = [], ""
    while True:
        url = f"{gcs.url}/storage/v1/b/bucket/o?prefix=p/&maxResults=2&pageToken={token}"
        with urllib.request.urlopen(url) as response:  # noqa: S310 (the loopback emulator)
            page = json_lib.load(response)
        names += [item["name"] for item in page.get("items", [])]
        token = page.get("nextPageToken")
        if not token:
            break
    assert names == [f"p/{i}" for i in range(5)]


def _numpy_leaves(tree) -> list[np.ndarray]:
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_checkpoints_models_and_evaluate_on_gs(gcs, tmp_path):
    """The training Checkpointer (keep-last-K with deletion, best, exact restore),
    save_model / load_model and evaluate on gs://, Orbax's arrays through TensorStore's gcs
    driver."""
    import jax
    import jax.numpy as jnp
    from etils import epath
    from flax import nnx

    from allie_jax.eval.evaluate import EvalConfig, evaluate
    from allie_jax.model import AllieModel, ModelConfig
    from allie_jax.model.checkpoint import (
        CheckpointError,
        flatten_params,
        load_model,
        params_dict,
        save_model,
    )
    from allie_jax.train import sharding as shd
    from allie_jax.train.checkpoints import Checkpointer
    from allie_jax.train.loop import create_sharded_state, model_config_from
    from allie_jax.train.optimizer import make_optimizer

    config = _config("gs://bucket/data", 3)
    model_config = model_config_from(config)
    state = create_sharded_state(
        model_config, config, shd.mesh_from_config(config.mesh), make_optimizer(config.train)
    )[1]
    epath.Path("gs://bucket/run/config.json").write_text(model_config.to_json())
    checkpointer = Checkpointer("gs://bucket/run", keep=2, save_every=1, async_save=True)
    saved = {}
    for step in (1, 2, 3):  # a different state per step: the restore must pick the right one
        state = state.replace(
            step=jnp.asarray(step, state.step.dtype),
            params=jax.tree.map(lambda x, s=step: x + s, state.params),
        )
        assert checkpointer.save(state, force=True)
        saved[step] = (
            flatten_params(nnx.to_pure_dict(state.params)),
            _numpy_leaves(state.opt_state),
        )
    checkpointer.save_if_best(state, val_loss=1.0)
    checkpointer.wait()
    checkpointer.close()
    steps = {name.split("/")[2] for name in gcs.objects(prefix="run/checkpoints/")}
    assert steps == {"2", "3"}  # step 1 was deleted from the bucket (keep=2)
    assert "run/best/3/params/manifest.ocdbt" in gcs.objects(prefix="run/best/")

    again = Checkpointer("gs://bucket/run", keep=2, save_every=1)
    assert again.latest_step() == 3 and again.best_loss == 1.0
    restored = again.restore(state, step=2)
    again.close()
    assert int(restored.step) == 2
    _assert_same(flatten_params(nnx.to_pure_dict(restored.params)), saved[2][0])
    for a, b in zip(_numpy_leaves(restored.opt_state), saved[2][1], strict=True):
        np.testing.assert_array_equal(a, b)
    # a training workdir on gs:// loads as a model: its best step
    _assert_same(flatten_params(params_dict(load_model("gs://bucket/run"))), saved[3][0])

    model = AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(3))
    where = save_model(model, "gs://bucket/models/tiny")
    assert str(where) == "gs://bucket/models/tiny"
    loaded = load_model("gs://bucket/models/tiny")
    _assert_same(flatten_params(params_dict(loaded)), flatten_params(params_dict(model)))
    assert "models/tiny/params/manifest.ocdbt" in gcs.objects(prefix="models/")
    # evaluate: checkpoint, games and output on gs://; the report equals the local one
    config = EvalConfig(systems=("policy",), max_games=2, plots=False)
    report = evaluate(where, "gs://bucket/in/games.pgn.zst", "gs://bucket/eval", config)
    local = evaluate(loaded, gcs_pgn_copy(tmp_path), tmp_path / "eval", config)
    assert report["move_accuracy"]["policy"]["overall"]["n"] > 0
    written = json.loads(epath.Path("gs://bucket/eval/report.json").read_text())
    expected = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert written["move_accuracy"] == expected["move_accuracy"]
    assert report["move_accuracy"] == local["move_accuracy"]
    agents = {agent.split("/")[0] for method, _, agent in gcs.requests if method == "POST"}
    assert "tensorstore" in agents  # the arrays went through TensorStore's own gcs driver

    with pytest.raises(CheckpointError, match="gs://bucket/nothing: no such checkpoint"):
        load_model("gs://bucket/nothing")
    epath.Path("gs://bucket/best.pt").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError, match="gs://bucket/best.pt is a PyTorch file"):
        load_model("gs://bucket/best.pt")


def test_other_user_paths_on_gs(gcs, capsys):
    """A gs:// workdir's metrics (JSONL + TensorBoard events), evaluate's calibration PGN and the
    UCI engine's --checkpoint checks."""
    from etils import epath

    import launch.uci
    from allie_jax.eval.calibration import calibration_from_pgn
    from allie_jax.train.metrics import MetricsWriter
    from tests.test_calibration import PGN

    for step in (1, 2):  # a run, then its resumption: the JSONL is appended to
        writer = MetricsWriter("gs://bucket/run")
        writer.write(step, {"loss": 1.0 / step})
        writer.close()
    lines = epath.Path("gs://bucket/run/metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    events = gcs.objects(prefix="run/tensorboard/events.out.tfevents")
    assert events and all(b"train/loss" in gcs.read("bucket", e) for e in events)

    epath.Path("gs://bucket/cal/games.pgn").write_text(PGN)
    table = calibration_from_pgn("gs://bucket/cal/games.pgn", ["Allie-Adaptive"])
    assert table["Allie-Adaptive"].performance == 1693  # as from the local file
    with pytest.raises(FileNotFoundError, match="gs://bucket/cal/none.pgn"):
        calibration_from_pgn("gs://bucket/cal/none.pgn", ["Allie-Adaptive"])

    epath.Path("gs://bucket/released/best.pt").write_bytes(b"not a zip")
    for path, message in [
        ("gs://bucket/none", "does not exist"),
        ("gs://bucket/released/best.pt", "gs://bucket/released/best.pt is a PyTorch file"),
    ]:
        with pytest.raises(SystemExit):
            launch.uci.main(["--checkpoint", path])
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_prepare_train_resume_evaluate_on_gs(gcs, tmp_path):
    """Every path on gs://: the resumed run equals a straight run bit for bit, and evaluating
    the gs:// workdir into a gs:// output gives the report of the same run kept locally."""
    from etils import epath

    from allie_jax.data.prepare import PrepareConfig, prepare
    from allie_jax.eval.evaluate import EvalConfig, evaluate
    from allie_jax.model.checkpoint import flatten_params, load_model, params_dict
    from allie_jax.train import train_and_evaluate

    prepare(
        ["gs://bucket/in/*.pgn.zst"],
        "gs://bucket/data",
        PrepareConfig(events="all", val_frac=0.05, test_frac=0.05),
    )
    assert "data/stats.json" in gcs.objects(prefix="data/")

    first = train_and_evaluate(_config("gs://bucket/data", 4), "gs://bucket/run")
    second = train_and_evaluate(_config("gs://bucket/data", 6), "gs://bucket/run")
    straight = train_and_evaluate(_config("gs://bucket/data", 6), tmp_path / "straight")
    assert (first.final_step, second.final_step, straight.final_step) == (4, 6, 6)

    run = epath.Path("gs://bucket/run")
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # the second run started at the saved step 4 (a fresh start would log 2 and 4 again)
    assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 6]
    _assert_same(
        _saved_params(run / "checkpoints" / "6" / "params"),
        _saved_params(tmp_path / "straight" / "checkpoints" / "6" / "params"),
    )
    # the arrays went through TensorStore's gcs driver into the emulator, not through a local path
    agents = {agent.split("/")[0] for method, _, agent in gcs.requests if method == "POST"}
    assert "tensorstore" in agents
    saved = gcs.objects(prefix="run/checkpoints/6/params/")
    assert "run/checkpoints/6/params/manifest.ocdbt" in saved
    assert any(name.startswith("run/tensorboard/events.out.tfevents") for name in gcs.objects())

    model = load_model("gs://bucket/run")  # the best step, as for a local workdir
    _assert_same(
        flatten_params(params_dict(model)),
        flatten_params(params_dict(load_model(tmp_path / "straight"))),
    )

    config = EvalConfig(systems=("policy",), max_games=3, plots=False)
    remote = evaluate("gs://bucket/run", "gs://bucket/in/games.pgn.zst", "gs://bucket/eval", config)
    evaluate(tmp_path / "straight", gcs_pgn_copy(tmp_path), tmp_path / "eval", config)
    assert remote["move_accuracy"]["policy"]["overall"]["n"] > 0
    written = json.loads(epath.Path("gs://bucket/eval/report.json").read_text())
    expected = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert written["move_accuracy"] == expected["move_accuracy"]
    assert "eval/report.md" in gcs.objects(prefix="eval/")


def gcs_pgn_copy(tmp_path) -> pathlib.Path:
    """The games read back from the bucket into a local file (the local run reads the same bytes)."""
    from etils import epath

    local = tmp_path / "games.pgn.zst"
    local.write_bytes(epath.Path("gs://bucket/in/games.pgn.zst").read_bytes())
    return local


@pytest.mark.slow
def test_commands_on_gs(gcs, tmp_path):
    """The real commands, each in its own process, with every path on gs://: prepare_data,
    train, train again (resumes), evaluate, evaluate --report_only from the gs:// records, and
    the UCI engine playing from the gs:// workdir."""
    from etils import epath

    env = {**os.environ, **gcs.env(), "PYTHONPATH": str(REPO)}

    def run(*args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", *args],
            input=stdin,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    run(
        "launch.prepare_data",
        "--input=gs://bucket/in/games.pgn.zst",
        "--output=gs://bucket/data",
        "--events=all",
        "--val_frac=0.05",
        "--test_frac=0.05",
    )
    train = [
        "launch.train",
        f"--config={REPO / 'configs' / 'tiny.py'}",
        "--workdir=gs://bucket/run",
        "--data_dir=gs://bucket/data",
        "--config.data.seq_len=64",
        "--config.train.batch_size=2",
        "--config.train.log_every=2",
        "--config.train.eval_every=4",
        "--config.train.eval_batches=1",
        "--config.train.checkpoint_every=2",
    ]
    first = run(*train, "--config.train.steps=4")
    assert "resumed" not in first
    second = run(*train, "--config.train.steps=6")
    assert "resumed from step 4" in second
    assert {"4", "6"} <= {
        name.split("/")[2] for name in gcs.objects(prefix="run/checkpoints/") if "/" in name
    }
    out = run(
        "launch.evaluate",
        "--checkpoint=gs://bucket/run",
        "--games=gs://bucket/in/games.pgn.zst",
        "--output=gs://bucket/eval",
        "--systems=policy",
        "--max_games=3",
    )
    assert "wrote gs://bucket/eval/report.json" in out
    report = json.loads(epath.Path("gs://bucket/eval/report.json").read_text())
    assert report["move_accuracy"]["policy"]["overall"]["n"] > 0
    assert any(name.endswith(".png") for name in gcs.objects(prefix="eval/"))
    run(  # the report again, from the gs:// records alone
        "launch.evaluate",
        "--report_only=gs://bucket/eval/records",
        "--output=gs://bucket/report",
        "--filter=white_elo >= 0",
    )
    again = json.loads(epath.Path("gs://bucket/report/report.json").read_text())
    assert again["move_accuracy"] == report["move_accuracy"]

    uci = run(
        "launch.uci",
        "--checkpoint=gs://bucket/run",
        "--compile-cache=none",
        stdin="uci\nisready\nposition startpos\ngo movetime 50\n",
    )
    assert "readyok" in uci and "bestmove" in uci
