"""Offline evaluation (SPEC §5): metrics, per-position records, skill calibration, reports, plots.

``evaluate(checkpoint, games, output_dir)`` runs everything; ``calibration_from_pgn`` scores games
played by a system (the match tool's output).
"""

from allie_jax.eval.calibration import CalibrationTable, calibration_from_pgn, fide_dp
from allie_jax.eval.evaluate import EvalConfig, evaluate

__all__ = ["CalibrationTable", "EvalConfig", "calibration_from_pgn", "evaluate", "fide_dp"]
