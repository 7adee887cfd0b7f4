"""The value plot shows negative correlations (its y-limits used to be fixed at [-0.1, 1])."""

from __future__ import annotations

from allie_jax.eval import plots


def test_value_plot_limits_include_negative_correlations(tmp_path):
    rows = [
        {"group": 0, "r": -0.4, "ci95": [-0.6, -0.2], "n": 50},
        {"group": 1, "r": 0.3, "ci95": [0.1, 0.5], "n": 50},
        {"group": 2, "r": float("nan"), "ci95": [float("nan")] * 2, "n": 2},
    ]
    lo, hi = plots._correlation_ylim(rows)
    assert lo <= -0.6 and hi >= 1.0 and lo >= -1.05
    assert plots.plot_value_by_progress({"value": {"by_progress": rows}}, tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 0
