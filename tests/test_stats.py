"""Game-level bootstrap: coverage on clustered data where position-level intervals fail, pairing,
and the hand-checkable cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from allie_jax.eval import metrics, stats


def _clustered(rng, games=60, per_game=30, p=0.5, spread=0.35):
    """Correctness flags whose rate varies by game (players and openings differ)."""
    rates = np.clip(rng.normal(p, spread, size=games), 0, 1)
    ids = np.repeat(np.arange(games), per_game)
    flags = rng.random(ids.size) < rates[ids]
    return flags, ids


def test_point_estimate_is_the_pooled_rate():
    flags = np.array([1, 1, 0, 1, 0, 0, 0], bool)
    ids = np.array([7, 7, 7, 3, 3, 9, 9])
    out = stats.game_rate(flags, ids)
    assert out["value"] == pytest.approx(3 / 7)
    assert (out["n"], out["games"], out["successes"]) == (7, 3, 3)
    lo, hi = out["ci95"]
    assert lo <= 3 / 7 <= hi


def test_constant_games_give_the_binomial_width_over_games():
    # every position of a game agrees: the information is G games, not G*K positions
    rng = np.random.default_rng(0)
    games, per_game = 200, 50
    wins = rng.random(games) < 0.4
    ids = np.repeat(np.arange(games), per_game)
    flags = np.repeat(wins, per_game)
    out = stats.game_rate(flags, ids, num_resamples=4000)
    p = wins.mean()
    half = 1.96 * math.sqrt(p * (1 - p) / games)
    assert (out["ci95"][1] - out["ci95"][0]) / 2 == pytest.approx(half, rel=0.15)
    wilson = metrics.rate(flags)["ci95"]
    assert (wilson[1] - wilson[0]) < (
        out["ci95"][1] - out["ci95"][0]
    ) / 4  # positions: far too narrow


def test_coverage_on_clustered_data():
    rng = np.random.default_rng(1)
    covered_games = covered_positions = 0
    trials = 120
    for t in range(trials):
        flags, ids = _clustered(rng)
        truth = 0.5  # mean of the symmetric clipped normal
        lo, hi = stats.game_rate(flags, ids, num_resamples=400, seed=t)["ci95"]
        covered_games += lo <= truth <= hi
        wlo, whi = metrics.rate(flags)["ci95"]
        covered_positions += wlo <= truth <= whi
    assert covered_games / trials >= 0.88
    assert covered_positions / trials < 0.6


def test_paired_difference_cancels_the_shared_game_effect():
    rng = np.random.default_rng(2)
    flags_a, ids = _clustered(rng, games=80)
    # b = a with 5 % of the wrong answers fixed: a small, consistent improvement
    flags_b = flags_a | (rng.random(flags_a.size) < 0.05)
    paired = stats.paired_difference(flags_b, flags_a, ids)
    assert paired["value"] == pytest.approx(flags_b.mean() - flags_a.mean())
    assert paired["significant"] and paired["ci95"][0] > 0
    # unpaired: the two separate intervals overlap, the difference would not be visible
    ca, cb = stats.game_rate(flags_a, ids)["ci95"], stats.game_rate(flags_b, ids)["ci95"]
    assert cb[0] < ca[1]
    with pytest.raises(ValueError, match="same ones"):
        stats.paired_difference(flags_a, flags_b[:-1], ids)


def test_compare_systems_by_group():
    rng = np.random.default_rng(3)
    a, ids = _clustered(rng, games=40, per_game=10)
    b = a.copy()
    b[::7] = True
    groups = (ids % 2) * 200 + 1200
    out = stats.compare_systems(
        {"maia": a, "maia+search": b}, ids, baseline="maia", groups=groups, labels=[1200, 1400]
    )
    assert set(out["overall"]) == {"maia", "maia+search"}
    assert "minus_maia" in out["overall"]["maia+search"]
    assert [g["group"] for g in out["by_group"]] == [1200, 1400]
    assert out["by_group"][0]["maia"]["accuracy"]["n"] == int((groups == 1200).sum())
    with pytest.raises(ValueError, match="baseline"):
        stats.compare_systems({"a": a}, ids, baseline="b")


def test_empty():
    out = stats.game_rate([], [])
    assert out["n"] == 0 and math.isnan(out["value"])
