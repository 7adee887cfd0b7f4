"""Play under a clock with a real (tiny) model: the engine's KV cache across moves, the deadline,
``stop`` mid-search, compiling ahead at ``isready``, and a whole game against Stockfish."""

from __future__ import annotations

import os
import sys
import time

import chess
import chess.engine
import pytest
from flax import nnx

from allie_jax.engine.api import Allie
from allie_jax.engine.pacing import Clock, answer_by, time_budget
from allie_jax.engine.time_manager import FinishReserve, MovePlan, move_limit
from allie_jax.engine.uci import UciHandler
from allie_jax.game import Game, encode_game
from allie_jax.model import AllieModel, ModelConfig
from tests.support.load_support import busy_processes, play_game, uci_command
from tests.support.stockfish_support import require_stockfish

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# one search setting for every test here, so its shapes compile once (go nodes N sets budgets)
SEARCH = ("Mode value search", "MeanSims value 2000", "MaxSims value 2000")


@pytest.fixture(scope="module")
def allie() -> Allie:
    # fixed shapes, as the UCI engine after warm-up: every go of a setting shares its programs
    return Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), fixed_shapes=True)


_HANDLERS: list[UciHandler] = []


@pytest.fixture(autouse=True)
def _close_handlers():
    yield
    while _HANDLERS:  # no worker may outlive its test (it would run into interpreter exit)
        assert _HANDLERS.pop().close(60)


def handler(allie: Allie, *options: str) -> tuple[UciHandler, list[str]]:
    lines: list[str] = []
    h = UciHandler(lambda: allie, lines.append, warmup=False)
    _HANDLERS.append(h)
    for opt in options:
        h.handle(f"setoption name {opt}")
    return h, lines


def go_and_wait(h: UciHandler, lines: list[str], go: str, timeout: float = 300.0) -> str:
    n = sum(line.startswith("bestmove") for line in lines)
    h.handle(go)
    end = time.monotonic() + timeout
    while sum(line.startswith("bestmove") for line in lines) <= n:
        assert time.monotonic() < end, f"no bestmove for {go!r}: {lines[-5:]}"
        time.sleep(0.002)
    return [line for line in lines if line.startswith("bestmove")][-1].split()[1]


def test_time_manager_rule_and_its_documented_numbers():
    assert time_budget(Clock()) is None
    # (left - 0.1 s overhead * (n + 2)) / n + increment, n = movestogo or 25, capped at a
    # quarter of (left - overhead)
    assert move_limit(Clock(60.0)) == pytest.approx(57.3 / 25)  # 1+0: 2.292 s
    assert move_limit(Clock(180.0)) == pytest.approx(177.3 / 25)  # 3+0
    assert move_limit(Clock(600.0, 0.1)) == pytest.approx(597.3 / 25 + 0.1)  # 10+0.1
    assert move_limit(Clock(3600.0, 1.0)) == pytest.approx(3597.3 / 25 + 1.0)  # 60+1
    assert move_limit(Clock(300.0, moves_to_go=40)) == pytest.approx(295.8 / 40)  # 40/300
    # movestogo is honoured (the old rule gave 75 s of 300 s to one move of forty)
    assert move_limit(Clock(300.0, moves_to_go=40)) < 300.0 / 39
    assert move_limit(Clock(10.0, 5.0)) == pytest.approx(0.25 * 9.9)  # increment > what's left
    assert move_limit(Clock(10.0, moves_to_go=1)) == pytest.approx(0.75 * 9.9)  # last move
    assert move_limit(Clock(0.05, 0.1)) == 0.0  # under the overhead: play at once
    assert move_limit(Clock(60.0, 1.0, movetime_s=0.5)) == pytest.approx(0.4)
    assert move_limit(Clock(60.0, overhead_s=1.0)) == pytest.approx(33.0 / 25)
    for left in (0.3, 1.0, 5.0, 60.0):
        hard = answer_by(Clock(left, 0.0))
        assert time_budget(Clock(left, 0.0)) <= hard < left  # never the whole clock
    # a 1+0 game that uses every limit (plus 50 ms of lag a move) does not run out in 100
    # moves: the overhead reserve is the floor the lag eats
    left = 60.0
    for _ in range(100):
        left -= move_limit(Clock(left)) + 0.05
    assert left > 0.0
    # the whole move's plan: the search stops the finish reserve before the limit
    reserve = FinishReserve()
    plan = MovePlan.make(100.0, Clock(60.0), reserve.seconds)
    assert plan.hard_deadline == pytest.approx(100.0 + 57.3 / 25)
    assert plan.search_deadline == pytest.approx(plan.hard_deadline - reserve.seconds)
    reserve.observe(0.2)  # a finish that ran 0.2 s past the search's deadline
    assert reserve.seconds >= 0.2


def test_uci_game_reuses_the_kv_cache(allie):
    """Prefill tokens per move in a UCI game: the first go reads the header and the moves, each
    later go only the two plies added since (fails without a game id: every move re-reads all)."""
    h, lines = handler(allie, *SEARCH, "TimeControl value 60+1")
    board, moves, spent = chess.Board(), [], []
    for ply in range(8):
        if ply % 2 == 0:  # the opponent's move
            move = sorted(board.legal_moves, key=lambda m: m.uci())[ply % 3]
            board.push(move)
            moves.append(move.uci())
            continue
        h.handle("position startpos moves " + " ".join(moves))
        before = allie.search_stats["prefill_tokens"]
        best = go_and_wait(h, lines, "go nodes 4")
        spent.append(allie.search_stats["prefill_tokens"] - before)
        board.push_uci(best)
        moves.append(best)
    first = Game(moves=moves[:1], white_elo=1500, black_elo=1500, time_control="60+1")
    header = len(encode_game(first, partial=True).tokens) - 1
    assert spent == [header + 1, 2, 2, 2], spent
    h.handle("ucinewgame")  # a new game is a new id: its first move reads everything again
    h.handle("position startpos moves e2e4")
    before = allie.search_stats["prefill_tokens"]
    go_and_wait(h, lines, "go nodes 4")
    assert allie.search_stats["prefill_tokens"] - before == header + 1


def test_stop_mid_search_answers_within_100ms(allie):
    h, lines = handler(allie, *SEARCH)
    h.handle("position startpos moves e2e4")
    go_and_wait(h, lines, "go nodes 2")  # compiles the 2001-node search outside the timing
    # infinite: thinking until stop whatever the host's speed. Stop as soon as the search reports
    # its first chunk of simulations (2,000 of the tiny model take >= 0.18 s on an idle 2-core
    # CPU, a chunk ~25 ms), so the stop lands mid-search, not before it or after it
    h.handle("go infinite")
    end = time.monotonic() + 60
    while not (h._go.interim and h._go.interim[0]) and time.monotonic() < end:
        time.sleep(0.001)
    assert h.thinking
    t = time.monotonic()
    h.handle("stop")
    elapsed = time.monotonic() - t
    assert not h.thinking and elapsed < 0.1, elapsed
    best = [line for line in lines if line.startswith("bestmove")][-1].split()[1]
    assert (
        chess.Move.from_uci(best)
        in chess.Board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1").legal_moves
    )
    h.close(10)
    # a searched move cut short of its budget: the search's own answer, or (on a slow host) its
    # most visited move so far, which the engine answers with after 50 ms
    early = [line for line in lines if line.startswith("info string answering")]
    if early:
        assert "most visited move" in early[-1], early
    else:
        assert 0 < h.last_decision.sims < 2000


def test_deadline_cuts_the_search_short(allie):
    h, lines = handler(allie, *SEARCH)
    h.handle("position startpos moves e2e4")
    go_and_wait(h, lines, "go nodes 2")
    board = chess.Board()
    board.push_uci("e2e4")
    lines.clear()
    # limit = (1.1 - 0.1) / 25 = 0.04 s, far under the >= 0.18 s that 2,000 simulations take.
    # Outcomes, not a wall-clock bound (a loaded CI box took 0.23-0.30 s for a 0.1 s budget):
    # the move is legal and the model's (the search cut short, or the forced answer's searched /
    # prior move, never an arbitrary legal move); the engine's own report says the move came
    # within the clock (no flag), and the finish reserve learns from any overrun.
    with busy_processes(2):  # a busy box: two other processes spinning on the cores
        best = go_and_wait(h, lines, "go wtime 1100 btime 1100")
    assert chess.Move.from_uci(best) in board.legal_moves
    paths = [line.split(" path ")[1].split()[0] for line in lines if " path " in line]
    assert len(paths) == 1 and paths[0] in ("search", "fallback")
    if paths[0] == "search":
        assert h.last_decision.sims < 2000
    else:
        forced = next(line for line in lines if line.startswith("info string answering"))
        assert "most visited move" in forced or "root prior" in forced
        prior = h._go.prior.move_probs
        assert "most visited move" in forced or best == max(prior, key=prior.get)


def test_finished_game_answers_without_an_error_line(allie):
    h, lines = handler(allie, "Mode value policy")
    h.handle("position startpos moves f2f3 e7e5 g2g4 d8h4")  # mate
    assert go_and_wait(h, lines, "go movetime 100") == "(none)"
    h.handle("position fen 8/8/8/8/8/4k3/8/4K3 w - - 0 1")  # insufficient material
    best = go_and_wait(h, lines, "go movetime 1000")
    assert chess.Move.from_uci(best) in chess.Board("8/8/8/8/8/4k3/8/4K3 w - - 0 1").legal_moves
    assert not any("error" in line for line in lines), lines


def test_gui_sending_every_default_plays_at_the_opponents_rating(allie):
    """UCI_Elo only counts with UCI_LimitStrength (the UCI convention): a GUI that sends every
    option's default gets the engine's default behaviour, Allie at the opponent's rating."""
    from allie_jax.engine.uci import OPTIONS

    h, lines = handler(allie)
    h.handle("uci")
    for line in [x for x in lines if x.startswith("option name")]:
        name, decl = line[len("option name ") :].split(" type ", 1)
        if " default " in decl:
            default = decl.split(" default ", 1)[1].split(" min ")[0].split(" var ")[0]
            h.handle(f"setoption name {name} value {default}")
    assert "UCI_LimitStrength" in OPTIONS
    h.handle("setoption name OppoElo value 1900")
    assert h.own_elo() == (1900, "the opponent's rating")
    h.handle("setoption name UCI_LimitStrength value true")
    h.handle("setoption name UCI_Elo value 1200")
    assert h.own_elo() == (1200, "UCI_Elo")
    h.handle("setoption name SelfElo value 2100")
    assert h.own_elo() == (2100, "SelfElo")


def test_lichess_bot_engine_accepts_current_and_older_signatures(allie, monkeypatch):
    """lichess-bot calls ``Engine(commands, options, stderr, draw_or_resign, game, debug,
    cwd=...)`` since December 2025 (``debug`` added), before that without ``debug``. A stand-in
    ``lib.engine_wrapper.MinimalEngine`` with today's signature (lichess-bot bedd1d9) checks the
    homemade class forwards both, and tolerates arguments added later."""
    import importlib
    import types

    seen = []

    class MinimalEngine:  # lichess-bot's __init__ (lib/engine_wrapper.py), arguments only
        def __init__(self, commands, options, stderr, draw_or_resign, game, debug, **popen_args):
            seen.append((game, debug, popen_args))

    lib = types.ModuleType("lib")
    wrapper = types.ModuleType("lib.engine_wrapper")
    wrapper.MinimalEngine = MinimalEngine
    monkeypatch.setitem(sys.modules, "lib", lib)
    monkeypatch.setitem(sys.modules, "lib.engine_wrapper", wrapper)
    from allie_jax.engine import lichess_bot

    module = importlib.reload(lichess_bot)
    try:
        monkeypatch.setattr(module, "load_allie", lambda checkpoint, mode: allie)
        game = types.SimpleNamespace(id="g1", opponent=types.SimpleNamespace(rating=1800))
        opts = {"checkpoint": "unused", "mode": "policy", "human_pacing": False}
        engine = module.AllieEngine(["x"], opts, None, {}, game, False, cwd="/tmp")
        assert engine.game is game and seen[-1] == (game, False, {"cwd": "/tmp"})
        board = chess.Board()
        limit = chess.engine.Limit(white_clock=60, black_clock=60, white_inc=1, black_inc=1)
        result = engine.search(board, limit, False, False, [])
        assert result.move in board.legal_moves
        with pytest.raises(TypeError):  # today's MinimalEngine needs ``debug``: passed through
            module.AllieEngine(["x"], opts, None, {}, game)
        wrapper.MinimalEngine.__init__ = lambda self, *a, **k: seen.append((a, k))
        engine = module.AllieEngine(["x"], opts, None, {}, game, False, True, extra=1)
        assert engine.game is game  # arguments a future lichess-bot adds pass through
    finally:
        monkeypatch.undo()
        importlib.reload(lichess_bot)


@pytest.mark.slow
def test_game_at_10_plus_0_1_on_a_loaded_cpu_is_never_lost_on_time(tmp_path):
    """The UCI engine (``adaptive``, tiny model) against Stockfish at 10+0.1 with a real clock
    kept by the driver, while two other processes spin on the CPU: no flag, no move a model did
    not choose, every move within its limit plus ``MARGIN_S``."""
    from allie_jax.model.checkpoint import save_model

    sf_path = require_stockfish()
    ckpt = tmp_path / "tiny"
    save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), ckpt)
    allie = chess.engine.SimpleEngine.popen_uci(uci_command(ckpt), cwd=REPO, timeout=1200)
    sf = chess.engine.SimpleEngine.popen_uci(sf_path)
    try:
        allie.configure({"Mode": "adaptive", "OppoElo": 1350})
        allie.ping()  # isready: every shape compiles here, off the clock
        sf.configure({"UCI_LimitStrength": True, "UCI_Elo": 1350})
        with busy_processes(2):
            out = play_game(allie, sf, 10.0, 0.1, allie_white=True, max_plies=240)
        assert out["moves"] >= 10
        assert out["flag"] == 0 and out["junk"] == 0 and out["over"] == 0, out
    finally:
        allie.quit()
        sf.quit()
