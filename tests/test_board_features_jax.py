"""The board model's features inside jit (``data/board_features_jax.py``) against the python-chess
builder (``data/board_features.py``) on every position of real games, repetitions included."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from allie_jax import chess_jax
from allie_jax.data import board_features as bf
from allie_jax.data import board_features_jax as bfj
from allie_jax.pgn import read_games

PICK = {3, 10, 16, 18, 23, 39}


@pytest.fixture(scope="module")
def positions(sample_pgn):
    # the sample games with repeated positions (3, 10, 16, 18, 39) or en passant (18, 23)
    games = [g for i, g in enumerate(itertools.islice(read_games(sample_pgn), 40)) if i in PICK]
    examples, move_ids, plies = [], [], []
    for game in games:
        ids = chess_jax.uci_to_move_ids(game.moves)
        for ply, ex in enumerate(bf.game_examples(game)):
            examples.append(ex)
            move_ids.append(ids)
            plies.append(ply)
    width = max(len(m) for m in move_ids)
    moves = np.zeros((len(move_ids), width), np.int32)
    for i, m in enumerate(move_ids):
        moves[i, : len(m)] = m
    state = chess_jax.replay(jnp.asarray(moves), jnp.asarray(plies))
    return state, bf.stack(examples)


@pytest.mark.slow  # compiles the rules and the feature builder (about a minute on 2 cores)
def test_every_field_matches_python_chess(positions):
    state, ref = positions
    out = jax.jit(bfj.features)(state, jnp.asarray(ref["white_elo"]), jnp.asarray(ref["black_elo"]))
    # the sample must exercise what is hard to get right: repeated positions, en passant, rights
    assert (ref["move_info"] > 0).sum() >= 10 and (ref["repetition"] > 0).any()
    assert (ref["ep_file"] >= 0).any() and (ref["castling"] == 0).any()
    for key in bf.INPUT_FIELDS:
        got = np.asarray(out[key])
        assert got.dtype == ref[key].dtype, key
        bad = np.flatnonzero((got != ref[key]).reshape(len(got), -1).any(-1))
        assert not len(bad), f"{key}: {len(bad)} of {len(got)} positions differ, first {bad[:5]}"


@pytest.mark.slow  # compiles the rules again
def test_child_repetitions_over_every_move_matches(positions, monkeypatch):
    """A batch with a position of more quiet moves than the compact pass takes re-keys every
    move: forced here by a compact size of 2, the counts are python-chess's again."""
    from allie_jax.chess_jax import rules

    state, ref = positions
    monkeypatch.setattr(rules, "_COMPACT_MOVES", 2)
    got = jax.jit(rules.child_repetitions.__wrapped__)(state, chess_jax.legal_mask(state))
    np.testing.assert_array_equal(np.asarray(got, np.int8), ref["move_info"])
