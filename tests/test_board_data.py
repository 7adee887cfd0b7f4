"""Board examples and the board pipeline, checked against python-chess and the FEN text.

The references are independent of ``board_features``: the FEN string (pieces, castling, en
passant), ``Board.is_repetition`` (which walks the move stack itself) and the game records.
"""

from __future__ import annotations

import itertools

import chess
import numpy as np
import pytest

from allie_jax import vocab
from allie_jax.data import board_features as bf
from allie_jax.data.board_pipeline import (
    RATING_BUCKETS,
    RecordSchedule,
    make_board_iterator,
    mean_rating_bucket,
)
from allie_jax.data.records import deserialize_game
from allie_jax.data.shards import read_records, shard_paths
from allie_jax.game import Game
from allie_jax.pgn import read_games

_FEN_PIECES = " PNBRQKpnbrqk"  # index = our square state


def _fen_squares(fen: str) -> np.ndarray:
    out = np.zeros(64, np.int8)
    for r, row in enumerate(fen.split()[0].split("/")):
        f = 0
        for ch in row:
            if ch.isdigit():
                f += int(ch)
            else:
                out[(7 - r) * 8 + f] = _FEN_PIECES.index(ch)
                f += 1
    return out


def _fen_rights(fen: str) -> np.ndarray:
    _, _, castle, ep, *_ = fen.split()
    out = np.zeros(13, np.int8)
    out[:4] = [c in castle for c in "KQkq"]
    if ep != "-":
        out[4] = 1
        out[5 + "abcdefgh".index(ep[0])] = 1
    return out


def _earlier_occurrences(board: chess.Board) -> int:
    return max(c for c in range(1, 5) if c == 1 or board.is_repetition(c)) - 1


def _with_repetition(sample_pgn) -> Game:
    for game in itertools.islice(read_games(sample_pgn), 400):
        if any(ex["repetition"] > 0 for ex in bf.game_examples(game)):
            return game
    raise AssertionError("no game with a repeated position in the sample")


def test_examples_match_fen_and_python_chess(sample_pgn):
    game = _with_repetition(sample_pgn)
    board = chess.Board()
    examples = list(bf.game_examples(game))
    assert len(examples) == len(game.moves)
    seen_repeat = False
    for uci, ex in zip(game.moves, examples, strict=True):
        fen = board.fen()  # python-chess writes only a legal en-passant square
        np.testing.assert_array_equal(ex["squares"], _fen_squares(fen))
        assert ex["side"] == (fen.split()[1] == "w")
        np.testing.assert_array_equal(ex["castling"], _fen_rights(fen)[:4])
        ep = fen.split()[3]
        assert ex["ep_file"] == (-1 if ep == "-" else "abcdefgh".index(ep[0]))
        assert ex["halfmoves"] == int(fen.split()[4]) and ex["fullmoves"] == int(fen.split()[5])
        assert ex["repetition"] == min(_earlier_occurrences(board), 2)
        seen_repeat |= ex["repetition"] > 0
        assert ex["policy_target"] == vocab.encode_move(uci)
        assert ex["value_target"] == game.result
        assert (ex["white_elo"], ex["black_elo"]) == (game.white_elo, game.black_elo)
        legal = {m.uci(): m for m in board.legal_moves}
        info = ex["move_info"]
        assert {vocab.MOVES[i] for i in np.flatnonzero(info >= 0)} == set(legal)
        if ex["halfmoves"] >= 3:  # the repetition count of every move's resulting position
            for u, m in legal.items():
                board.push(m)
                assert info[vocab.MOVE_TO_ID[u]] == min(_earlier_occurrences(board), 2), u
                board.pop()
        board.push_uci(uci)
        np.testing.assert_array_equal(ex["rights_target"], _fen_rights(board.fen()))
    assert seen_repeat


def test_repetition_features_on_a_knight_shuffle():
    game = Game(moves="g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8 g1f3".split())
    ex = list(bf.game_examples(game))
    assert [int(e["repetition"]) for e in ex] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    # the start position occurred at plies 0 and 4: f6g8 at ply 7 would make it a threefold
    assert ex[7]["move_info"][vocab.MOVE_TO_ID["f6g8"]] == 2
    assert ex[7]["move_info"][vocab.MOVE_TO_ID["e7e5"]] == 0
    assert ex[3]["move_info"][vocab.MOVE_TO_ID["f6g8"]] == 1  # back to the start once
    assert ex[2]["move_info"][vocab.MOVE_TO_ID["f3g1"]] == 0  # clock 2: nothing can repeat yet


def test_board_inputs_use_the_move_stack():
    board = chess.Board()
    for uci in "g1f3 g8f6 f3g1 f6g8".split():
        board.push_uci(uci)
    batch = bf.board_inputs([board, chess.Board()])
    assert list(batch["repetition"]) == [1, 0]
    assert batch["move_info"].shape == (2, vocab.NUM_MOVES)


def test_illegal_move_is_named():
    with pytest.raises(ValueError, match="move 2 'e2e4' is illegal"):
        list(bf.game_examples(Game(moves=["e2e4", "e2e4"], game_id="x")))


def test_rating_buckets():
    assert mean_rating_bucket(1000, 1001) == 0
    assert mean_rating_bucket(1499, 1500) == 0 and mean_rating_bucket(1500, 1500) == 1
    assert mean_rating_bucket(2400, 2700) == 3 - 1 + 1  # mean 2550 -> 2500+
    assert mean_rating_bucket(900, 1000) is None and mean_rating_bucket(None, 2000) is None
    assert RATING_BUCKETS[-1] == (2500, None)


def test_record_schedule_curriculum_then_last_bucket_forever():
    buckets = [np.array([0, 1, 2]), np.array([10, 11]), np.array([20]), np.array([30, 31])]
    sched = RecordSchedule(list(zip(buckets, [1, 1, 1, None], strict=True)), seed=3)
    order = [sched(i) for i in range(3 + 2 + 1 + 8)]
    assert sorted(order[:3]) == [0, 1, 2] and sorted(order[3:5]) == [10, 11]
    assert order[5] == 20
    tail = order[6:]
    assert set(tail) == {30, 31} and all(sorted(tail[i : i + 2]) == [30, 31] for i in (0, 2, 4))
    with pytest.raises(ValueError, match="empty"):
        RecordSchedule([(np.array([], np.int64), None)], seed=0)


def test_pipeline_batches_resume_and_curriculum(prepared_sample):
    it = make_board_iterator(prepared_sample, "train", batch_size=32, shuffle_window=256)
    batch = next(it)
    assert set(batch) == set(bf.FIELDS)
    for k, (shape, dtype) in bf.FIELDS.items():
        assert batch[k].shape == (32, *shape) and batch[k].dtype == dtype, k
    state = it.get_state()
    want = next(it)
    again = make_board_iterator(prepared_sample, "train", batch_size=32, shuffle_window=256)
    again.set_state(state)
    got = next(again)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])

    games = [
        deserialize_game(r) for p in shard_paths(prepared_sample, "train") for r in read_records(p)
    ]
    first = [mean_rating_bucket(g.white_elo, g.black_elo) for g in games]
    n0 = sum(len(g.moves) for g, b in zip(games, first, strict=True) if b == 0)
    cur = make_board_iterator(
        prepared_sample, "train", batch_size=64, curriculum=True, shuffle_window=0
    )
    means = np.concatenate(
        [(b["white_elo"].astype(int) + b["black_elo"]) / 2 for b in itertools.islice(cur, n0 // 64)]
    )
    assert means.min() >= 1000 and means.max() < 1500  # the whole first epoch is bucket 0
