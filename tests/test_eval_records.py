"""Evaluation jobs at scale: per-position records (checked against python-chess), the report from
records, shards that merge to the one-shard run, a SIGKILLed run that resumes to the same bytes,
subsamples that do not depend on the sharding, and --filter."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import chess
import chess.pgn
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flax import nnx

from allie_jax.eval import records, stream
from allie_jax.eval import systems as sysmod
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import open_text

ev = importlib.import_module("allie_jax.eval.evaluate")
REPO = pathlib.Path(__file__).resolve().parents[1]
VOLATILE = ("timings_s", "elapsed_s", "policy_positions_per_s", "records", "shards")


@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def checkpoint(tiny_model, tmp_path_factory):
    from allie_jax.model.checkpoint import save_model

    return save_model(tiny_model, tmp_path_factory.mktemp("ckpt") / "model")


class FirstLegal:
    """A cheap stand-in for a search system: scores only the subsample, puts all its mass on the
    first legal move (so the plumbing of subsamples is tested without compiling a search)."""

    subsample = True
    info = {"kind": "test"}

    def __init__(self, name, ctx):
        self.name = name

    def score(self, pos):
        out = sysmod.Scores.empty(len(pos))
        human = pos.human_move()
        for p in range(len(pos)):
            legal = np.sort(pos.legal_ids(p))
            probs = np.zeros(1968)
            probs[legal[0]] = 1.0
            out.set_from_distribution(p, probs, legal, int(human[p]), all_tokens=False)
            out.num_sims[p] = 3
        return out


@pytest.fixture()
def firstlegal():
    sysmod.register("firstlegal", FirstLegal)
    yield
    sysmod._REGISTRY.pop("firstlegal")


def _run(model, pgn, out, **kw):
    base = dict(
        systems=("policy",), max_games=12, random_games=2, chunk_games=4, progress=False,
        plots=False,
    )  # fmt: skip
    return ev.evaluate(model, pgn, out, ev.EvalConfig(**{**base, **kw}))


def _strip(report: dict) -> dict:
    report = json.loads(json.dumps(report))
    for k in VOLATILE:
        report["meta"].pop(k, None)
    report["meta"]["config"].pop("num_shards")
    return report


def _pgn_games(path, n):
    with open_text(path) as f:
        out = []
        while len(out) < n and (g := chess.pgn.read_game(f)) is not None:
            if list(g.mainline()):
                out.append(g)
        return out


def test_records_hold_every_position_as_python_chess_sees_it(tiny_model, sample_pgn, tmp_path):
    _run(tiny_model, sample_pgn, tmp_path, max_games=5, chunk_games=2)
    recs = records.load_records(tmp_path)
    t = recs.human
    games = _pgn_games(sample_pgn, 5)
    assert t.num_rows == sum(len(list(g.mainline())) + 1 for g in games)
    by_id = {g.headers["Site"].rsplit("/", 1)[-1][:8]: g for g in games}
    rows = t.to_pylist()
    for r in rows:
        g = by_id[r["game_id"]]
        nodes = list(g.mainline())
        board = g.board()
        for node in nodes[: r["ply"]]:
            board.push(node.move)
        assert r["num_moves"] == len(nodes)
        assert r["white_elo"] == int(g.headers["WhiteElo"])
        assert r["time_control"] == g.headers["TimeControl"]
        assert r["in_check"] == board.is_check()
        assert r["num_legal"] == board.legal_moves.count()
        legal = {m.uci() for m in board.legal_moves}
        if r["ply"] < len(nodes):
            assert r["human_move"] == nodes[r["ply"]].move.uci()
            base = float(g.headers["TimeControl"].split("+")[0])
            want = base if r["ply"] < 2 else nodes[r["ply"] - 2].clock()
            assert r["clock_before"] == pytest.approx(want)
        else:
            assert r["human_move"] is None and r["policy.p_human"] is None
        assert r["policy.scored"] and set(r["policy.top_moves"]) <= legal
        assert len(r["policy.top_moves"]) == min(5, len(legal))
        probs = r["policy.top_probs"]
        assert probs == sorted(probs, reverse=True)
        if r["human_move"] in r["policy.top_moves"]:
            j = r["policy.top_moves"].index(r["human_move"])
            assert r["policy.p_human"] == pytest.approx(probs[j])
        assert -1.0 <= r["policy.value"] <= 1.0 and r["policy.num_sims"] == 0
    # every column is documented
    doc = (REPO / "docs" / "records.md").read_text()
    for name in t.column_names:
        field = name.split(".", 1)[-1]
        assert f"`{field}`" in doc, f"column {name} is not in docs/records.md"
    # a chunk file is plain Parquet
    chunk = next((tmp_path / "records").glob("shard-*/chunk-000000.parquet"))
    assert pq.read_table(chunk).num_rows > 0


def test_two_shards_merge_to_the_one_shard_run(tiny_model, sample_pgn, tmp_path, firstlegal):
    kw = dict(systems=("policy", "greedy", "firstlegal"), search_positions=7, max_games=10)
    one = _run(tiny_model, sample_pgn, tmp_path / "one", **kw)
    first = _run(tiny_model, sample_pgn, tmp_path / "two", num_shards=2, shard_index=0, **kw)
    assert first is None  # the other shard is missing: no report yet
    with pytest.raises(records.RecordsError, match=r"shards \[1\] of 2"):
        records.load_records(tmp_path / "two")
    two = _run(tiny_model, sample_pgn, tmp_path / "two", num_shards=2, shard_index=1, **kw)
    assert _strip(two) == _strip(one)
    a = records.load_records(tmp_path / "one").human
    b = records.load_records(tmp_path / "two").human
    assert a.equals(b)
    # both shards did work, and the subsample is exactly 7 positions, the same ones
    games = [
        records.read_table(p).column("game_id").to_pylist()
        for p in sorted((tmp_path / "two" / "records").glob("shard-*/chunk-*.parquet"))
    ]
    assert len(games) >= 2 and all(games)
    picked = a.filter(a.column("firstlegal.scored"))
    assert picked.num_rows == 7 and two["move_accuracy"]["firstlegal"]["positions"] == 7
    assert two["move_accuracy"]["firstlegal"]["mean_sims"] == 3
    assert two["move_accuracy"]["firstlegal"]["subsample"] is True


def test_search_positions_all_scores_every_protocol_position(tiny_model, sample_pgn, tmp_path,
                                                             firstlegal):  # fmt: skip
    report = _run(
        tiny_model, sample_pgn, tmp_path, systems=("policy", "firstlegal"),
        search_positions="all", max_games=4,
    )  # fmt: skip
    acc = report["move_accuracy"]
    assert acc["firstlegal"]["positions"] == acc["policy"]["positions"] > 0


def test_subsample_is_the_same_whatever_the_sharding(sample_pgn):
    from allie_jax.pgn import ParseStats

    def eligible(game):
        return np.arange(len(game.moves))

    games = list(stream.game_stream(sample_pgn, 30, ParseStats()))
    sel = stream.choose(games, eligible, 50, salt="search", seed=3)
    picked = {
        (g.game_id, int(i)) for g in games for i in eligible(g)[sel.picks(g.game_id, eligible(g))]
    }
    assert len(picked) == 50
    union = set()
    for k in range(3):
        for _, chunk in stream.chunks(iter(games), 3, k, 4):
            for g in chunk:
                assert stream.shard_of(g.game_id, 3) == k
                union |= {
                    (g.game_id, int(i)) for i in eligible(g)[sel.picks(g.game_id, eligible(g))]
                }
    assert union == picked
    assert stream.choose(games, eligible, None, salt="s", seed=0).threshold is None
    assert stream.choose(games, eligible, 0, salt="s", seed=0).picks("x", np.arange(3)).sum() == 0


def test_sigkilled_run_resumes_to_identical_records(checkpoint, sample_pgn, tmp_path):
    from allie_jax.model.checkpoint import load_model

    flags = dict(systems=("policy",), max_games=24, chunk_games=2, random_games=2)
    ref = tmp_path / "ref"
    _run(load_model(checkpoint), sample_pgn, ref, **flags)  # uninterrupted
    out = tmp_path / "killed"
    cmd = [
        sys.executable, "-m", "launch.evaluate", f"--checkpoint={checkpoint}",
        f"--games={sample_pgn}", f"--output={out}", "--systems=policy", "--max_games=24",
        "--chunk_games=2", "--random_games=2", "--noplots",
    ]  # fmt: skip
    manifest = out / "records" / "shard-00000-of-00001" / "manifest.json"
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if manifest.exists() and len(json.loads(manifest.read_text())["chunks"]) >= 3:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    state = json.loads(manifest.read_text())
    assert not state["complete"] and 3 <= len(state["chunks"]) < 12
    (manifest.parent / "chunk-000099.parquet").write_bytes(b"half-written")  # a stray file
    # the restart (in this process: the same checkpoint path and flags, so the same job)
    cfg = ev.EvalConfig(
        systems=("policy",), max_games=24, chunk_games=2, random_games=2, progress=False,
        plots=False,
    )  # fmt: skip
    ev.evaluate(str(checkpoint), sample_pgn, out, cfg)
    got = sorted(p.name for p in manifest.parent.glob("*.parquet"))
    want = sorted(p.name for p in (ref / "records" / "shard-00000-of-00001").glob("*.parquet"))
    assert got == want and len(want) == 13  # 12 chunks + the random games
    for name in want:
        a = (manifest.parent / name).read_bytes()
        b = (ref / "records" / "shard-00000-of-00001" / name).read_bytes()
        assert a == b, name
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["games"] == 24


def test_restart_with_other_settings_is_refused(tiny_model, sample_pgn, tmp_path):
    _run(tiny_model, sample_pgn, tmp_path, max_games=2, random_games=0)
    with pytest.raises(records.RecordsError, match="another job.*max_games"):
        _run(tiny_model, sample_pgn, tmp_path, max_games=3, random_games=0)
    with pytest.raises(records.RecordsError, match="no evaluation records"):
        records.load_records(tmp_path / "nothing")
    # the same flags on a games file whose content changed: the committed chunks are refused
    games = [str(g) for g in _pgn_games(sample_pgn, 4)]
    pgn = tmp_path / "games.pgn"
    pgn.write_text("\n\n".join(games[:2]) + "\n")
    _run(tiny_model, pgn, tmp_path / "changed", max_games=2, chunk_games=1, random_games=0)
    pgn.write_text("\n\n".join(games[2:]) + "\n")
    with pytest.raises(records.RecordsError, match="games_file"):  # identity is the content
        _run(tiny_model, pgn, tmp_path / "changed", max_games=2, chunk_games=1, random_games=0)


def test_filter_expressions():
    t = pa.table(
        {
            "white_elo": pa.array([1500, 2100, None, 2400], pa.int32()),
            "time_control": ["180+0", "60+0", "180+0", "180+0"],
            "policy.p_human": [0.1, 0.5, 0.9, None],
        }
    )
    cases = {
        "white_elo >= 2000": [1, 3],
        "white_elo >= 2000 and time_control == '180+0'": [3],
        "not (white_elo < 2000) or white_elo is None": [1, 2, 3],
        "time_control in ['60+0', '300+0']": [1],
        "1000 < white_elo < 2200": [0, 1],
        "policy.p_human > 0.4": [1, 2],
        "white_elo is not None and white_elo - 100 >= 2000": [1, 3],
    }
    for expr, want in cases.items():
        idx = pa.array(np.arange(t.num_rows))
        got = t.append_column("i", idx).filter(records.parse_filter(expr)).column("i").to_pylist()
        assert got == want, expr
    for bad in ("white_elo >=", "__import__('os')", "white_elo ** 2 > 1"):
        with pytest.raises(ValueError, match="--filter"):
            records.parse_filter(bad)


@pytest.mark.slow
def test_jax_distributed_processes_take_their_own_shards(checkpoint, sample_pgn, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "dist"
    base = [
        sys.executable, "-m", "launch.evaluate", f"--checkpoint={checkpoint}",
        f"--games={sample_pgn}", f"--output={out}", "--systems=policy", "--max_games=10",
        "--chunk_games=3", "--random_games=2", "--noplots", "--distributed",
        f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*base, f"--process_id={k}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for k in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    shards = sorted(p.parent.name for p in (out / "records").glob("shard-*/manifest.json"))
    assert shards == ["shard-00000-of-00002", "shard-00001-of-00002"]
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["shards"] == 2 and report["meta"]["games"] == 10
    one = _run(str(checkpoint), sample_pgn, tmp_path / "one", max_games=10, chunk_games=3)
    assert _strip(report) == _strip(ev._jsonable(one))


def test_a_run_without_an_allie_model(sample_pgn, tmp_path, firstlegal):
    """Systems that need no Allie checkpoint (Maia) run alone: no policy pass, no Allie blocks."""
    report = _run(None, sample_pgn, tmp_path, systems=("firstlegal",), search_positions="all",
                  max_games=3)  # fmt: skip
    block = report["move_accuracy"]["firstlegal"]
    assert block["positions"] == _protocol_positions(sample_pgn, 3) > 0
    assert "paired" not in block and report["paired"] == [] and block["overall"]["games"] == 3
    assert "legal" not in report and report["meta"]["checkpoint"] is None
    with pytest.raises(ValueError, match="needs an Allie checkpoint"):
        _run(None, sample_pgn, tmp_path / "x", systems=("policy",), max_games=1)


def _protocol_positions(pgn, n):
    count = 0
    for g in _pgn_games(pgn, n):
        nodes = list(g.mainline())
        base = float(g.headers["TimeControl"].split("+")[0])
        for i in range(10, len(nodes)):
            before = base if i < 2 else nodes[i - 2].clock()
            count += not (before is not None and before < 30)
    return count
