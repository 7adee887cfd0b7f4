"""``go``: its arguments, the clock they give the mover, and the game's time control when no
option names one (inferred from the first ``go`` of a game).

Standard library and light modules only (see ``engine/uci.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from allie_jax.engine.time_manager import MOVE_OVERHEAD_S, Clock

_BASES = (60, 120, 180, 240, 300, 360, 420)  # the initial times of the vocabulary's controls


@dataclasses.dataclass(frozen=True)
class GoParams:
    wtime: float | None = None  # seconds
    btime: float | None = None
    winc: float = 0.0
    binc: float = 0.0
    movetime: float | None = None
    nodes: int | None = None
    infinite: bool = False
    movestogo: int | None = None
    ponder: bool = False

    @classmethod
    def parse(cls, tokens: list[str]) -> GoParams:
        """Parse ``go`` arguments; unknown or malformed ones are ignored (UCI asks for leniency)."""
        values: dict[str, Any] = {}
        ms_keys = {"wtime", "btime", "winc", "binc", "movetime"}
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in ("infinite", "ponder"):
                values[tok] = True
            elif tok in ms_keys or tok in ("nodes", "movestogo", "depth", "mate"):
                if i + 1 < len(tokens):
                    try:
                        number = int(float(tokens[i + 1]))
                    except (ValueError, OverflowError):
                        number = None
                    if number is not None:
                        if tok in ms_keys:
                            values[tok] = max(0, number) / 1000.0
                        elif tok == "nodes":
                            values["nodes"] = max(0, min(number, 2000))
                        elif tok == "movestogo" and number > 0:
                            values["movestogo"] = number
                    i += 1
            i += 1
        return cls(**values)

    def clock(self, white: bool, overhead_s: float = MOVE_OVERHEAD_S) -> Clock:
        return Clock(
            time_left_s=self.wtime if white else self.btime,
            increment_s=self.winc if white else self.binc,
            movetime_s=self.movetime,
            moves_to_go=self.movestogo,
            overhead_s=overhead_s,
        )

    def time_control(self, white: bool) -> str | None:
        """The game's ``base+inc`` read from this ``go`` as the game's first (None: the go
        gives no clock). The larger of the two clocks is the nearer to the initial time."""
        clock = self.clock(white)
        if clock.time_left_s is None:
            return None
        other = self.btime if white else self.wtime
        start = max(clock.time_left_s, other or 0.0)
        return infer_time_control(start, clock.increment_s)


def infer_time_control(time_s: float, increment_s: float) -> str:
    """A ``base+inc`` string from the first ``go`` of a game; the base snaps to the vocabulary's.

    The clock at the first move is the initial time (or a little less for Black), so the nearest
    vocabulary base within 10% is taken; anything else stays as measured (and encodes to <UNK>).
    """
    inc = max(0, int(round(increment_s)))
    nearest = min(_BASES, key=lambda b: abs(b - time_s))
    base = nearest if abs(nearest - time_s) <= 0.1 * nearest else max(0, int(round(time_s)))
    return f"{base}+{inc}"
