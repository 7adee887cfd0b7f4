"""Load made the way a busy CI box makes it: separate CPU-bound processes, not threads in the
test (a thread shares the test's GIL and interpreter; another process competes for the cores
exactly as other jobs do). Also the driver of a game against a UCI opponent with a real clock."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import chess
import chess.engine

MARGIN_S = 0.5  # a move may end this much after its limit (pipes, python-chess, the scheduler)


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[int]]:
    """``n`` processes that spin on the CPU until the block ends (killed by their own pids)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True:\n    pass"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(30)


def engine_move(engine: chess.engine.SimpleEngine, board: chess.Board, limit) -> tuple:
    """One move of the UCI engine: (result, its ``info string move ... path P ... limit T``)."""
    result = engine.play(board, limit, info=chess.engine.INFO_ALL, game="g")
    return result, result.info.get("string", "")


def play_game(
    allie: chess.engine.SimpleEngine,
    opponent: chess.engine.SimpleEngine,
    base_s: float,
    inc_s: float,
    allie_white: bool,
    max_plies: int = 200,
) -> dict:
    """A game with the clock kept by the driver. Returns the outcome counts: ``flag`` (Allie
    out of time), ``junk`` (a move no model chose: no ``path`` in its report, or illegal),
    ``over`` (moves past their limit + ``MARGIN_S``), ``paths``, ``worst`` (spent - limit)."""
    board, clocks = chess.Board(), [base_s, base_s]
    out = {"flag": 0, "junk": 0, "over": 0, "paths": {}, "worst": -1e9, "moves": 0}
    allie.configure({})
    while board.outcome(claim_draw=True) is None and len(board.move_stack) < max_plies:
        side = 0 if board.turn == chess.WHITE else 1
        limit = chess.engine.Limit(
            white_clock=clocks[0], black_clock=clocks[1], white_inc=inc_s, black_inc=inc_s
        )
        mine = (side == 0) == allie_white
        t = time.monotonic()
        if mine:
            result, report = engine_move(allie, board, limit)
        else:
            result, report = opponent.play(board, limit, game="g"), ""
        spent = time.monotonic() - t
        clocks[side] -= spent
        if mine:
            out["moves"] += 1
            words = report.split()
            path = words[words.index("path") + 1] if "path" in words else None
            if path is None or result.move not in board.legal_moves:
                out["junk"] += 1
            out["paths"][path] = out["paths"].get(path, 0) + 1
            if "limit" in words:
                move_limit = float(words[words.index("limit") + 1].rstrip("s"))
                out["worst"] = max(out["worst"], spent - move_limit)
                out["over"] += spent > move_limit + MARGIN_S
            if clocks[side] <= 0:
                out["flag"] += 1
                break
        elif clocks[side] <= 0:
            break
        clocks[side] += inc_s
        board.push(result.move)
    return out


def uci_command(checkpoint: os.PathLike | str) -> list[str]:
    return [sys.executable, "-m", "launch.uci", "--checkpoint", str(checkpoint)]
