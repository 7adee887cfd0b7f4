"""Activation patching on a board-state checkpoint (seed 001's implicit-search experiment).

    python -m launch.board_patching --checkpoint RUN --fen "CLEAN FEN" --corrupt_fen "FEN" \\
        [--squares e4,f5 --step 1] [--output sweep.json]

Without ``--squares``: the full sweep (every step × every square: how much the clean run's top
move loses when that square's residual comes from the corrupted run). With ``--squares``: one
patch at ``--step`` and its effect.
"""

from __future__ import annotations

import dataclasses
import json

from absl import app, flags

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Board checkpoint dir or training workdir.")
_FEN = flags.DEFINE_string("fen", None, "The clean position.")
_CORRUPT = flags.DEFINE_string("corrupt_fen", None, "The corrupted position (same side to move).")
_SQUARES = flags.DEFINE_list("squares", [], "Squares to patch together (e.g. e4,f5).")
_STEP = flags.DEFINE_integer("step", 0, "Residual step (0 = embeddings).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the result as JSON.")


def main(argv):
    del argv
    from allie_jax import cli

    cli.setup("launch.board_patching")  # library INFO logs to a file, not the console
    import chess
    import numpy as np

    from allie_jax.engine.board import is_board_model
    from allie_jax.eval.patching import Patcher
    from allie_jax.model.checkpoint import load_model

    model = load_model(_CHECKPOINT.value)
    if not is_board_model(model):
        raise app.UsageError(f"{_CHECKPOINT.value} is not a board-state checkpoint")
    try:
        clean, corrupt = chess.Board(_FEN.value), chess.Board(_CORRUPT.value)
    except ValueError as err:
        raise app.UsageError(f"bad FEN: {err}") from None
    patcher = Patcher(model)
    if _SQUARES.value:
        squares = [chess.parse_square(s) for s in _SQUARES.value]
        result = dataclasses.asdict(patcher.patch(clean, corrupt, _STEP.value, squares))
        print(json.dumps(result, indent=2))
    else:
        sweep = patcher.sweep(clean, corrupt)
        result = {"logit_drop": sweep.round(4).tolist(), "squares": list(chess.SQUARE_NAMES)}
        for step, row in enumerate(sweep):
            top = np.argsort(-row)[:3]
            print(
                f"step {step}: " + ", ".join(f"{chess.SQUARE_NAMES[s]} {row[s]:+.3f}" for s in top)
            )
    if _OUTPUT.value:
        from etils import epath

        epath.Path(_OUTPUT.value).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    flags.mark_flags_as_required(["checkpoint", "fen", "corrupt_fen"])
    app.run(main)
