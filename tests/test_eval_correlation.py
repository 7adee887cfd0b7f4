"""A correlation's interval in the report is a game-clustered bootstrap: where the positions of a
game move together it is much wider than Fisher's interval over positions (which counts each
position as an independent draw), and with one position per game the two agree. Fisher's
interval is computed here from its formula (tanh(atanh r ± 1.96/√(n−3))), independently of the
report code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from allie_jax.eval import summarize
from allie_jax.eval.tally import Tally


def _fisher(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    r = float(np.corrcoef(x, y)[0, 1])
    z, se = math.atanh(r), 1.0 / math.sqrt(x.size - 3)
    return math.tanh(z - 1.959964 * se), math.tanh(z + 1.959964 * se)


def _interval(games: np.ndarray, x: np.ndarray, y: np.ndarray, chunks: int = 1):
    """The report's reading of the correlation, from a tally fed in ``chunks`` pieces."""
    tally = Tally()
    for part in np.array_split(np.arange(x.size), chunks):
        cl = tally.clusters(np.array([f"g{g}" for g in games[part]], dtype=object))
        summarize._moments(tally, ("think",), cl, x[part], y[part])
    return summarize.Reader(tally, seed=0, num_resamples=1000).pearson(("think",))


def test_positions_of_one_game_are_one_draw():
    rng = np.random.default_rng(0)
    num_games, per_game = 60, 40
    effect = rng.normal(size=num_games)  # a game's level: every position of it shares it
    games = np.repeat(np.arange(num_games), per_game)
    x = effect[games] + 0.1 * rng.normal(size=games.size)
    y = 0.5 * effect[games] + rng.normal(size=num_games)[games] + 0.1 * rng.normal(size=games.size)
    got = _interval(games, x, y)
    assert got["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert got["games"] == num_games and got["n"] == games.size
    lo, hi = got["ci95"]
    f_lo, f_hi = _fisher(x, y)
    assert lo < got["r"] < hi
    # 60 independent games, not 2,400 independent positions: about √40 ≈ 6× wider
    assert hi - lo > 3 * (f_hi - f_lo)
    # the interval of 60 games is Fisher's over 60 game means, not over 2,400 positions
    gx = x.reshape(num_games, per_game).mean(1)
    gy = y.reshape(num_games, per_game).mean(1)
    g_lo, g_hi = _fisher(gx, gy)
    assert 0.6 < (hi - lo) / (g_hi - g_lo) < 1.6


def test_one_position_per_game_agrees_with_fisher():
    rng = np.random.default_rng(1)
    n = 3000
    x = rng.normal(size=n)
    y = 0.4 * x + rng.normal(size=n)
    got = _interval(np.arange(n), x, y, chunks=3)
    lo, hi = got["ci95"]
    f_lo, f_hi = _fisher(x, y)
    assert got["games"] == n
    assert 0.8 < (hi - lo) / (f_hi - f_lo) < 1.25
    assert abs((lo + hi) / 2 - (f_lo + f_hi) / 2) < 0.25 * (f_hi - f_lo)


def test_the_interval_does_not_depend_on_the_chunking():
    rng = np.random.default_rng(2)
    games = np.repeat(np.arange(50), 7)
    x, y = rng.normal(size=games.size), rng.normal(size=games.size)
    assert _interval(games, x, y, chunks=1) == _interval(games, x, y, chunks=5)


def test_constant_or_single_game_series_have_no_interval():
    x = np.arange(10.0)
    one_game = _interval(np.zeros(10, int), x, 2 * x + 1)
    assert one_game["r"] == pytest.approx(1.0) and all(map(math.isnan, one_game["ci95"]))
    flat = _interval(np.arange(10), x, np.ones(10))
    assert math.isnan(flat["r"])
