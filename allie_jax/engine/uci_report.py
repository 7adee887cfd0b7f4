"""What the UCI engine says about a move: ``score cp`` / ``wdl``, the ``info`` lines while and
after searching, MultiPV, and the ``info string ... path P`` line that names what decided it.

Allie predicts a result (tanh), not draw odds: ``score cp`` maps the mover's searched value Q
(the value head's where no simulation ran) with Lc0's curve, ``wdl`` reports w = (1+Q)/2, d = 0,
l = (1−Q)/2 per mille, and a move that mates is ``score mate 1``. While searching, ``info``
lines report nodes, nps and the most visited move; MultiPV lines are ranked by root visits (the
policy's order when nothing was searched). Standard library only at import (python-chess is
imported where a board is read), like every module of the UCI engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import chess

    from allie_jax.player import Decision


def value_to_cp(value_stm: float) -> int:
    """Lc0's map from an expected result in [−1, 1] to centipawns (monotone, 0 -> 0)."""
    q = max(-0.99, min(0.99, value_stm))
    return int(round(111.714640912 * math.tan(1.5620688421 * q)))


def value_to_wdl(value_stm: float) -> tuple[int, int, int]:
    w = int(round(500 * (1.0 + max(-1.0, min(1.0, value_stm)))))
    return w, 0, 1000 - w


def progress_line(
    sims: int, best: str, elapsed_s: float, value_stm: float | None, show_wdl: bool
) -> str:
    """The periodic ``info`` line while searching: simulations so far as nodes, the root
    prior's value (side to move's view; None: not computed yet) and the most visited move."""
    parts = [f"info depth 1 nodes {sims} nps {int(sims / elapsed_s)}"]
    if value_stm is not None:
        parts.append(f"score cp {value_to_cp(value_stm)}")
        if show_wdl:
            parts.append("wdl {} {} {}".format(*value_to_wdl(value_stm)))
    parts.append(f"time {int(elapsed_s * 1000)} pv {best}")
    return " ".join(parts)


def multipv_moves(d: Decision, multipv: int) -> list[str]:
    """The move played first, then the others by root visits (the policy's order when nothing
    was searched): the first ``multipv`` of them."""
    if d.visits:
        ranked = sorted(d.visits, key=lambda m: -d.visits[m])
    else:
        ranked = sorted(d.policy, key=lambda m: -d.policy[m])
    ranked = [d.move] + [m for m in ranked if m != d.move]
    return ranked[:multipv]


def decision_lines(
    board: chess.Board,
    d: Decision,
    extra: Sequence[tuple[str, float]],
    elapsed_s: float,
    show_wdl: bool,
    limit_s: float | None,
) -> list[str]:
    """The lines sent before ``bestmove``: one ``info`` line per MultiPV move (``extra``: each
    move with the model's value after it, White's view; empty: the move played alone), then the
    ``info string move ... path P`` line."""
    import chess

    sign = 1.0 if board.turn == chess.WHITE else -1.0
    nodes = max(d.sims, 1)
    ms = int(elapsed_s * 1000)
    nps = int(nodes / max(elapsed_s, 1e-3))
    q = d.search_value if math.isfinite(d.search_value) else sign * d.value
    lines = list(extra) if extra else [(d.move, sign * q)]
    out = []
    for i, (move, value_white) in enumerate(lines, start=1):
        v = q if i == 1 else sign * value_white
        parts = ["info depth 1"]
        if len(lines) > 1:
            parts.append(f"multipv {i}")
        after = board.copy(stack=False)
        after.push_uci(move)
        if after.is_checkmate():
            parts.append("score mate 1")
        else:
            parts.append(f"score cp {value_to_cp(v)}")
        if show_wdl:
            w, dr, lo = (1000, 0, 0) if after.is_checkmate() else value_to_wdl(v)
            parts.append(f"wdl {w} {dr} {lo}")
        count = d.visits.get(move, 0) if d.visits else 0
        shown = count if i > 1 and count else nodes
        parts.append(f"nodes {shown} nps {nps} time {ms} pv {move}")
        out.append(" ".join(parts))
    lam = d.effective_lambda
    out.append(
        f"info string move {d.move} path {d.path} think_time {d.think_time_s:.2f}s "
        f"value_white {d.value:.3f} p_best {d.policy.get(d.move, 0.0):.3f} sims {d.sims}"
        + (f" lambda {lam:.6g}" if math.isfinite(lam) else "")
        + (f" limit {limit_s:.3f}s" if limit_s is not None else "")
        + f" elapsed {elapsed_s:.3f}s"
    )
    return out
