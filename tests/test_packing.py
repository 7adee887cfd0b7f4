"""Pieces of long games keep the header, restart positions and carry every label exactly once."""

from __future__ import annotations

import numpy as np

from allie_jax import vocab
from allie_jax.data import packing
from allie_jax.game import Game, encode_game


def _long_game(n_plies: int) -> Game:
    # Knights shuffling back and forth: legal for any length.
    cycle = ["g1f3", "g8f6", "f3g1", "f6g8"]
    moves = [cycle[i % 4] for i in range(n_plies)]
    return Game(
        moves=moves,
        white_elo=1500,
        black_elo=1600,
        time_control="180+2",
        result=0.0,
        think_times=[float(i % 7) for i in range(n_plies)],
    )


def _labels(pieces):
    out = {k: [] for k in ("policy", "time", "value")}
    for p in pieces:
        m = p["policy_mask"] > 0
        out["policy"] += p["policy_targets"][m].tolist()
        out["time"] += p["time_targets"][p["time_mask"] > 0].tolist()
        out["value"] += p["value_targets"][p["value_mask"] > 0].tolist()
    return out


def test_short_game_is_one_piece():
    enc = encode_game(_long_game(20))
    (piece,) = packing.game_pieces(enc, 512)
    np.testing.assert_array_equal(piece["inputs"], enc.tokens)
    assert piece["policy_mask"].sum() == len(enc.tokens) - 3  # no label on the two Elo slots
    assert piece["policy_targets"][2] == vocab.encode_move("g1f3")


def test_long_game_continues_behind_header():
    game = _long_game(1100)
    enc = encode_game(game)
    seq_len = 128
    pieces = packing.game_pieces(enc, seq_len)
    assert all(len(p["inputs"]) <= seq_len for p in pieces)
    assert len(pieces[0]["inputs"]) == seq_len
    for p in pieces[1:]:
        np.testing.assert_array_equal(p["inputs"][:3], enc.tokens[:3])
        assert p["policy_mask"][:3].sum() == 0 and p["value_mask"][:3].sum() == 0
        # Target alignment: each labelled position predicts the input right after it.
        m = p["policy_mask"][:-1] > 0
        np.testing.assert_array_equal(p["policy_targets"][:-1][m], p["inputs"][1:][m])
    labels = _labels(pieces)
    full = _labels(packing.game_pieces(enc, 100_000))
    assert labels == full
    moves = [vocab.decode_move(t) for t in labels["policy"] if t < vocab.NUM_MOVES]
    assert moves == game.moves
    assert labels["time"] == game.think_times
    assert labels["policy"][-1] == vocab.EOS


def test_dropped_elo_header():
    enc = encode_game(_long_game(300), drop_elo=True, drop_time_control=True)
    pieces = packing.game_pieces(enc, 64)
    for p in pieces[1:]:
        assert p["inputs"][:2].tolist() == [vocab.BOS, vocab.UNK]
    assert [vocab.decode_move(t) for t in _labels(pieces)["policy"][:-2]] == _long_game(300).moves
