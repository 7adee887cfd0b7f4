"""Random UCI command streams: the handler never raises, never hangs, and every accepted ``go`` gets
exactly one ``bestmove`` that is legal in the position it was asked about (checked by python-chess)."""

from __future__ import annotations

import random
import threading
import time

import chess

from allie_jax.engine.uci import OPTIONS, UciHandler
from tests.test_uci import ScriptedAllie

GO_ARGS = ["wtime", "btime", "winc", "binc", "movetime", "nodes", "movestogo", "depth", "infinite"]
GARBAGE = ["", "   ", "\t", "foo", "go go go", "position", "position startpos moves",
           "setoption", "setoption name", "setoption value 3", "position fen", "register later",
           "debug on", "ponderhit", "é ü ∞", "position fen 8/8/8/8/8/8/8/8 w - - 0 1",
           "position fen rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 moves e7e5",
           "go wtime -5 btime nan winc inf", "go nodes 1e99", "x" * 5000]  # fmt: skip


class RandomPacedAllie(ScriptedAllie):
    """A random legal move with a random small think time and resignation."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng

    def play(self, games, preset, rng, *, start_fens=None, **overrides):
        self.think_time_s = self.rng.choice([0.0, 0.001, 0.01, 0.03])
        self.resign = self.rng.random() < 0.1
        return super().play(games, preset, rng, start_fens=start_fens, **overrides)


def random_line(rng: random.Random, board: chess.Board) -> str:
    r = rng.random()
    if r < 0.25:  # a legal continuation of a random game
        moves = []
        b = chess.Board()
        for _ in range(rng.randint(0, 40)):
            legal = list(b.legal_moves)
            if not legal:
                break
            m = rng.choice(legal)
            b.push(m)
            moves.append(m.uci())
        if rng.random() < 0.2 and moves:  # corrupt one move
            moves[rng.randrange(len(moves))] = rng.choice(["e2e5", "a1a1", "zz", "e7e8q", "0000"])
        if rng.random() < 0.2:
            return f"position fen {b.fen()}" + (" moves " + moves[-1] if moves else "")
        return "position startpos" + (" moves " + " ".join(moves) if moves else "")
    if r < 0.45:
        args = []
        for key in rng.sample(GO_ARGS, rng.randint(0, 4)):
            args.append(key)
            if key != "infinite" and rng.random() < 0.9:
                args.append(str(rng.choice([0, 1, 10, 50, 1000, 180000, -3, 10**12, "x"])))
        return "go " + " ".join(args)
    if r < 0.55:
        return "stop"
    if r < 0.62:
        return "isready"
    if r < 0.75:
        name = rng.choice(list(OPTIONS) + ["Hash", "Threads", "mode", "Nope"])
        value = rng.choice(["true", "false", "0", "1500", "-1", "99999", "policy", "greedy",
                            "search", "adaptive", "0.5", "nan", "none 1500 human x", "", "180+2",
                            "garbage"])  # fmt: skip
        return f"setoption name {name} value {value}"
    if r < 0.8:
        return rng.choice(["ucinewgame", "uci"])
    if r < 0.81:
        return "quit"
    if r < 0.9:
        return rng.choice(GARBAGE)
    return "".join(
        rng.choice("abcdefgh12345678 qrnbmovesgofen/") for _ in range(rng.randint(1, 60))
    )


REAL_SETTINGS = ["setoption name Mode value policy", "setoption name Mode value adaptive",
                 "setoption name MeanSims value 4", "setoption name MaxSims value 8",
                 "setoption name UCI_ShowWDL value true", "setoption name AllowResign value true",
                 "setoption name MultiPV value 2", "setoption name HumanPacing value true",
                 "setoption name UCI_Opponent value none 1700 human x"]  # fmt: skip


def run_fuzz(n_lines: int, seed: int, loader=None, real: bool = False) -> int:
    """``real``: option lines come from ``REAL_SETTINGS`` (a real model compiles per setting)."""
    rng = random.Random(seed)
    out: list[str] = []
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            out.append(line)

    loader = loader or (lambda: RandomPacedAllie(random.Random(seed + 1)))
    h = UciHandler(loader, write, warmup=False)
    asked: list[chess.Board] = []  # the position of every accepted go, in order
    board = chess.Board()
    for _ in range(n_lines):
        line = random_line(rng, board)
        if real and line.startswith("setoption"):
            line = rng.choice(REAL_SETTINGS)
        before = len(out)
        t = time.monotonic()
        done = threading.Event()
        result: list[bool] = []

        def call(line=line, result=result, done=done) -> None:
            result.append(h.handle(line))
            done.set()

        worker = threading.Thread(target=call, daemon=True)
        worker.start()
        assert done.wait(10.0), f"handler hung on {line!r}"
        assert result and isinstance(result[0], bool)
        assert time.monotonic() - t < 10.0
        if line.startswith("go") and line.split()[0] == "go":
            with lock:
                refused = any("already thinking" in x for x in out[before:])
            if not refused:
                asked.append(h._position.board.copy())
    h.handle("stop")
    h.handle("quit")
    # A real engine answers a stopped go with the model's own move, so it may first have to
    # finish compiling the root prior: every worker ends, and then no go is left unanswered.
    assert h.close(600)
    assert not h.thinking
    best = [line.split()[1] for line in out if line.startswith("bestmove")]
    assert len(best) == len(asked), (len(best), len(asked))
    for move, board in zip(best, asked, strict=True):
        if move == "(none)":
            assert not any(board.legal_moves)
        else:
            assert chess.Move.from_uci(move) in board.legal_moves, (move, board.fen())
    return n_lines


def test_fuzz_10000_lines():
    """~8 s on 2 shared cores, so the full 10,000 lines stay in the default suite."""
    assert run_fuzz(10_000, seed=1) == 10_000


def test_fuzz_against_the_real_engine():
    """A few hundred lines against a real Allie (tiny model): the same invariants, with real
    searches, compiles and clocks behind the handler (settings stay within a few presets so the
    run compiles a handful of programs, not one per random option value)."""
    from flax import nnx

    from allie_jax.engine.api import Allie
    from allie_jax.model import AllieModel, ModelConfig

    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    assert run_fuzz(300, seed=7, loader=lambda: allie, real=True) == 300
