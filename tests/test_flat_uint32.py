"""Released flat uint32 files: the layout of the released tokenizer, read and written.

``_released_words`` and ``_released_time_labels`` restate the released code's rule
(y0mingzhang/allie @ 9fdc02d, src/modeling/data.py: ``UCITokenizer.tokenize`` zips
``[time_control] + moves`` with ``moves_seconds + [-1]`` and adds ``(time + 1) << 16``;
``pad_and_collate`` reads ``(word >> 16) - 1`` at each position as that position's time label)
independently of ``flat_uint32``, so the tests fail if our writer or reader moves a time.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from allie_jax import pgn, vocab
from allie_jax.data import flat_uint32
from allie_jax.game import NO_TIME, Game, encode_game
from tests.test_pgn import CHESSCOM

_OUTCOME_MASK = {1.0: 0x0000, 0.0: 0x4000, -1.0: 0x8000}


def _released_seconds(g: Game) -> list[int]:
    """The released ``moves_seconds``: whole seconds, -1 where unknown."""
    if g.think_times is None:
        return [-1] * len(g.moves)
    return [int(round(t)) if t >= 0 else -1 for t in g.think_times]


def _released_words(g: Game) -> np.ndarray:
    """The released tokenizer's rule, restated (not our writer)."""
    seq = [g.white_elo + 1997, g.black_elo + 1997]
    tc = vocab.TC_TO_ID.get(vocab.normalize_time_control(g.time_control), vocab.UNK)
    tokens = [tc] + [vocab.encode_move(m) for m in g.moves]
    for token, time in zip(tokens, _released_seconds(g) + [-1], strict=True):
        seq.append(token + ((max(time, -1) + 1) << 16))
    if g.ended_normally:
        seq.append(vocab.TERMINATION)
    seq.append(vocab.EOS)
    return np.asarray(seq, np.uint32) | np.uint32(_OUTCOME_MASK[g.result])


def _released_time_labels(words: np.ndarray) -> np.ndarray:
    """The released collate: the time label of each position in seconds (NO_TIME: none)."""
    enc = (words >> 16).astype(np.int64)
    return np.where(enc == 0, NO_TIME, enc - 1).astype(np.float32)


@pytest.fixture(scope="module")
def real_games(sample_pgn) -> list[Game]:
    """Real Lichess games with clocks (whole seconds, as the released files hold them)."""
    games = [g for g in pgn.read_games(sample_pgn) if g.think_times is not None]
    assert len(games) > 500
    return games


def test_writer_matches_released_tokenizer_on_real_games(real_games):
    for g in real_games:
        np.testing.assert_array_equal(flat_uint32.game_to_words(g), _released_words(g))


def test_labels_equal_after_round_trip_through_released_file(tmp_path, real_games):
    """Released words → file → our reader → encode_game: the released labels at every position."""
    path = tmp_path / "released.bin"
    words = np.concatenate([_released_words(g) for g in real_games])
    words.astype("<u4").tofile(path)
    back = list(flat_uint32.read_flat(path, chunk_words=4096))  # many windows, games straddle
    assert len(back) == len(real_games)
    labelled = 0
    start = 0
    for original, game in zip(real_games, back, strict=True):
        n = len(_released_words(original))
        released = _released_time_labels(words[start : start + n])
        start += n
        ours = encode_game(game).time_targets
        np.testing.assert_array_equal(ours, released)
        # ... and the labels our own encoding of the parsed game has, to the second.
        direct = encode_game(original).time_targets
        np.testing.assert_array_equal(np.where(direct >= 0, np.round(direct), NO_TIME), released)
        assert game.moves == original.moves and game.result == original.result
        labelled += int((released >= 0).sum())
    assert labelled > 20_000  # the check covered real labels, not empty games


def test_bit_layout_by_hand():
    g = Game(["e2e4", "e7e5", "g1f3"], 1500, 1600, "180+2", -1.0, "Normal", [3.0, 7.0, 1.0])
    black = 2 << 14
    assert flat_uint32.game_to_words(g).tolist() == [
        (1500 + 1997) | black,
        (1600 + 1997) | black,
        vocab.TC_TO_ID["180+2"] | black | (4 << 16),  # e2e4 took 3 s: on the TC word
        757 | black | (8 << 16),  # e2e4's word carries e7e5's 7 s
        890 | black | (2 << 16),  # e7e5's word carries g1f3's 1 s
        vocab.encode_move("g1f3") | black,  # the last move's word: no label
        vocab.TERMINATION | black,
        vocab.EOS | black,
    ]
    g2 = Game(["e2e4", "e7e5"], None, None, None, 0.0, "Abandoned", [NO_TIME, 5.0])
    draw = 1 << 14
    assert flat_uint32.game_to_words(g2).tolist() == [
        vocab.BOS | draw,
        vocab.UNK | draw,
        757 | draw | (6 << 16),
        890 | draw,
        vocab.EOS | draw,
    ]


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
        if g.think_times is None or all(t < 0 for t in g.think_times)
        else [float(round(t)) if t >= 0 else NO_TIME for t in g.think_times],
    )


def test_round_trip(tmp_path, sample_pgn):
    games = list(pgn.read_games(sample_pgn)) + list(pgn.read_games(io.StringIO(CHESSCOM)))
    games.append(Game(moves=["e2e4"], result=0.0, termination="Abandoned"))
    path = tmp_path / "train.bin"
    n = flat_uint32.write_flat(games, path)
    assert path.stat().st_size == 4 * n
    assert list(flat_uint32.read_flat(path)) == [_expected(g) for g in games]
    assert list(flat_uint32.read_flat(path, chunk_words=7)) == [_expected(g) for g in games]


def test_pre_fix_layout_rejected():
    """Times on the moves' own words (our old writer): the last move carries a time."""
    g = Game(["e2e4", "e7e5"], 1500, 1600, "180+0", 1.0, "Normal", [3.0, 7.0])
    words = flat_uint32.game_to_words(g) & np.uint32(0xFFFF)
    words[3] |= np.uint32(4 << 16)
    words[4] |= np.uint32(8 << 16)
    with pytest.raises(flat_uint32.FlatFormatError, match="released layout"):
        list(flat_uint32.words_to_games(words))


def test_truncated_stream_rejected(tmp_path):
    games = [Game(["e2e4"], 1500, 1500, "180+0", 1.0), Game(["d2d4"], 1500, 1500, "180+0", 0.0)]
    words = flat_uint32.games_to_words(games)
    with pytest.raises(flat_uint32.FlatFormatError):
        list(flat_uint32.words_to_games(words[:-1]))
    with pytest.raises(flat_uint32.FlatFormatError):
        list(flat_uint32.words_to_games(np.asarray([5, vocab.EOS], np.uint32)))
    # From a file: every complete game comes out before the error about the cut one.
    path = tmp_path / "cut.bin"
    words[:-2].astype("<u4").tofile(path)
    seen = []
    with pytest.raises(flat_uint32.FlatFormatError, match="truncated"):
        for game in flat_uint32.read_flat(path, chunk_words=3):
            seen.append(game)
    assert [g.moves for g in seen] == [["e2e4"]]
    path.write_bytes(words.astype("<u4").tobytes()[:-2])  # a partial last word
    seen = []
    with pytest.raises(flat_uint32.FlatFormatError, match="multiple of 4.*truncated"):
        for game in flat_uint32.read_flat(path):
            seen.append(game)
    assert [g.moves for g in seen] == [["e2e4"]]
