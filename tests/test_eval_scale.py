"""The streamed report at scale: records of synthetic games with known answers, built into a report
one chunk at a time. The default test uses 200,000 rows; the slow one 10,000,000 in a child
process whose peak RSS and seconds it prints (``python tests/test_eval_scale.py ROWS`` measures
the same outside pytest)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PLIES = 80  # positions per synthetic game (ply 0..79 moves + the final board)


def write_synthetic(root: pathlib.Path, rows: int, *, chunk_rows: int = 1_000_000, seed: int = 0):
    """A one-shard records directory of ``rows`` synthetic positions (policy on every row, a
    ``search`` system on every 7th move-matching row); returns the true counts."""
    rng = np.random.default_rng(seed)
    games = rows // (PLIES + 1)
    shard = root / "shard-00000-of-00001"
    shard.mkdir(parents=True)
    skill = rng.uniform(0.2, 0.7, games)
    truth = {"policy_hits": 0, "search_hits": 0, "pair_diff": 0, "pair_n": 0, "proto": 0}
    chunks = []
    per_chunk = max(1, chunk_rows // (PLIES + 1))
    for ci, g0 in enumerate(range(0, games, per_chunk)):
        g = np.arange(g0, min(g0 + per_chunk, games))
        n = g.size * (PLIES + 1)
        gid = np.repeat(g, PLIES + 1)
        ply = np.tile(np.arange(PLIES + 1), g.size).astype(np.int32)
        moving = ply < PLIES
        hit = (rng.random(n) < skill[gid]) & moving
        searched = moving & (ply >= 10) & (rng.random(n) < 1 / 7)
        shit = (rng.random(n) < skill[gid] + 0.05) & searched
        proto = moving & (ply >= 10)
        truth["policy_hits"] += int((hit & proto).sum())
        truth["proto"] += int(proto.sum())
        truth["search_hits"] += int(shit.sum())
        truth["pair_diff"] += int(shit.sum()) - int((hit & searched).sum())
        truth["pair_n"] += int(searched.sum())
        elo = (1000 + (g * 37) % 1500).astype(np.int32)
        human = np.where(moving, "e2e4", None)
        table = pa.table(
            {
                "game_id": pa.array([f"g{x:08d}" for x in gid]),
                "ply": pa.array(ply),
                "num_moves": pa.array(np.full(n, PLIES, np.int32)),
                "white_elo": pa.array(np.repeat(elo, PLIES + 1)),
                "black_elo": pa.array(np.repeat(elo + 50, PLIES + 1)),
                "clock_before": pa.array(np.where(moving, 100.0, np.nan), mask=~moving),
                "human_move": pa.array(human, pa.string()),
                "human_think_time": pa.array(
                    rng.exponential(5.0, n).astype(np.float32), mask=~moving
                ),
                "in_check": pa.array(rng.random(n) < 0.05),
                "num_legal": pa.array(np.full(n, 30, np.int32)),
                **{k: pa.array(np.zeros(n, bool)) for k in SPECIAL},
                "result": pa.array(np.repeat(rng.choice([-1.0, 0.0, 1.0], g.size), PLIES + 1)),
                "resigned": pa.array(np.zeros(n, bool)),
                "loser_to_move": pa.array(np.zeros(n, bool)),
                "policy.scored": pa.array(np.ones(n, bool)),
                "policy.top1": pa.array(np.where(hit, "e2e4", "d2d4")),
                "policy.p_human": pa.array(
                    np.where(hit, 0.6, 0.1).astype(np.float32), mask=~moving
                ),
                "policy.think_time": pa.array(rng.exponential(5.0, n).astype(np.float32)),
                "policy.value": pa.array(rng.uniform(-1, 1, n).astype(np.float32)),
                "policy.top_legal": pa.array(np.ones(n, bool)),
                "policy.invalid_mass": pa.array(np.full(n, 0.01, np.float32)),
                "policy.resign": pa.array(np.zeros(n, bool)),
                "search.scored": pa.array(searched),
                "search.top1": pa.array(np.where(shit, "e2e4", "d2d4"), mask=~searched),
                "search.p_human": pa.array(
                    np.where(shit, 0.7, 0.1).astype(np.float32), mask=~searched
                ),
                "search.num_sims": pa.array(np.full(n, 50, np.int32), mask=~searched),
            }
        )
        name = f"chunk-{ci:06d}.parquet"
        pq.write_table(table, shard / name, compression="zstd")
        chunks.append({"file": name, "rows": n, "games": int(g.size)})
    config = {"seed": 0, "min_ply": 10, "min_clock": 30.0, "stockfish_nodes": 0}
    manifest = {
        "format": 1,
        "shard_index": 0,
        "num_shards": 1,
        "complete": True,
        "chunks": chunks,
        "extras": {},
        "job": {
            "checkpoint": None,
            "games_file": "synthetic",
            "config": config,
            "systems": ["policy", "search"],
            "record_systems": ["policy", "search"],
            "system_info": {"search": {"subsample": True}},
        },
    }
    (shard / "manifest.json").write_text(json.dumps(manifest))
    truth["games"] = games
    return truth


SPECIAL = ("castling", "en_passant", "promotion", "threefold")


def _check(report: dict, truth: dict) -> None:
    acc = report["move_accuracy"]
    assert acc["policy"]["overall"]["n"] == truth["proto"]
    assert acc["policy"]["overall"]["successes"] == truth["policy_hits"]
    assert acc["policy"]["overall"]["games"] == truth["games"]
    assert acc["search"]["overall"]["successes"] == truth["search_hits"]
    (pair,) = report["paired"]
    assert (pair["system"], pair["baseline"], pair["positions"]) == (
        "search",
        "policy",
        truth["pair_n"],
    )
    assert pair["difference"] == pytest.approx(truth["pair_diff"] / truth["pair_n"])
    assert pair["ci_low"] < pair["difference"] < pair["ci_high"]
    assert report["meta"]["games"] == truth["games"] and not report["warnings"]


def test_streamed_report_of_synthetic_records(tmp_path):
    from allie_jax.eval.summarize import stream_report

    truth = write_synthetic(tmp_path, 200_000, chunk_rows=30_000)
    report = stream_report(tmp_path, num_resamples=200)
    _check(report, truth)


@pytest.mark.slow
def test_report_of_ten_million_rows(tmp_path):
    """10M positions: the child builds the report; its peak RSS and seconds are printed."""
    out = subprocess.run(
        [sys.executable, __file__, "10000000", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=3000,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["ok"] and row["rows"] >= 9_900_000


def main(rows: int, where: str) -> None:
    import resource

    from allie_jax.eval.summarize import stream_report

    root = pathlib.Path(where) / "records"
    if rows < 0:  # the writer's own process, so the report's peak RSS is the report's alone
        print(json.dumps(write_synthetic(root, -rows)))
        return
    gen = subprocess.run(
        [sys.executable, __file__, str(-rows), where], capture_output=True, text=True, check=True
    )
    truth = json.loads(gen.stdout.strip().splitlines()[-1])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    t = time.perf_counter()
    cpu = time.process_time()
    report = stream_report(root)
    seconds = time.perf_counter() - t
    cpu = time.process_time() - cpu
    _check(report, truth)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    row = {
        "ok": True,
        "rows": truth["games"] * (PLIES + 1),
        "games": truth["games"],
        "report_s": round(seconds, 1),
        "report_cpu_s": round(cpu, 1),
        "peak_rss_mib": peak,
        "peak_rss_before_report_mib": before,
        "loadavg": " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3]),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
