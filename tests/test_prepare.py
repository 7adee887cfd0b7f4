"""The prepare command: every game accounted for, deterministic splits and shards."""

from __future__ import annotations

import collections
import io
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


@pytest.fixture(scope="module")
def small_pgn(tmp_path_factory, sample_pgn) -> pathlib.Path:
    """The first 40 bundled games with clocks (a valid input that costs nothing to prepare)."""
    text = "".join(pgn.RawGame.text(g) + "\n" for g in _first_games(sample_pgn, 40))
    path = tmp_path_factory.mktemp("small") / "small40.pgn"
    path.write_text(text)
    return path


def _first_games(path, n):
    out = []
    for g in pgn.split_games(pgn.lines(path)):
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


def _record_sets(out):
    return {s: collections.Counter(r) for s, r in _all_records(out).items()}


def test_workers_do_not_change_output(tmp_path, small_pgn, arena, monkeypatch):
    """Small blocks (many cuts), 1 and 3 workers: the same records in every split; a given
    worker count writes byte-identical shards run after run."""
    monkeypatch.setattr(prepare, "BLOCK_BYTES", 20_000)
    inputs = [str(small_pgn), str(arena)]
    a = prepare.prepare(inputs, tmp_path / "a", _config(events="all"), workers=1)
    b = prepare.prepare(inputs, tmp_path / "b", _config(events="all"), workers=3)
    prepare.prepare(inputs, tmp_path / "c", _config(events="all"), workers=3)
    assert a["per_split"] == b["per_split"] and a["dropped"] == b["dropped"]
    assert _record_sets(tmp_path / "a") == _record_sets(tmp_path / "b")
    assert _all_records(tmp_path / "b") == _all_records(tmp_path / "c")
    assert len(list((tmp_path / "b" / "train").glob("*.array_record"))) == 3  # each wrote


def test_blocks_cut_only_between_games(sample_pgn, arena):
    """The games of the blocks are the games the sequential splitter finds, in order."""

    def key(raw):
        return (raw.header_lines, raw.move_lines, raw.complete)

    for path in (sample_pgn, arena):
        whole = [key(g) for g in pgn.split_games(pgn.lines(path))]
        for size in (1, 3_000, 40_000):
            blocks = list(prepare.pgn_blocks(str(path), 0, pgn.InputStatus(), block_bytes=size))
            assert len(blocks) > (1 if size < 100_000 else 0)
            games = [
                key(g)
                for b in blocks
                for g in pgn.split_games(iter(pgn.text_from_bytes([b.payload]).readline, ""))
            ]
            assert games == whole, (path, size)


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


def test_blocks_cut_only_between_games_on_mangled_text(tmp_path, small_pgn):
    """Damaged PGN (lines dropped, doubled, blank lines added, CRLF, comments opened) still
    splits into the same games with a cut at every possible boundary."""
    import random

    lines = small_pgn.read_text().splitlines(keepends=True)
    rng = random.Random(0)
    for trial in range(40):
        out = []
        for line in lines:
            r = rng.random()
            if r < 0.03:
                continue
            if r < 0.06:
                out.append(line)
            elif r < 0.09:
                out.append("\n")
            elif r < 0.11:
                out.append("{ open comment\n")
            out.append(line)
        text = "".join(out)
        if trial % 2:
            text = text.replace("\n", "\r\n")
        path = tmp_path / f"m{trial}.pgn"
        path.write_bytes(text.encode())
        whole = [
            (g.header_lines, g.move_lines, g.complete) for g in pgn.split_games(pgn.lines(path))
        ]
        blocks = prepare.pgn_blocks(str(path), 0, pgn.InputStatus(), block_bytes=1)
        games = [
            (g.header_lines, g.move_lines, g.complete)
            for b in blocks
            for g in pgn.split_games(iter(pgn.text_from_bytes([b.payload]).readline, ""))
        ]
        assert games == whole, trial


# --- bad and cut inputs, all-or-nothing output ------------------------------------------------


def _cut_zst(src: pathlib.Path, dst: pathlib.Path, keep_bytes: int) -> bytes:
    """A copy of the first bytes of a .zst file (a cut download); returns the text before the
    cut as the decoder sees it."""
    dst.write_bytes(src.read_bytes()[:keep_bytes])
    return b"".join(pgn.iter_bytes(str(dst)))


def test_cut_zst_is_reported_and_keeps_every_complete_game(tmp_path, sample_pgn, caplog):
    cut = tmp_path / "cut.pgn.zst"
    text = _cut_zst(sample_pgn, cut, 200_000)
    # The reference: the complete games before the cut, as a plain file.
    raws = list(pgn.split_games(pgn.lines(io.StringIO(text.decode()))))
    complete = tmp_path / "complete.pgn"
    complete.write_text("".join(r.text() + "\n" for r in raws[:-1]))
    with caplog.at_level("WARNING"):
        stats = prepare.prepare([str(cut)], tmp_path / "o", _config(events="all"))
    assert "cut short" in caplog.text and str(cut) in caplog.text
    assert stats["inputs_truncated"] == [str(cut)]
    assert stats["dropped"]["truncated"] == 1
    ref = prepare.prepare([str(complete)], tmp_path / "ref", _config(events="all"))
    assert stats["games_read"] == ref["games_read"] + 1
    assert _record_sets(tmp_path / "o") == _record_sets(tmp_path / "ref")


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("empty.pgn", b"", "no readable game in .*empty.pgn"),
        ("junk.pgn.zst", b"this is not zstd at all", "junk.pgn.zst.*not valid zstd"),
        ("words.pgn", b"hello\nworld\n", "no readable game in .*words.pgn"),
        ("aborted.pgn", b'[Event "x"]\n[Result "*"]\n\n*\n', "no readable game"),
    ],
)
def test_unusable_input_fails_and_writes_nothing(tmp_path, small_pgn, name, content, match):
    bad = tmp_path / name
    bad.write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises((prepare.PrepareError, pgn.PGNError), match=match):
        prepare.prepare([str(small_pgn), str(bad)], out, _config(events="all"))
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no staging folder left behind


def test_failed_run_leaves_previous_output_intact(tmp_path, small_pgn):
    out = tmp_path / "out"
    first = prepare.prepare([str(small_pgn)], out, _config(events="all"))
    before = _all_records(out)
    (tmp_path / "bad.pgn").write_text("nothing")
    with pytest.raises(prepare.PrepareError):
        prepare.prepare([str(tmp_path / "bad.pgn")], out, _config(events="all"))
    assert json.loads((out / "stats.json").read_text()) == first
    assert _all_records(out) == before
    # A successful re-run replaces the earlier shards (none left behind).
    prepare.prepare([str(small_pgn)], out, _config(events="all", records_per_shard=10_000))
    assert _all_records(out) == before


# --- small inputs get real val / test splits ---------------------------------------------------


def test_small_input_gets_minimum_val_and_test(tmp_path, arena):
    config = prepare.PrepareConfig(events="all")  # the defaults: val 1e-4, test 2e-4
    stats = prepare.prepare([str(arena)], tmp_path, config)
    n = stats["games_written"]
    want = min(config.min_split_games, int(0.05 * n))
    assert want >= 25
    assert stats["per_split"]["val"]["games"] == want
    assert stats["per_split"]["test"]["games"] == want
    assert stats["split_minimums_moved"] == {"val": want, "test": want}
    recs = _all_records(tmp_path)
    assert {s: len(r) for s, r in recs.items()} == {
        s: v["games"] for s, v in stats["per_split"].items()
    }
    hashes = {
        s: [shards.split_hash(records.deserialize_game(r).game_id) for r in rs]
        for s, rs in recs.items()
    }
    # test holds the lowest split hashes, then val, then train: the order of assign_split.
    assert max(hashes["test"]) < min(hashes["val"]) and max(hashes["val"]) < min(hashes["train"])
    off = prepare.prepare(
        [str(arena)], tmp_path / "off", prepare.PrepareConfig(events="all", min_split_games=0)
    )
    assert off["per_split"]["val"]["games"] + off["per_split"]["test"]["games"] < 5
    assert off["games_written"] == n


# --- released flat files ------------------------------------------------------------------------


def test_released_bin_input(tmp_path, small_pgn):
    from allie_jax.data import flat_uint32

    games = list(pgn.read_games(small_pgn))
    bin_path = tmp_path / "released.bin"
    flat_uint32.write_flat([g for g in games if g.result is not None], bin_path)
    expected = list(flat_uint32.read_flat(bin_path))
    config = _config(events="all", input_format="released_bin", min_plies=1)
    stats = prepare.prepare([str(bin_path)], tmp_path / "o", config, workers=2)
    assert stats["games_read"] == len(expected) and stats["games_written"] == len(expected)
    back = [records.deserialize_game(r) for rs in _all_records(tmp_path / "o").values() for r in rs]
    key = lambda g: (g.moves, g.white_elo, g.think_times)  # noqa: E731
    for g in back:
        assert g.game_id.startswith("flat:")
    got = sorted((key(g) for g in back), key=repr)
    assert got == sorted((key(g) for g in expected), key=repr)
    # A cut file: the complete games are kept, the cut one is counted.
    cut = tmp_path / "cut.bin"
    cut.write_bytes(bin_path.read_bytes()[:-8])
    stats = prepare.prepare([str(cut)], tmp_path / "c", config)
    assert stats["inputs_truncated"] == [str(cut)]
    assert stats["dropped"] == {"truncated": 1}
    assert stats["games_written"] == len(expected) - 1


# --- remote paths through etils.epath ------------------------------------------------------------


def test_prepare_and_read_on_gs_path(tmp_path, small_pgn, monkeypatch):
    """gs:// in and out (an in-memory fsspec filesystem behind etils.epath's real gs:// code)."""
    from etils import epath

    from allie_jax.data import pipeline
    from tests.support.memory_fs import memory_gcs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALLIE_JAX_CACHE", str(tmp_path / "cache"))
    with memory_gcs():
        src = epath.Path("gs://bucket/in/games.pgn")
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(small_pgn.read_bytes())
        stats = prepare.prepare(["gs://bucket/in/*.pgn"], "gs://bucket/out", _config(events="all"))
        assert stats["inputs"] == ["gs://bucket/in/games.pgn"]
        out = epath.Path("gs://bucket/out")
        assert json.loads((out / "stats.json").read_text()) == stats
        local = prepare.prepare([str(small_pgn)], tmp_path / "local", _config(events="all"))
        assert local["per_split"] == stats["per_split"]
        batch = next(pipeline.make_iterator("gs://bucket/out", "train", batch_size=2, seq_len=64))
        assert batch["inputs"].shape == (2, 64)
        with pytest.raises(prepare.PrepareError, match="gs://bucket/in/bad.pgn"):
            (src.parent / "bad.pgn").write_text("no games")
            prepare.prepare(["gs://bucket/in/bad.pgn"], "gs://bucket/out2", _config())
        assert not epath.Path("gs://bucket/out2").exists()
    assert not (tmp_path / "gs:").exists()


# --- the command line: one clear line per user error ---------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [(None, "no input file matches"), (b"", "no readable game"), (b"junk", "not valid zstd")],
)
def test_command_line_user_errors(tmp_path, content, message):
    path = tmp_path / "in.pgn.zst"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.prepare_data", "--input", str(path), "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare_data: error:"), proc.stderr
    assert message in lines[0] and str(path) in lines[0]
    assert not out.exists()
