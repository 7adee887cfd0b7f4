"""FIDE performance ratings and skill calibration error against hand-computed examples."""

from __future__ import annotations

import pytest

from allie_jax.eval.calibration import (
    FIDE_DP_TABLE,
    SystemGame,
    calibrate,
    calibration_from_pgn,
    fide_dp,
    performance_rating,
)


def test_fide_dp_table_anchors():
    assert fide_dp(0.5) == 0
    assert fide_dp(0.75) == 193  # the paper's example (appendix "performance Elo")
    assert fide_dp(0.25) == -193
    assert fide_dp(1.0) == 800 and fide_dp(0.0) == -800
    assert fide_dp(0.99) == 677 and fide_dp(0.01) == -677
    assert fide_dp(0.6) == 72 and fide_dp(0.9) == 366 and fide_dp(0.51) == 7
    assert fide_dp(2 / 3) == 125  # 0.667 rounds to 0.67
    assert fide_dp(0.745) == 193  # rounded half up to 0.75
    # monotone and antisymmetric over the whole table
    values = [fide_dp(k / 100) for k in range(101)]
    assert values == sorted(values)
    assert all(fide_dp(k / 100) == -fide_dp(1 - k / 100) for k in range(101))
    assert len(FIDE_DP_TABLE) == 51
    with pytest.raises(ValueError, match="score fraction"):
        fide_dp(1.2)


def test_performance_rating_hand_computed():
    # 3 wins 1 loss vs a 1500 average: 1500 + dp(0.75) = 1693
    assert performance_rating([1400, 1500, 1500, 1600], [1, 1, 0, 1]) == 1693
    # 1 win 1 draw 2 losses vs 2000: p = 0.375 -> 0.38 -> -87
    assert performance_rating([2000] * 4, [1, 0.5, 0, 0]) == 2000 - 87
    with pytest.raises(ValueError, match="one score per rated game"):
        performance_rating([], [])


def test_calibrate_bins_and_sce():
    games = [
        # bin 1400-1600: opponents 1450, 1550 (mean 1500), scores 1, 0.5 -> p = 0.75 -> +193
        SystemGame("A", 1450, 1.0),
        SystemGame("A", 1550, 0.5),
        # bin 2400-2600: opponent 2500 twice, p = 0.5 -> SCE 0
        SystemGame("A", 2500, 1.0),
        SystemGame("A", 2500, 0.0),
        # system B: one loss vs 1000 -> -800
        SystemGame("B", 1000, 0.0),
    ]
    table = calibrate(games)
    a = table["A"]
    assert [(b.lo, b.games) for b in a.bins] == [(1400, 2), (2400, 2)]
    assert a.bins[0].performance == 1693 and a.bins[0].sce == 193
    assert a.bins[1].performance == 2500 and a.bins[1].sce == 0
    assert a.sce_mean == pytest.approx(96.5) and a.sce_max == 193
    # overall: opponents mean 2000, score 2.5 / 4 = 0.625 -> 0.63 -> +95
    assert a.performance == 2095
    assert table["B"].performance == 200 and table["B"].sce_max == 800
    d = table.to_dict()
    assert d["systems"]["A"]["bins"][0]["sce"] == 193
    assert "| A | 4 |" in table.to_markdown()


PGN = """[Event "match"]
[White "Allie-Adaptive"]
[Black "human1"]
[WhiteElo "2000"]
[BlackElo "1450"]
[Result "1-0"]

1. e4 e5 1-0

[Event "match"]
[White "human2"]
[Black "Allie-Adaptive"]
[WhiteElo "1550"]
[BlackElo "2000"]
[Result "1/2-1/2"]

1. d4 d5 1/2-1/2

[Event "match"]
[White "human3"]
[Black "Allie-Adaptive"]
[WhiteElo "1500"]
[BlackElo "?"]
[Result "*"]

1. c4 *

[Event "match"]
[White "human4"]
[Black "Allie-Adaptive"]
[WhiteElo "?"]
[BlackElo "2000"]
[Result "0-1"]

1. c4 0-1
"""


def test_calibration_from_pgn(tmp_path):
    path = tmp_path / "games.pgn"
    path.write_text(PGN)
    table = calibration_from_pgn(path, ["Allie-Adaptive"])
    s = table["Allie-Adaptive"]
    # unfinished and unrated-opponent games are skipped: 1450 win + 1550 draw -> 1500 + 193
    assert s.games == 2 and s.performance == 1693 and s.sce_max == 193
    with pytest.raises(ValueError, match="no rated, finished game"):
        calibration_from_pgn(path, ["Nobody"])
