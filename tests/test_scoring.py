"""The evaluator's packed causal pass (``allie_jax.eval.scoring``): the same bits as one game alone
in a padded row, whatever games share its call; the same numbers as the model called directly;
and a call plan that respects its limits."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from flax import nnx

from allie_jax.eval.scoring import CausalScorer, game_tokens, plan_calls, row_widths, rows_per_call
from allie_jax.game import encode_game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import read_games


@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def games(sample_pgn):
    return list(itertools.islice(read_games(sample_pgn), 30))


def _alone(scorer: CausalScorer, game):
    """The padded pass on one game alone: its numbers depend on nothing else."""
    tokens, h = game_tokens(game, scorer.max_len)
    logp, value, time_s = scorer.run_rows([tokens])
    cut = slice(h - 1, len(tokens))
    return logp[0, cut], value[0, cut], time_s[0, cut]


def _padded_batches(scorer: CausalScorer, games):
    """The previous pass (a batch holds up to ``batch_size`` games of one padded length)."""
    encoded = [game_tokens(g, scorer.max_len) for g in games]
    order = sorted(range(len(games)), key=lambda i: -len(encoded[i][0]))
    out = {}
    for _, group in itertools.groupby(order, key=lambda i: scorer.padded_len(len(encoded[i][0]))):
        group = list(group)
        for start in range(0, len(group), scorer.batch_size):
            idx = group[start : start + scorer.batch_size]
            logp, value, time_s = scorer.run_rows([encoded[i][0] for i in idx])
            for b, i in enumerate(idx):
                tokens, h = encoded[i]
                cut = slice(h - 1, len(tokens))
                out[i] = (logp[b, cut], value[b, cut], time_s[b, cut])
    return out


def _assert_same_bits(got, want):
    for a, b in zip((got.log_probs, got.value_white, got.time_s), want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_packed_pass_is_the_padded_pass_bit_for_bit(tiny_model, games):
    scorer = CausalScorer(tiny_model)
    calls = []
    packed = dict(scorer.score(games, on_batch=calls.append))
    assert sorted(packed) == list(range(len(games))) and sum(calls) == len(games)
    assert len(calls) > 1  # several calls, several games per call: packing is exercised
    previous = _padded_batches(scorer, games)
    for i, game in enumerate(games):
        assert len(packed[i].value_white) == len(game.moves) + 1
        _assert_same_bits(packed[i], _alone(scorer, game))
        _assert_same_bits(packed[i], previous[i])


def test_a_game_scores_the_same_bits_in_any_company(tiny_model, games):
    """Chunks and shards put a game beside different games: its records must not change."""
    scorer = CausalScorer(tiny_model)
    full = dict(scorer.score(games))
    for subset in (games[::3], games[5:9][::-1], games[-1:]):
        for j, out in scorer.score(subset):
            want = full[games.index(subset[j])]
            _assert_same_bits(out, (want.log_probs, want.value_white, want.time_s))


def test_packed_pass_matches_the_model_called_directly(tiny_model, games):
    """An independent reference: the model's own forward on one game, no segments, no packing."""
    scorer = CausalScorer(tiny_model)
    packed = dict(scorer.score(games[:3]))
    forward = nnx.jit(lambda model, tokens: model(tokens))
    for i, game in enumerate(games[:3]):
        enc = encode_game(game, partial=True, max_len=scorer.max_len)
        out = forward(tiny_model, enc.tokens[None])
        cut = slice(enc.header_len - 1, len(enc.tokens))
        logits = np.asarray(out.policy_logits[0, cut], np.float64)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(packed[i].log_probs, logp, atol=2e-4)
        np.testing.assert_allclose(packed[i].value_white, np.asarray(out.value[0, cut]), atol=1e-5)


def test_elo_override_reaches_the_packed_pass(tiny_model, games):
    scorer = CausalScorer(tiny_model)
    game = games[0]
    (_, out), = scorer.score([game], elo_override=2500)  # fmt: skip
    rated = dataclasses.replace(game, white_elo=2500, black_elo=2500)
    enc = encode_game(rated, partial=True, max_len=scorer.max_len)
    logp, _, _ = scorer.run_rows([enc.tokens])
    np.testing.assert_array_equal(out.log_probs, logp[0, enc.header_len - 1 : len(enc.tokens)])


def test_call_plan_respects_its_limits():
    widths = row_widths(512)
    assert widths == (128, 256, 512)
    assert row_widths(300) == (128, 256, 320) and row_widths(64) == (64,)  # multiples of 64
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(5, 513, 300)] + [512, 512, 1, 128, 129]
    calls = plan_calls(lengths, 1024, widths)
    seen = [i for c in calls for i in c.games]
    assert sorted(seen) == list(range(len(lengths)))  # every game exactly once
    assert [lengths[i] for i in seen] == sorted(lengths, reverse=True)  # longest first
    for c in calls:
        assert sum(lengths[i] for i in c.games) <= 1024
        assert c.width in widths and max(lengths[i] for i in c.games) <= c.width
        assert c.width == min(w for w in widths if w >= lengths[c.games[0]])
        assert c.rows == rows_per_call(c.width, 1024) and len(c.games) <= c.rows
        assert c.tokens == 1024
    shapes = {(c.width, c.rows) for c in calls}
    assert len(shapes) <= len(widths)  # one compiled program per width
    # games that fit one call get a call of their size (rounded up to 128), not a full one
    (small,) = plan_calls([100, 60, 70], 1024, widths)
    assert small.tokens == 256 and small.games == (0, 2, 1) and small.width == 128
    with pytest.raises(ValueError, match="longer than tokens_per_call=256 or the widest row"):
        plan_calls([300], 256, (128, 256, 512))
