"""Games on the clock on a busy machine, with a model of the real size (allie_124m's shape,
random weights: the compute is real, the chess is not the point)."""

from __future__ import annotations

import os

import chess.engine
import pytest
from flax import nnx

from allie_jax.model import AllieModel, ModelConfig
from tests.support.load_support import MARGIN_S, busy_processes, play_game, uci_command
from tests.support.stockfish_support import require_stockfish

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_124m_games_at_1_plus_0_and_3_plus_0_under_load(tmp_path):
    """4 games at 1+0 and 4 at 3+0 against Stockfish (UCI_Elo 1350), colours alternating,
    while two other processes spin on the CPU: 0 time losses, 0 moves no model chose, every
    move within its limit plus ``MARGIN_S``."""
    from allie_jax.model.checkpoint import save_model

    sf_path = require_stockfish()
    ckpt = tmp_path / "allie_124m_random"
    save_model(AllieModel(ModelConfig.named("allie_124m"), rngs=nnx.Rngs(0)), ckpt)
    allie = chess.engine.SimpleEngine.popen_uci(uci_command(ckpt), cwd=REPO, timeout=3600)
    sf = chess.engine.SimpleEngine.popen_uci(sf_path)
    totals = {"flag": 0, "junk": 0, "over": 0, "moves": 0, "worst": -1e9, "paths": {}}
    try:
        allie.configure({"Mode": "adaptive", "OppoElo": 1350})
        allie.ping()  # isready: the model loads and every shape compiles, off the clock
        sf.configure({"UCI_LimitStrength": True, "UCI_Elo": 1350})
        with busy_processes(2):
            for i, base in enumerate((60.0, 60.0, 60.0, 60.0, 180.0, 180.0, 180.0, 180.0)):
                out = play_game(allie, sf, base, 0.0, allie_white=i % 2 == 0, max_plies=160)
                for k in ("flag", "junk", "over", "moves"):
                    totals[k] += out[k]
                totals["worst"] = max(totals["worst"], out["worst"])
                for p, n in out["paths"].items():
                    totals["paths"][p] = totals["paths"].get(p, 0) + n
        print(f"124m under load: {totals} (margin {MARGIN_S} s)")
        assert totals["flag"] == 0 and totals["junk"] == 0 and totals["over"] == 0, totals
    finally:
        allie.quit()
        sf.quit()
