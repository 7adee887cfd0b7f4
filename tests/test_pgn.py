"""The PGN reader against python-chess (the reference parser) on real games, plus fuzzing."""

from __future__ import annotations

import bz2
import io
import pathlib

import chess
import chess.pgn
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allie_jax import pgn
from allie_jax.game import NO_TIME

REPO = pathlib.Path(__file__).resolve().parents[1]
ARENA = REPO / "data" / "sample" / "lichess_arenas_sample_noclk.pgn.zst"


def _text(path) -> str:
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read().decode()


@pytest.fixture(scope="module")
def sample_text(sample_pgn) -> str:
    return _text(sample_pgn)


@pytest.fixture(scope="module")
def sample_games(sample_pgn):
    return list(pgn.read_games(sample_pgn))


def _reference(text: str):
    """python-chess: read_game + mainline + node.clock() (the released code's approach)."""
    stream = io.StringIO(text)
    out = []
    while (g := chess.pgn.read_game(stream)) is not None:
        assert not g.errors
        nodes = list(g.mainline())
        if nodes:
            out.append((g.headers, [n.move.uci() for n in nodes], [n.clock() for n in nodes]))
    return out


def test_matches_python_chess_on_sample(sample_text, sample_games):
    ref = _reference(sample_text)
    assert len(ref) == len(sample_games) == 986
    for (headers, moves, clocks), game in zip(ref, sample_games, strict=True):
        assert game.moves == moves
        assert game.clocks == clocks
        assert game.white_elo == int(headers["WhiteElo"])
        assert game.game_id == headers["Site"].rsplit("/", 1)[-1]
        assert game.termination == headers["Termination"]
        assert game.result == {"1-0": 1.0, "0-1": -1.0, "1/2-1/2": 0.0}[headers["Result"]]


def test_matches_python_chess_on_noclock_arena():
    text = _text(ARENA)
    stats = pgn.ParseStats()
    games = list(pgn.read_games(ARENA, stats=stats))
    ref = _reference(text)
    assert [g.moves for g in games] == [r[1] for r in ref]
    assert all(g.clocks is None and g.think_times is None for g in games)
    assert stats.games_read == 2000 and stats.games_ok + sum(stats.dropped.values()) == 2000


def test_think_times_hand_computed(sample_games):
    # First game of the sample (https://lichess.org/NRafdioG, 60+0): clocks 60, 60, 60, 59, 60, 58
    g = sample_games[0]
    assert g.time_control == "60+0"
    assert g.clocks[:6] == [60, 60, 60, 59, 60, 58]
    assert g.think_times[:6] == [0, 0, 0, 1, 0, 1]
    # Everywhere: think = previous own clock - clock + increment, first previous = base.
    for game in sample_games:
        base, inc = pgn.parse_time_control(game.time_control)
        prev = [base, base]
        for i, (clock, think) in enumerate(zip(game.clocks, game.think_times, strict=True)):
            expected = prev[i % 2] - clock + inc
            assert think == (expected if expected >= 0 else NO_TIME)
            prev[i % 2] = clock


CHESSCOM = """[Event "Live Chess"]
[Site "Chess.com"]
[Result "0-1"]
[WhiteElo "3095"]
[BlackElo "2990"]
[TimeControl "180"]
[Termination "FaustinoOro won on time"]
[Link "https://www.chess.com/game/live/116170251113"]

1. d4 {[%clk 0:03:00]} 1... Nf6 {[%clk 0:02:59.4]} 2. Nf3 {[%clk 0:02:59.5]} 2... e6 {[%clk 0:02:57]} 0-1
"""


def test_chesscom_tenths_and_termination():
    (game,) = pgn.read_games(io.StringIO(CHESSCOM))
    assert game.time_control == "180+0"
    assert game.clocks == [180.0, 179.4, 179.5, 177.0]
    assert game.think_times == pytest.approx([0.0, 0.6, 0.5, 2.4])
    assert game.termination == "Time forfeit"
    assert game.game_id == "chesscom:116170251113"
    assert game.result == -1.0


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Game drawn by timeout vs insufficient material", "Time forfeit"),
        ("X won by resignation", "Normal"),
        ("X won by checkmate", "Normal"),
        ("Game drawn by repetition", "Normal"),
        ("Game drawn by stalemate", "Normal"),
        ("Game drawn by agreement", "Normal"),
        ("X won - game abandoned", "Abandoned"),
        ("Rules infraction", "Rules infraction"),
        ("Normal", "Normal"),
    ],
)
def test_termination_mapping(text, expected):
    assert pgn.normalize_termination(text) == expected


def test_compressed_and_stdin(tmp_path, sample_text, sample_games, monkeypatch):
    plain = tmp_path / "a.pgn"
    plain.write_text(sample_text)
    packed = tmp_path / "a.pgn.bz2"
    packed.write_bytes(bz2.compress(sample_text.encode()))
    for source in (plain, packed):
        assert [g.moves for g in pgn.read_games(source)] == [g.moves for g in sample_games]
    monkeypatch.setattr("sys.stdin", io.StringIO(sample_text[:20000]))
    assert len(list(pgn.read_games("-"))) > 5


def test_unreadable_files_name_the_input(tmp_path):
    with pytest.raises(pgn.PGNError, match="nope.pgn"):
        list(pgn.read_games(tmp_path / "nope.pgn"))
    bad = tmp_path / "bad.pgn.zst"
    bad.write_bytes(b"this is not zstd at all" * 10)
    with pytest.raises(pgn.PGNError, match="bad.pgn.zst"):
        list(pgn.read_games(bad))


GOOD = '[Event "x"]\n[Site "https://lichess.org/g{i}"]\n[Result "1-0"]\n[TimeControl "180+0"]\n\n1. e4 e5 2. Qh5 Nc6 3. Bc4 Nf6 4. Qxf7# 1-0\n\n'


@pytest.mark.parametrize(
    "broken,reason",
    [
        ('[Event "x"]\n[Result "*"]\n\n1. e4 *\n\n', "unfinished_result"),
        ('[Event "x"]\n[Result "1-0"]\n[TimeControl "-"]\n\n1. e4 1-0\n\n', "bad_time_control"),
        ('[Event "x"]\n[Result "1-0"]\n[TimeControl "0+1"]\n\n1. e4 1-0\n\n', "bad_time_control"),
        ('[Event "x"]\n[Result "1-0"]\n\n1. e4 e5 2. Ke3 1-0\n\n', "illegal_move"),
        ('[Event "x"]\n[Result "1-0"]\n\n1. e4 e5 2. Zz9 1-0\n\n', "unparsable_move"),
        ('[Event "x"]\n[Result "1-0"]\n[WhiteElo "12x"]\n\n1. e4 1-0\n\n', "bad_header"),
        ('[Event "x"]\n[Result "1-0\n\n1. e4 1-0\n\n', "bad_header"),
        ('[Event "x"]\n[Result "1-0"]\n\n1-0\n\n', "no_moves"),
        ('[Event "x"]\n[Result "1-0"]\n\n1. e4 e5 2. Nf3\n\n', "truncated"),
    ],
)
def test_bad_games_counted_neighbours_kept(broken, reason):
    text = GOOD.format(i=1) + broken + GOOD.format(i=2)
    stats = pgn.ParseStats()
    games = list(pgn.read_games(io.StringIO(text), stats=stats))
    assert [g.game_id for g in games] == ["g1", "g2"]
    assert stats.dropped == {reason: 1} and stats.games_read == 3


def test_truncated_file_tail():
    text = GOOD.format(i=1) + GOOD.format(i=2)[:-30]
    stats = pgn.ParseStats()
    assert [g.game_id for g in pgn.read_games(io.StringIO(text), stats=stats)] == ["g1"]
    assert stats.dropped == {"truncated": 1}


def test_require_clocks(sample_text):
    arena = _text(ARENA)[:5000]
    stats = pgn.ParseStats()
    assert list(pgn.read_games(io.StringIO(arena), require_clocks=True, stats=stats)) == []
    assert set(stats.dropped) <= {"no_clocks", "no_moves", "truncated"}


def _read_general_only(text: str):
    """The games and stats with the fast move-text reader switched off (the general one only)."""
    fast = pgn._read_moves_fast
    pgn._read_moves_fast = lambda move_text: None
    try:
        stats = pgn.ParseStats()
        return list(pgn.read_games(io.StringIO(text), stats=stats)), stats
    finally:
        pgn._read_moves_fast = fast


def test_fast_reader_covers_the_exports(sample_text):
    """Lichess exports (with and without clocks) never leave the fast path: that is the speed."""
    for text in (sample_text, _text(ARENA)):
        for raw in pgn.split_games(io.StringIO(text)):
            move_text = "".join(raw.move_lines)
            if any(ch.isalpha() for ch in move_text):
                assert pgn._read_moves_fast(move_text) is not None, move_text[:80]


_HEAD = '[Event "x"]\n[Site "https://lichess.org/g1"]\n[Result "1-0"]\n[TimeControl "60+1"]\n\n'


@pytest.mark.parametrize(
    "move_text",
    [
        "1. e4 { [%clk 0:01:00] } 1... e5 { [%clk 0:00:59] } 2. Nf3 1-0",
        "1.e4 {[%clk 0:01:00]} e5 {[%eval 0.2] [%clk 0:00:58.5]} 2.Nf3!? Nc6?? 1-0",
        "1. e4 { [%clk 0:01:00] } { [%clk 0:00:30] } 1... e5 1-0",  # two comments: last wins
        "1. e4 { no clock } e5 { [%clk 0:00:59] } 1-0",
        "{ [%clk 0:01:00] } 1. e4 e5 1-0",  # comment before the first move
        "{ e4 } 1. d4 d5 1-0",  # a move-like word inside a leading comment
        "1. e4 $1 e5 $2 1-0",  # NAGs
        "1. e4 (1. d4 d5) 1... e5 ; rest of line\n 2. Nf3 1-0",  # variation, line comment
        "1. e4 e5 2. Ke3 1-0",  # illegal
        "1. d4 e6 2. e4 Bb4+ 3. Nc3 Nf6 4. Ne2 1-0",  # unambiguous: the Nc3 is pinned
        "1. e4 e5 1-0 { after the result }",
        "1. e4 e5 1-0 2. Nf3",
        "1. e4 { open comment 1-0",
        "1. e4 e5 } 2. Nf3 1-0",  # a stray closing brace is ignored
        "1 e4 e5 1-0",  # a move number without its dot
        "1. e4 e5 2. O-O 1-0",
        "1. e4 e5 2. Nf3 Nf6 3. Bc4 Bc5 4. 0-0 0-0 1-0",
        "1. e4 e5 2. e8=Q 1-0",
        "1. e4 {[%clk 0:01:00]} 1... e5 {[%clk 0:1:2]} 2. Qh5 {[%clk 1:00:00.25]} 1-0",
    ],
)
def test_fast_and_general_readers_agree(move_text):
    text = _HEAD + move_text + "\n\n"
    games, stats = _read_general_only(text)
    fast_stats = pgn.ParseStats()
    assert list(pgn.read_games(io.StringIO(text), stats=fast_stats)) == games
    assert fast_stats.to_dict() == stats.to_dict()


# ------------------------------------------------------------------------------------- fuzzing


def _games_text(sample_text: str) -> list[str]:
    blocks = sample_text.strip().split("\n\n[Event ")
    return [blocks[0]] + ["[Event " + b for b in blocks[1:]]


_MUTATIONS = ("bytes", "header", "move", "comment", "clock", "delete_line", "truncate_text")


@st.composite
def _mutation(draw):
    return (
        draw(st.sampled_from(_MUTATIONS)),
        draw(st.integers(0, 10**9)),
        draw(st.binary(min_size=1, max_size=8)),
    )


def _mutate(text: str, kind: str, pos: int, junk: bytes) -> str:
    junk_s = junk.decode("latin-1")
    if kind == "bytes":
        i = pos % len(text)
        return text[:i] + junk_s + text[i + (pos // 7) % 4 :]
    lines = text.split("\n")
    headers = [i for i, line in enumerate(lines) if line.startswith("[")]
    if kind == "header":
        i = headers[pos % len(headers)]
        choice = pos % 5
        lines[i] = (
            lines[i][:-1]
            if choice == 0
            else lines[i].replace('"', "", 1)
            if choice == 1
            else lines[i].split('"')[0] + '"' + junk_s + '"]'
            if choice == 2
            else '[Result "*"]'
            if choice == 3
            else '[TimeControl "-"]'
        )
        return "\n".join(lines)
    if kind == "delete_line":
        del lines[pos % len(lines)]
        return "\n".join(lines)
    body = text[text.index("\n\n") + 2 :] if "\n\n" in text else text
    head = text[: len(text) - len(body)]
    words = body.split(" ")
    i = pos % len(words)
    if kind == "move":
        words[i] = junk_s if pos % 3 else ("Qh8" if pos % 2 else "")
    elif kind == "comment":
        words[i] = words[i].replace("{", "").replace("}", "") + ("{" if pos % 2 else "}")
    elif kind == "clock":
        words[i] = "[%clk " + junk_s + "]" if pos % 2 else words[i].replace(":", "", 1)
    elif kind == "truncate_text":
        words = words[:i]
    return head + " ".join(words)


def _fuzz_case(games_text, sample_by_id, mutation, start):
    kind, pos, junk = mutation
    # Three real games; the middle one is mutated. The outer two must come out unchanged.
    a, b, c = (games_text[(start + k) % len(games_text)] for k in range(3))
    mutated = _mutate(b, kind, pos, junk).strip("\n")
    text = a + "\n\n" + mutated + "\n\n" + c + "\n"
    stats = pgn.ParseStats()
    out = list(pgn.read_games(io.StringIO(text), stats=stats))
    assert stats.games_read == stats.games_ok + sum(stats.dropped.values())
    general_out, general_stats = _read_general_only(text)
    assert out == general_out and stats.to_dict() == general_stats.to_dict()
    ids = [g.game_id for g in out]
    for intact in (a, c):
        gid = intact.split("lichess.org/")[1][:8]
        if gid not in sample_by_id:
            continue  # a game without moves in the sample: dropped either way
        assert gid in ids
        got = out[ids.index(gid) if intact is a else len(ids) - 1 - ids[::-1].index(gid)]
        assert got == sample_by_id[gid]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(mutation=_mutation(), start=st.integers(0, 900))
def test_fuzz_neighbours_survive(sample_text, sample_games, mutation, start):
    _fuzz_case(_games_text(sample_text), {g.game_id: g for g in sample_games}, mutation, start)


@pytest.mark.slow
@settings(
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(mutation=_mutation(), start=st.integers(0, 900))
def test_fuzz_neighbours_survive_long(sample_text, sample_games, mutation, start):
    _fuzz_case(_games_text(sample_text), {g.game_id: g for g in sample_games}, mutation, start)
