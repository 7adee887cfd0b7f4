"""The byte-offset index: one pass gives every game's bytes (checked against python-chess and the
streaming reader), the digest of the file, and the same subsample as a streaming pass; tasks
that read only their share write the same records as tasks that stream the whole input."""

from __future__ import annotations

import hashlib
import importlib
import json

import chess.pgn
import numpy as np
import pytest
from etils import epath

from allie_jax.eval import game_index, stream
from allie_jax.eval import systems as sysmod
from allie_jax.pgn import ParseStats, open_text, read_games

ev = importlib.import_module("allie_jax.eval.evaluate")


@pytest.fixture(scope="module")
def plain_pgn(sample_pgn, tmp_path_factory):
    path = tmp_path_factory.mktemp("games") / "games.pgn"
    with open_text(sample_pgn) as f:
        path.write_text(f.read())
    return path


def _eligible(game):
    return np.arange(10, len(game.moves))


def test_one_pass_gives_offsets_digest_and_the_subsample(plain_pgn):
    spec = game_index.SubsampleSpec(("search",), "search", _eligible, 25)
    index = game_index.build(plain_pgn, 30, [spec], seed=3)
    data = plain_pgn.read_bytes()
    assert index.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert index.meta["bytes"] == len(data)
    streamed = list(stream.game_stream(plain_pgn, 30, ParseStats()))
    assert index.game_ids == [g.game_id for g in streamed]
    for i in (0, 7, 29):  # each slice is one whole game, as python-chess reads it
        piece = data[index.offsets[i] : index.offsets[i] + index.lengths[i]].decode()
        assert piece.startswith("[")
        game = chess.pgn.read_game(__import__("io").StringIO(piece))
        assert [m.uci() for m in game.mainline_moves()] == streamed[i].moves
    want = stream.choose(iter(streamed), _eligible, 25, salt="search", seed=3)
    assert index.selections()["search"] == want
    # a shard's games, read at their offsets: the stream's games of that shard, fewer bytes
    games, count = game_index.shard_games(plain_pgn, index, 4, 1, ParseStats())
    mine = [g for g in streamed if stream.shard_of(g.game_id, 4) == 1]
    assert [g.moves for g in games] == [g.moves for g in mine] and mine
    assert count() == sum(int(index.lengths[i]) for i, g in enumerate(streamed)
                          if stream.shard_of(g.game_id, 4) == 1)  # fmt: skip
    assert count() < len(data) / 2


class _First:
    subsample = False
    info: dict = {}

    def __init__(self, name, ctx):
        self.name = name

    def score(self, pos):
        out = sysmod.Scores.empty(len(pos))
        for p in range(len(pos)):
            legal = np.sort(pos.legal_ids(p))
            if legal.size:
                probs = np.zeros(1968)
                probs[legal[0]] = 1.0
                out.set_from_distribution(p, probs, legal, -1, all_tokens=False)
        return out


def test_indexed_tasks_write_the_streamed_records(plain_pgn, tmp_path):
    sysmod.register("first", _First)
    try:
        base = dict(systems=("first",), max_games=20, chunk_games=3, random_games=0,
                    progress=False, plots=False, num_shards=2)  # fmt: skip
        for k in range(2):
            ev.evaluate(None, plain_pgn, tmp_path / "idx", ev.EvalConfig(**base, shard_index=k))
            ev.evaluate(None, plain_pgn, tmp_path / "str",
                        ev.EvalConfig(**base, shard_index=k, index_dir="none"))  # fmt: skip
    finally:
        sysmod._REGISTRY.pop("first")
    total = plain_pgn.stat().st_size
    for k in range(2):
        name = f"records/shard-0000{k}-of-00002/manifest.json"
        a = json.loads(epath.Path(tmp_path / "idx" / name).read_text())
        b = json.loads(epath.Path(tmp_path / "str" / name).read_text())
        assert [c["sha256"] for c in a["chunks"]] == [c["sha256"] for c in b["chunks"]]
        assert a["job"] == b["job"] and a["parse"] == b["parse"]
        read = a["input_bytes_read"]
        assert read["index_built"] == (k == 0)  # the second task reads the first's index
        assert read["games"] < total
    one = ev.report_from_records(tmp_path / "idx" / "records")
    two = ev.report_from_records(tmp_path / "str" / "records")
    assert one["move_accuracy"] == two["move_accuracy"]


def test_a_compressed_input_is_indexed_through_a_seekable_copy(sample_pgn, tmp_path):
    """One pass over a .zst: the digest is of the compressed bytes (the file the user has), the
    copy holds each indexed game as its own zstd frame, and a game read back at its offset is the
    game python-chess reads from the original."""
    import io

    import zstandard

    spec = game_index.SubsampleSpec(("search",), "search", _eligible, 25)
    index = game_index.build(sample_pgn, 30, [spec], seed=3, where=epath.Path(tmp_path))
    raw = sample_pgn.read_bytes()
    assert index.digest == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert index.meta["bytes"] == len(raw)
    streamed = list(stream.game_stream(sample_pgn, 30, ParseStats()))
    assert index.game_ids == [g.game_id for g in streamed]
    copy = (tmp_path / game_index.COPY).read_bytes()
    assert index.meta["copy_bytes"] == len(copy) == int(index.lengths.sum())
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read().decode()
    reference = chess.pgn.read_game(io.StringIO(plain))  # the first game of the original
    first = zstandard.ZstdDecompressor().decompress(copy[: index.lengths[0]]).decode()
    game = chess.pgn.read_game(io.StringIO(first))
    assert [m.uci() for m in game.mainline_moves()] == [m.uci() for m in reference.mainline_moves()]
    assert dict(game.headers) == dict(reference.headers)
    # the whole copy is one valid zstd stream of the kept games, in input order
    whole = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(copy), read_across_frames=True)
    kept = list(read_games(io.StringIO(whole.read().decode()), stats=ParseStats()))
    assert [g.game_id for g in kept] == index.game_ids
    want = stream.choose(iter(streamed), _eligible, 25, salt="search", seed=3)
    assert index.selections()["search"] == want
    games, count = game_index.shard_games(sample_pgn, index, 4, 2, ParseStats())
    mine = [g for g in streamed if stream.shard_of(g.game_id, 4) == 2]
    assert [g.moves for g in games] == [g.moves for g in mine] and mine
    assert count() == sum(int(index.lengths[i]) for i, g in enumerate(streamed)
                          if stream.shard_of(g.game_id, 4) == 2)  # fmt: skip


def test_a_bz2_input_is_indexed_too(plain_pgn, tmp_path):
    import bz2

    data = plain_pgn.read_bytes()
    packed = tmp_path / "games.pgn.bz2"
    packed.write_bytes(bz2.compress(data))
    index = game_index.build(packed, 12, [], seed=0, where=epath.Path(tmp_path / "index"))
    assert index.digest == "sha256:" + hashlib.sha256(packed.read_bytes()).hexdigest()
    streamed = list(stream.game_stream(plain_pgn, 12, ParseStats()))
    assert index.game_ids == [g.game_id for g in streamed]
    games, _ = game_index.shard_games(packed, index, 1, 0, ParseStats())
    assert [g.moves for g in games] == [g.moves for g in streamed]


def _strip(report: dict) -> dict:
    for key in ("timings_s", "elapsed_s", "records", "shards", "games_file", "plots"):
        report["meta"].pop(key, None)
    report["meta"]["config"].pop("num_shards", None)
    return report


def test_four_tasks_on_a_zst_read_only_their_share(sample_pgn, tmp_path):
    """4 tasks of one job on the bundled .zst: the first prepares the index and copy, the others
    read the index and their own games' frames (together: the copy once), and the merged report
    equals one process streaming the whole input."""
    sysmod.register("first", _First)
    try:
        base = dict(systems=("first",), max_games=60, chunk_games=5, random_games=0,
                    progress=False, plots=False)  # fmt: skip
        for k in range(4):
            ev.evaluate(None, sample_pgn, tmp_path / "job",
                        ev.EvalConfig(**base, num_shards=4, shard_index=k))  # fmt: skip
        single = ev.evaluate(None, sample_pgn, tmp_path / "one",
                             ev.EvalConfig(**base, index_dir="none"))  # fmt: skip
    finally:
        sysmod._REGISTRY.pop("first")
    merged = json.loads((tmp_path / "job" / "report.json").read_text())
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    assert single is not None and _strip(merged) == _strip(one)
    meta = json.loads((tmp_path / "job" / "records" / "index" / "index.json").read_text())
    copy, compressed_size = meta["copy_bytes"], sample_pgn.stat().st_size
    reads = []
    for k in range(4):
        name = f"records/shard-0000{k}-of-00004/manifest.json"
        m = json.loads((tmp_path / "job" / name).read_text())
        reads.append(m["input_bytes_read"])
        one = json.loads(
            (tmp_path / "one" / "records/shard-00000-of-00001/manifest.json").read_text()
        )
        assert m["job"]["games_file"] == one["job"]["games_file"]  # identity: the .zst's bytes
    assert reads[0]["index_built"] and reads[0]["index"] == compressed_size
    assert sum(r["games"] for r in reads) == copy  # every frame read once, by its own task
    for r in reads:
        assert 0 < r["games"] < copy / 2
    for r in reads[1:]:  # the other tasks never read the compressed input beyond its two ends
        assert not r["index_built"] and r["index"] < 2 * game_index.PROBE + 16_384


def test_tasks_on_gcs_fetch_only_their_games(sample_pgn):
    """The same job with the .zst and the records on gs:// (the GCS emulator): the emulator's own
    log of served bytes, not our counter, says that after the first task's index pass each task
    fetched its own frames of the copy (ranged reads, not the remote file's MiB read-ahead
    blocks) and only the two probed ends of the input."""
    from tests.support.gcs_emulator import emulated_gcs

    sysmod.register("first", _First)
    try:
        with emulated_gcs() as gcs:
            source = epath.Path("gs://bucket/in/games.pgn.zst")
            source.write_bytes(sample_pgn.read_bytes())
            base = dict(systems=("first",), max_games=200, chunk_games=50, random_games=0,
                        progress=False, plots=False, num_shards=4)  # fmt: skip
            served = []
            for k in range(4):
                before = len(gcs.reads)
                ev.evaluate(None, str(source), "gs://bucket/job",
                            ev.EvalConfig(**base, shard_index=k))  # fmt: skip
                by_name: dict[str, int] = {}
                for r in gcs.reads[before:]:
                    by_name[r.name] = by_name.get(r.name, 0) + r.nbytes
                served.append(by_name)
            index, _ = game_index.load(epath.Path("gs://bucket/job/records/index"))
            assert json.loads(epath.Path("gs://bucket/job/report.json").read_text())["meta"]
    finally:
        sysmod._REGISTRY.pop("first")
    size, copy = sample_pgn.stat().st_size, index.meta["copy_bytes"]
    name = "job/records/index/" + game_index.COPY
    assert served[0]["in/games.pgn.zst"] >= size
    frames = [
        sum(int(n) for n, g in zip(index.lengths, index.game_ids, strict=True)
            if stream.shard_of(g, 4) == k)
        for k in range(4)
    ]  # fmt: skip
    for k in range(4):
        if k:
            assert served[k]["in/games.pgn.zst"] <= 2 * game_index.PROBE
        # its own frames (about a quarter of the copy), and the few small gaps merged between them
        assert frames[k] <= served[k][name] <= frames[k] + 0.1 * copy


def test_a_cut_or_junk_compressed_input(sample_pgn, tmp_path):
    """A .zst cut short (a truncated download) is indexed up to the cut, as the streaming reader
    reads it; a file that is not zstd at all is one error naming it."""
    cut = tmp_path / "cut.pgn.zst"
    cut.write_bytes(sample_pgn.read_bytes()[:100_000])
    index = game_index.build(cut, 10_000, [], seed=0, where=epath.Path(tmp_path / "i1"))
    stats = ParseStats()
    streamed = list(stream.game_stream(cut, 10_000, stats))
    assert index.game_ids == [g.game_id for g in streamed] and 0 < len(streamed) < 999
    assert index.parse_stats()["games_read"] == stats.games_read
    junk = tmp_path / "junk.pgn.zst"
    junk.write_bytes(b'[Event "not compressed"]\n' * 100)
    with pytest.raises(ValueError, match="junk.pgn.zst"):
        game_index.build(junk, 10, [], seed=0, where=epath.Path(tmp_path / "i2"))


class _FirstSub(_First):
    subsample = True


def test_a_prepared_index_serves_every_task(sample_pgn, tmp_path):
    """``prepare_only`` (``launch.evaluate --prepare_index``) builds the index as a step of its
    own: no task then builds it, and a task whose subsample settings differ is refused, naming
    them, instead of scoring another subsample."""
    from allie_jax.eval.records import RecordsError

    sysmod.register("firstsub", _FirstSub)
    try:
        base = dict(systems=("firstsub",), max_games=30, chunk_games=10, random_games=0,
                    progress=False, plots=False, search_positions=40)  # fmt: skip
        out = tmp_path / "job"
        info = ev.evaluate(None, sample_pgn, out, ev.EvalConfig(**base), prepare_only=True)
        assert info["built"] and info["games"] == 30 and info["copy_bytes"] > 0
        assert info["games_file"] == ev.file_digest(sample_pgn)
        assert not (out / "records" / "shard-00000-of-00002").exists()
        for k in range(2):
            ev.evaluate(None, sample_pgn, out,
                        ev.EvalConfig(**base, num_shards=2, shard_index=k))  # fmt: skip
            m = json.loads((out / f"records/shard-0000{k}-of-00002/manifest.json").read_text())
            assert not m["input_bytes_read"]["index_built"]
        report = json.loads((out / "report.json").read_text())
        assert report["move_accuracy"]["firstsub"]["overall"]["n"] == 40
        other = dict(base, search_positions=10)
        with pytest.raises(RecordsError, match="subsamples"):
            ev.evaluate(None, sample_pgn, tmp_path / "job",
                        ev.EvalConfig(**other, num_shards=2, shard_index=0))  # fmt: skip
    finally:
        sysmod._REGISTRY.pop("firstsub")
