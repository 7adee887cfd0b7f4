"""The prepare command: every game accounted for, deterministic splits and shards."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from allie_jax import pgn
from allie_jax.data import prepare, records, shards

REPO = pathlib.Path(__file__).resolve().parents[1]
ARENA = REPO / "data" / "sample" / "lichess_arenas_sample_noclk.pgn.zst"


@pytest.fixture(scope="module")
def arena(tmp_path_factory) -> pathlib.Path:
    """The first 600 bundled no-clock arena games (keeps these tests fast)."""
    text = "".join(pgn.RawGame.text(g) + "\n" for g in _first_games(ARENA, 600))
    path = tmp_path_factory.mktemp("arena") / "arena600.pgn"
    path.write_text(text)
    return path


def _first_games(path, n):
    out = []
    for g in pgn.split_games(pgn._lines(path)):
        out.append(g)
        if len(out) == n:
            return out
    return out


def _config(**kw):
    return prepare.PrepareConfig(val_frac=0.05, test_frac=0.05, **kw)


def _all_records(out):
    return {
        s: [r for p in sorted((out / s).glob("*.array_record")) for r in shards.read_records(p)]
        for s in shards.SPLITS
    }


def test_every_game_accounted_for(tmp_path, sample_pgn, arena):
    stats = prepare.prepare([str(sample_pgn), str(arena)], tmp_path, _config(events="all"))
    on_disk = json.loads((tmp_path / "stats.json").read_text())
    assert on_disk == stats
    assert stats["games_read"] == 999 + 600
    assert stats["games_read"] == stats["games_written"] + sum(stats["dropped"].values())
    recs = _all_records(tmp_path)
    assert {s: len(r) for s, r in recs.items()} == {
        s: v["games"] for s, v in stats["per_split"].items()
    }
    assert sum(stats["elo_histogram"].values()) == stats["games_written"]
    games = [records.deserialize_game(r) for rs in recs.values() for r in rs]
    assert all(len(g.moves) >= 9 for g in games)
    for split, rs in recs.items():
        for r in rs:
            g = records.deserialize_game(r)
            assert shards.assign_split(g.game_id, seed=0, val_frac=0.05, test_frac=0.05) == split
    # The reader's own count of parse failures matches.
    ps = pgn.ParseStats()
    list(pgn.read_games(sample_pgn, stats=ps))
    assert ps.dropped == {"no_moves": 13}


def test_blitz_filter_and_clocks(tmp_path, sample_pgn):
    stats = prepare.prepare([str(sample_pgn)], tmp_path, _config(require_clocks=True))
    d = stats["dropped"]
    assert d["not_blitz"] > 300 and "no_clocks" not in d
    games = [records.deserialize_game(r) for rs in _all_records(tmp_path).values() for r in rs]
    for g in games:
        base, inc = pgn.parse_time_control(g.time_control)
        assert 179 <= base + 40 * inc < 479
        assert g.clocks is not None
    assert stats["games_read"] == stats["games_written"] + sum(d.values())


def test_workers_and_input_order_do_not_change_output(tmp_path, sample_pgn):
    a = prepare.prepare([str(sample_pgn)], tmp_path / "a", _config(events="all"), workers=1)
    b = prepare.prepare([str(sample_pgn)], tmp_path / "b", _config(events="all"), workers=2)
    assert a["per_split"] == b["per_split"] and a["dropped"] == b["dropped"]
    assert _all_records(tmp_path / "a") == _all_records(tmp_path / "b")


def test_elo_balance(tmp_path, arena):
    plain = prepare.prepare([str(arena)], tmp_path / "p", _config(events="all"))
    bal = prepare.prepare([str(arena)], tmp_path / "b", _config(events="all", elo_balance=True))
    assert bal["dropped"]["elo_balance"] > 0
    assert bal["games_written"] + bal["dropped"]["elo_balance"] == plain["games_written"]
    hist = {k: v for k, v in bal["elo_histogram"].items() if k != "none"}
    median = sorted(plain["elo_histogram"].values())[len(plain["elo_histogram"]) // 2]
    assert max(hist.values()) < 1.5 * median
    # A histogram file gives the same result as the header pass here.
    f = tmp_path / "keep.json"
    f.write_text(json.dumps(bal["elo_balance"]))
    again = prepare.prepare(
        [str(arena)],
        tmp_path / "f",
        _config(events="all", elo_balance=True, elo_balance_file=str(f)),
    )
    assert again["per_split"] == bal["per_split"]


def test_missing_input_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        prepare.prepare([str(tmp_path / "nothing_here*.pgn")], tmp_path / "o")


def test_command_line(tmp_path, sample_pgn):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.prepare_data",
            "--input",
            str(sample_pgn),
            "--output",
            str(out),
            "--events",
            "all",
            "--val_frac",
            "0.1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["games_read"] == 999 and stats["per_split"]["val"]["games"] > 50
