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
from allie_jax.pgn import ParseStats, open_text

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
