"""Released flat uint32 files: write games, read them back (think time rounded to seconds)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from allie_jax import pgn, vocab
from allie_jax.data import flat_uint32
from allie_jax.game import NO_TIME, Game
from tests.test_pgn import CHESSCOM


def _expected(g: Game) -> Game:
    tc = vocab.normalize_time_control(g.time_control) if g.time_control else None
    return Game(
        moves=g.moves,
        white_elo=None if g.white_elo is None else min(max(g.white_elo, 500), 3000),
        black_elo=None if g.black_elo is None else min(max(g.black_elo, 500), 3000),
        time_control=tc if tc in vocab.TIME_CONTROLS else None,
        result=g.result,
        termination="Normal" if g.ended_normally else "other",
        think_times=None
        if g.think_times is None
        else [float(round(t)) if t >= 0 else NO_TIME for t in g.think_times],
    )


def test_round_trip(tmp_path, sample_pgn):
    games = list(pgn.read_games(sample_pgn)) + list(pgn.read_games(io.StringIO(CHESSCOM)))
    games.append(Game(moves=["e2e4"], result=0.0, termination="Abandoned"))
    path = tmp_path / "train.bin"
    n = flat_uint32.write_flat(games, path)
    assert path.stat().st_size == 4 * n
    back = list(flat_uint32.read_flat(path))
    assert back == [_expected(g) for g in games]


def test_bit_layout_by_hand():
    g = Game(["e2e4", "e7e5"], 1500, 1600, "180+2", -1.0, "Normal", [3.0, NO_TIME])
    words = flat_uint32.game_to_words(g)
    black = 2 << 14
    assert words.tolist() == [
        (1500 + 1997) | black,
        (1600 + 1997) | black,
        vocab.TC_TO_ID["180+2"] | black,
        757 | black | (4 << 16),
        890 | black,
        vocab.TERMINATION | black,
        vocab.EOS | black,
    ]


def test_truncated_stream_rejected():
    words = flat_uint32.games_to_words([Game(["e2e4"], 1500, 1500, "180+0", 1.0)])
    with pytest.raises(flat_uint32.FlatFormatError):
        list(flat_uint32.words_to_games(words[:-1]))
    with pytest.raises(flat_uint32.FlatFormatError):
        list(flat_uint32.words_to_games(np.asarray([5, vocab.EOS], np.uint32)))
