"""Vocabulary ids against SPEC §1 golden values and python-chess move round trips."""

from __future__ import annotations

import random

import chess
import pytest

from allie_jax import vocab


@pytest.mark.parametrize(
    "move,token",
    [
        ("h8a1", 1455),
        ("a1b3", 1456),
        ("a7b8q", 1792),
        ("e2e4", 757),
        ("e7e5", 890),
        ("e1g1", 743),
        ("a7a8q", 1796),
        ("h2h1n", 1967),
    ],
)
def test_golden_move_ids(move, token):
    assert vocab.encode_move(move) == token
    assert vocab.decode_move(token) == move


def test_sizes_and_specials():
    assert vocab.NUM_MOVES == 1968 and vocab.VOCAB_SIZE == 1997
    assert vocab.MOVES[:1456][-1] == "h8a1" and len(set(vocab.MOVES)) == 1968
    assert sum(len(m) == 5 for m in vocab.MOVES) == 176
    assert vocab.TIME_CONTROLS[0] == "180+0" and vocab.TIME_CONTROLS[-1] == "240+5"
    assert vocab.TC_TO_ID["180+0"] == 1968 and vocab.TC_TO_ID["240+5"] == 1991
    assert (vocab.TERMINATION, vocab.BOS, vocab.EOS, vocab.UNK, vocab.PAD) == (
        1992,
        1993,
        1994,
        1995,
        1996,
    )
    assert vocab.encode_time_control("180") == 1968  # chess.com spelling
    assert vocab.encode_time_control("600+0") == vocab.UNK
    assert vocab.encode_elo(2900) == 2900 + 1997 and vocab.encode_elo(100) == 500 + 1997


def test_move_table_matches_strings():
    table = vocab.move_table()
    for i in range(0, 1968, 37):
        m = chess.Move.from_uci(vocab.MOVES[i])
        assert (table[i, 0], table[i, 1]) == (m.from_square, m.to_square)


def test_every_legal_move_of_random_positions_round_trips():
    rng = random.Random(1)
    positions = 0
    board = chess.Board()
    while positions < 10_000:
        legal = list(board.legal_moves)
        if not legal or board.ply() > 200:
            board = chess.Board()
            continue
        for move in legal:
            uci = move.uci()
            assert vocab.decode_move(vocab.encode_move(uci)) == uci
        positions += 1
        board.push(rng.choice(legal))
