"""The UCI engine: protocol behaviour in-process, then a real subprocess driven by python-chess."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import chess
import chess.engine
import pytest
from flax import nnx

from allie_jax.engine import Decision
from allie_jax.engine.uci import (
    UciHandler,
    infer_time_control,
    parse_opponent,
    value_to_cp,
    value_to_wdl,
)
from allie_jax.game import Game
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.modes import MODES
from allie_jax.player import PlayerBase

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ScriptedAllie(PlayerBase):
    """A stand-in for Allie: first legal move, a fixed think time, records what it was asked
    (a board-reading ``Player`` with ``PlayerBase``'s defaults: no warm-up, no FEN history)."""

    modes = MODES

    def __init__(self, think_time_s: float = 0.0, resign: bool = False):
        self.think_time_s = think_time_s
        self.resign = resign
        self.calls: list[tuple[Game, str | None, str, dict]] = []

    def _board(self, game, fen):
        board = chess.Board(fen) if fen else chess.Board()
        for m in game.moves:
            board.push_uci(m)
        return board

    def predict(self, games, *, start_fens=None):
        from allie_jax.engine import Prediction

        fens = start_fens or [None] * len(games)
        out = []
        for g, f in zip(games, fens, strict=True):
            legal = [m.uci() for m in self._board(g, f).legal_moves]
            out.append(Prediction({m: 1 / len(legal) for m in legal}, 1.0, 0.25, False))
        return out

    def play(self, games, preset, rng, *, start_fens=None, **overrides):
        fens = start_fens or [None] * len(games)
        out = []
        for g, f in zip(games, fens, strict=True):
            self.calls.append((g, f, preset, overrides))
            legal = sorted(m.uci() for m in self._board(g, f).legal_moves)
            probs = {m: 1 / len(legal) for m in legal}
            out.append(Decision(legal[0], self.think_time_s, 0.5, self.resign, 0, probs))
        return out


def make_handler(allie) -> tuple[UciHandler, list[str]]:
    lines: list[str] = []
    return UciHandler(lambda: allie, lines.append, warmup=False), lines


def wait_for(lines, prefix, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hits = [line for line in lines if line.startswith(prefix)]
        if hits:
            return hits
        time.sleep(0.005)
    raise AssertionError(f"no {prefix!r} line within {timeout}s: {lines[-5:]}")


def test_uci_handshake_lists_options():
    h, lines = make_handler(ScriptedAllie())
    h.handle("uci")
    assert lines[0].startswith("id name") and lines[-1] == "uciok"
    names = {line.split()[2] for line in lines if line.startswith("option name")}
    for opt in [
        "UCI_Elo", "SelfElo", "OppoElo", "UCI_Opponent", "Mode", "MeanSims", "MaxSims",
        "Temperature", "HumanPacing", "AllowResign", "UCI_ShowWDL", "MultiPV", "Seed",
    ]:  # fmt: skip
        assert opt in names
    h.handle("isready")
    assert lines[-1] == "readyok"


def test_game_header_from_options_and_first_go():
    allie = ScriptedAllie()
    h, lines = make_handler(allie)
    h.handle("setoption name UCI_Opponent value none 1720 human someone")
    h.handle("setoption name SelfElo value 1400")
    h.handle("setoption name Mode value search")
    h.handle("position startpos moves e2e4")
    h.handle("go wtime 179000 btime 180000 winc 2000 binc 2000")
    wait_for(lines, "bestmove")
    game, fen, preset, _ = allie.calls[-1]
    assert fen is None and game.moves == ["e2e4"]
    assert (game.white_elo, game.black_elo) == (1720, 1400)  # engine is black
    assert game.time_control == "180+2" and preset == "search"
    # the same game continues: the time control stays that of the first go
    h.handle("position startpos moves e2e4 e7e5 g1f3")
    h.handle("go wtime 100000 btime 50000 winc 2000 binc 2000")
    wait_for(lines, "bestmove")
    assert allie.calls[-1][0].time_control == "180+2"
    h.handle("ucinewgame")
    h.handle("position startpos")
    calls = len(allie.calls)
    h.handle("go wtime 300000 btime 300000")
    # a loaded box may take longer than a moment to reach the model: wait for the call itself
    until = time.monotonic() + 60
    while len(allie.calls) == calls and time.monotonic() < until:
        time.sleep(0.01)
    h.handle("stop")
    assert len(allie.calls) > calls and allie.calls[-1][0].time_control == "300+0"


def test_illegal_position_is_rejected_and_previous_kept():
    allie = ScriptedAllie()
    h, lines = make_handler(allie)
    h.handle("position startpos moves e2e4 e7e5")
    h.handle("position startpos moves e2e4 e7e6 e1e3")
    assert any("illegal move 3 'e1e3'" in line for line in lines)
    h.handle("position fen not a fen")
    assert any("invalid fen" in line for line in lines)
    h.handle("go movetime 1000")
    best = wait_for(lines, "bestmove")[-1].split()[1]
    board = chess.Board()
    board.push_uci("e2e4")
    board.push_uci("e7e5")
    assert chess.Move.from_uci(best) in board.legal_moves


class PeakedAllie(ScriptedAllie):
    """Its prior prefers the *last* legal move in sorted order (never python-chess's first
    generated one), and ``play`` can be held until released."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.release.set()

    def predict(self, games, *, start_fens=None):
        from allie_jax.engine import Prediction

        fens = start_fens or [None] * len(games)
        out = []
        for g, f in zip(games, fens, strict=True):
            legal = sorted(m.uci() for m in self._board(g, f).legal_moves)
            probs = {m: 0.5 / (len(legal) - 1) for m in legal[:-1]}
            probs[legal[-1]] = 0.5
            out.append(Prediction(probs, 1.0, 0.25, False))
        return out

    def play(self, games, preset, rng, *, start_fens=None, **overrides):
        self.release.wait()
        return super().play(games, preset, rng, start_fens=start_fens, **overrides)


def test_a_forced_answer_plays_the_root_prior_never_the_first_legal_move():
    allie = PeakedAllie()
    allie.release.clear()  # the search never finishes in time
    h, lines = make_handler(allie)
    h.handle("position startpos moves e2e4")
    h.handle("go movetime 400")
    best = wait_for(lines, "bestmove")[0].split()[1]
    board = chess.Board()
    board.push_uci("e2e4")
    prior = allie.predict([Game(moves=["e2e4"])])[0].move_probs
    assert best == max(prior, key=prior.get)
    assert best != next(iter(board.legal_moves)).uci()
    assert any(" path fallback" in line for line in lines)
    assert h.path_counts == {"fallback": 1}
    allie.release.set()
    # stop while searching: the same fallback, once
    allie.release.clear()
    lines.clear()
    h.handle("go infinite")
    time.sleep(0.2)
    h.handle("stop")
    assert [line for line in lines if line.startswith("bestmove")] == [f"bestmove {best}"]
    allie.release.set()
    assert h.close()
    assert h.path_counts["fallback"] == 2


def test_every_move_names_its_path():
    h, lines = make_handler(ScriptedAllie())
    h.handle("position startpos")
    for _ in range(3):
        h.handle("go movetime 2000")
        end = time.monotonic() + 10
        while not h.path_counts.total() or h.thinking:
            assert time.monotonic() < end
            time.sleep(0.005)
    assert h.path_counts == {"prior": 3}  # the stand-in's decisions ran no simulation
    assert len([line for line in lines if " path prior " in line]) == 3


def test_ponder_waits_for_ponderhit_then_answers():
    allie = ScriptedAllie()
    h, lines = make_handler(allie)
    h.handle("setoption name Ponder value true")
    h.handle("position startpos moves e2e4 e7e5")
    h.handle("go ponder wtime 60000 btime 60000")
    end = time.monotonic() + 10
    while not allie.calls:  # decided while pondering ...
        assert time.monotonic() < end
        time.sleep(0.005)
    time.sleep(0.1)
    assert not [line for line in lines if line.startswith("bestmove")]  # ... but not sent
    h.handle("ponderhit")
    best = wait_for(lines, "bestmove")[0].split()
    board = chess.Board()
    for m in ("e2e4", "e7e5"):
        board.push_uci(m)
    assert chess.Move.from_uci(best[1]) in board.legal_moves
    assert best[2] == "ponder"  # the expected reply, legal after the move
    board.push_uci(best[1])
    assert chess.Move.from_uci(best[3]) in board.legal_moves
    # stop during ponder answers too
    lines.clear()
    h.handle("go ponder wtime 60000 btime 60000")
    time.sleep(0.1)
    h.handle("stop")
    assert len([line for line in lines if line.startswith("bestmove")]) == 1


def test_unreadable_fen_is_said_once_and_plays_the_fallback():
    from allie_jax.engine.api import Allie

    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    h, lines = make_handler(allie)
    fen = "8/8/8/8/8/4k3/8/4K2R w K - 0 1"  # K+R v K: no short history from the start
    h.handle(f"position fen {fen}")
    h.handle("go nodes 4")
    wait_for(lines, "bestmove", timeout=300)
    h.handle(f"position fen {fen} moves e1g1 e3d3")
    h.handle("go nodes 4")
    end = time.monotonic() + 60
    while len([line for line in lines if line.startswith("bestmove")]) < 2:
        assert time.monotonic() < end
        time.sleep(0.01)
    assert h.close()
    assert len([line for line in lines if line.startswith("info string no history")]) == 1
    assert h.path_counts == {"fallback": 2}


def test_fen_start_plays_from_a_found_history():
    from allie_jax.engine.api import Allie

    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    seen = []
    play = allie.play

    def spy(games, *args, **kwargs):
        seen.append((list(games[0].moves), kwargs.get("start_fens")))
        return play(games, *args, **kwargs)

    allie.play = spy
    h, lines = make_handler(allie)
    real = chess.Board()
    for m in ("e2e4", "c7c5", "g1f3", "d7d6", "d2d4", "c5d4"):
        real.push_uci(m)
    fen = real.fen()
    h.handle(f"position fen {fen} moves f3d4")
    h.handle("setoption name Mode value policy")
    h.handle("go nodes 4")
    wait_for(lines, "bestmove", timeout=300)  # compiles the policy path (no warm-up here)
    assert h.close()
    assert any(line.startswith("info string playing from a history") for line in lines)
    moves, fens = seen[-1]
    assert fens == [None]
    board = chess.Board()  # python-chess replays the history: it reaches the FEN exactly
    for m in moves[:-1]:
        board.push_uci(m)
    assert board.board_fen() == real.board_fen() and board.turn == real.turn
    assert board.castling_rights == real.castling_rights and moves[-1] == "f3d4"
    assert h.path_counts == {"prior": 1}


def test_infinite_waits_for_stop_and_isready_answers_while_thinking():
    h, lines = make_handler(ScriptedAllie())
    h.handle("position startpos")
    h.handle("go infinite")
    wait_for(lines, "info depth")
    h.handle("isready")
    assert lines[-1] == "readyok"
    assert not [line for line in lines if line.startswith("bestmove")]
    h.handle("stop")
    assert len([line for line in lines if line.startswith("bestmove")]) == 1


def test_human_pacing_waits_the_prediction_but_not_past_the_clock():
    h, lines = make_handler(ScriptedAllie(think_time_s=0.6))
    h.handle("setoption name HumanPacing value true")
    h.handle("position startpos")
    t = time.monotonic()
    h.handle("go wtime 60000 btime 60000")
    wait_for(lines, "bestmove")
    assert 0.5 <= time.monotonic() - t < 3.0
    lines.clear()
    t = time.monotonic()
    h.handle("go wtime 1200 btime 60000")  # 1.2 s left: budget = min(0.3, 0.2) s
    wait_for(lines, "bestmove")
    assert time.monotonic() - t < 0.45


def test_resign_info_line_only_when_allowed():
    h, lines = make_handler(ScriptedAllie(resign=True))
    h.handle("position startpos")
    h.handle("go movetime 1000")
    wait_for(lines, "bestmove")
    assert "info string resign" not in lines
    h.handle("setoption name AllowResign value true")
    h.handle("go movetime 1000")
    wait_for(lines, "info string resign")
    assert h.last_decision is not None and h.last_decision.resigned


def test_score_and_wdl_lines():
    h, lines = make_handler(ScriptedAllie())
    h.handle("setoption name UCI_ShowWDL value true")
    h.handle("position startpos moves e2e4")  # black to move; value_white = 0.5
    h.handle("go movetime 1000")
    wait_for(lines, "bestmove")
    info = next(line for line in lines if line.startswith("info depth"))
    assert f"score cp {value_to_cp(-0.5)}" in info and "wdl 250 0 750" in info


def test_helpers():
    assert parse_opponent("none 1500 human Bob") == 1500
    assert parse_opponent("GM 2700 computer Some Engine") == 2700
    assert parse_opponent("none none human Anonymous") is None
    assert infer_time_control(180.0, 2.0) == "180+2"
    assert infer_time_control(177.3, 0.0) == "180+0"
    assert infer_time_control(900.0, 10.0) == "900+10"
    cps = [value_to_cp(v) for v in (-1, -0.5, 0, 0.5, 1)]
    assert cps == sorted(cps) and cps[2] == 0 and cps[1] == -cps[3]
    assert sum(value_to_wdl(0.3)) == 1000


# ---------------------------------------------------------------- a real engine process


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from allie_jax.model.checkpoint import save_model

    path = tmp_path_factory.mktemp("uci") / "tiny"
    save_model(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)), path)
    return path


def _engine_cmd(checkpoint) -> list[str]:
    return [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "launch.uci",
        "--checkpoint",
        str(checkpoint),
    ]


def test_simple_engine_plays_legal_moves(checkpoint):
    engine = chess.engine.SimpleEngine.popen_uci(_engine_cmd(checkpoint), cwd=REPO, timeout=120)
    try:
        assert "Allie" in engine.id["name"]
        engine.configure({"Mode": "policy", "OppoElo": 1600, "UCI_ShowWDL": True})
        board = chess.Board()
        rng = __import__("random").Random(0)
        for ply in range(24):
            if board.is_game_over():
                break
            if ply % 2 == 0:
                limit = chess.engine.Limit(
                    white_clock=180, black_clock=180, white_inc=2, black_inc=2
                )
                result = engine.play(board, limit, info=chess.engine.INFO_ALL)
                assert result.move in board.legal_moves
                assert result.info["score"].relative.score() is not None
                assert result.info.get("wdl") is not None
                board.push(result.move)
            else:
                board.push(rng.choice(list(board.legal_moves)))
        # movetime is honoured (the engine answers by it): give the three lines time to come
        infos = engine.analyse(board, chess.engine.Limit(time=1.0), multipv=3)
        assert len(infos) == 3
        assert all(i["pv"][0] in board.legal_moves for i in infos)
        assert len({i["pv"][0] for i in infos}) == 3
    finally:
        engine.quit()


def test_eof_on_stdin_exits_cleanly(checkpoint):
    proc = subprocess.Popen(
        _engine_cmd(checkpoint),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Mode policy: isready compiles the policy path only (the search's warm-up and restart are
    # covered in test_aot.py and test_play_clock.py), so this stays quick on a cold CI cache
    commands = "uci\nsetoption name Mode value policy\nisready\nposition startpos\ngo movetime 50\n"
    out, err = proc.communicate(commands, timeout=900)
    assert proc.returncode == 0, err[-4000:]  # -X faulthandler: a crash's stacks are in err
    assert "uciok" in out and "readyok" in out and "bestmove" in out


def test_uci_is_answered_before_the_model_loads():
    gate = threading.Event()

    def slow_loader():
        gate.wait(5)
        return ScriptedAllie()

    lines: list[str] = []
    h = UciHandler(slow_loader, lines.append, warmup=False)
    t = time.monotonic()
    h.handle("uci")
    assert lines[-1] == "uciok" and time.monotonic() - t < 0.5
    gate.set()
    h.handle("isready")
    assert lines[-1] == "readyok"


def test_go_right_after_bestmove_is_never_refused():
    """Regression: a GUI's next go can arrive before the worker thread has exited."""
    h, lines = make_handler(ScriptedAllie())
    h.handle("position startpos")
    for i in range(50):
        h.handle("go movetime 10")
        end = time.monotonic() + 5
        while sum(line.startswith("bestmove") for line in lines) <= i:
            assert time.monotonic() < end
            time.sleep(0.0005)
    assert not any("already thinking" in line for line in lines)


def test_nothing_heavy_is_imported_before_uciok():
    """``uci`` is answered by a process that has not imported JAX (or the model code): the
    launcher, the handler, the time manager, the FEN histories and the Maia spec check are
    light, and the loader imports the rest after ``uciok``."""
    code = (
        "import sys, launch.uci\n"
        "from allie_jax.engine import uci, time_manager, fen_history, pacing\n"
        "from allie_jax.baselines import maia_uci\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'torch')]\n"
        "heavy += [m for m in sys.modules if m in ('allie_jax.engine.api', 'allie_jax.model')]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_uciok_comes_before_the_loader_runs(tmp_path):
    """The real launcher: ``uciok`` is on stdout before the loader has imported anything (a
    checkpoint that does not load yet passes the launcher's light checks: the error comes at
    ``isready``, after ``uciok``)."""
    bad = tmp_path / "empty_dir"
    bad.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "launch.uci", "--checkpoint", str(bad)],
        cwd=REPO,
        input="uci\nisready\nquit\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0
    assert "uciok" in lines and "readyok" in lines
    error = next(i for i, line in enumerate(lines) if "error loading the model" in line)
    assert lines.index("uciok") < error < lines.index("readyok")


def test_unread_fen_goes_to_the_board_model():
    """No history for the FEN and a board-reading ``fen_model``: that model decides (and its
    prior is the fallback), said once."""
    from allie_jax.engine.api import Allie

    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    reader = PeakedAllie()
    allie.fen_model = reader
    h, lines = make_handler(allie)
    fen = "8/8/8/8/8/4k3/8/4K2R w K - 0 1"
    for moves in ("", " moves e1g1 e3d3"):
        h.handle(f"position fen {fen}{moves}")
        h.handle("go movetime 60000")
        end = time.monotonic() + 120
        while h.thinking:
            assert time.monotonic() < end
            time.sleep(0.01)
    assert h.close()
    board = chess.Board(fen)
    assert [line for line in lines if line.startswith("bestmove")][0] == (
        f"bestmove {sorted(m.uci() for m in board.legal_moves)[0]}"  # the reader's choice
    )
    said = [line for line in lines if line.startswith("info string no history")]
    assert len(said) == 1 and "board model" in said[0]
    assert [c[1] for c in reader.calls] == [fen, fen] and h.path_counts == {"prior": 2}


def test_bad_fen_model_is_one_clear_error(capsys, tmp_path):
    from launch.uci import main

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for spec, words in (("lc0:x", "expected maia:DIR"), ("maia:/no/such/dir", "/no/such/dir")):
        with pytest.raises(SystemExit) as exc:
            main(["--checkpoint", str(ckpt), "--fen_model", spec])
        assert exc.value.code == 2 and words in capsys.readouterr().err


def test_a_timed_out_history_search_gets_twice_the_time_next(monkeypatch):
    """The engine searches a FEN's history again at each move until it is found; on a busy
    machine every try of the same length can run out of time, so each retry doubles the time
    (up to MAX_RETRY_FACTOR), and the history a long enough search finds is then cached."""
    import collections

    from allie_jax.engine import fen_history

    monkeypatch.setattr(fen_history, "_CACHE", collections.OrderedDict())
    monkeypatch.setattr(fen_history, "_TIMEOUTS", collections.OrderedDict())
    # an EPD book's FEN (move number 1: the bound is the 24-ply maximum, a slow search)
    fen = "rn1qkbnr/ppp2ppp/3p4/4p3/2B1P3/5b2/PPPP1PPP/RNBQ1RK1 w kq - 0 1"
    limits: list[float] = []
    real = fen_history._search

    def out_of_time(target, max_plies, max_nodes, time_limit_s, strict):
        limits.append(time_limit_s)
        return fen_history.History(target.board.fen(), None, "out of time", 0, True)

    monkeypatch.setattr(fen_history, "_search", out_of_time)
    for _ in range(6):
        result = fen_history.find_history(fen, time_limit_s=1.0)
        assert result.timed_out and fen_history.cached(fen) is None
    # two passes (strict, then every move) share each call's time
    factors = [1, 2, 4, 8, 16, 16]
    assert limits == [0.5 * f for f in factors for _ in (0, 1)]
    monkeypatch.setattr(fen_history, "_search", real)
    found = fen_history.find_history(fen, time_limit_s=4.0)  # 64 s: ample on a busy machine
    assert found.found and fen_history.cached(fen) == found
    board = chess.Board()
    for move in found.moves:
        board.push_uci(move)
    assert board.epd() == chess.Board(fen).epd()  # python-chess: the exact position
    assert fen not in fen_history._TIMEOUTS


def test_virtual_loss_option_reaches_the_search_and_matches_the_config():
    """``VirtualLoss`` (spelt in uci_options so uciok needs no JAX) names SearchConfig's rules
    and is passed to the search with LeafBatch; a bad value is refused by name."""
    from allie_jax.engine import uci_options
    from allie_jax.search.config import VIRTUAL_LOSSES, SearchConfig

    assert uci_options.VIRTUAL_LOSSES == VIRTUAL_LOSSES
    assert SearchConfig().virtual_loss in VIRTUAL_LOSSES
    o = uci_options.Options(mode="search")
    uci_options.OPTIONS["VirtualLoss"][1](o, "Loss")
    uci_options.OPTIONS["LeafBatch"][1](o, "8")
    _, overrides = uci_options.play_settings(o)
    assert overrides["virtual_loss"] == "loss" and overrides["leaf_batch"] == 8
    with pytest.raises(ValueError, match="'lost' is not one of loss, visit"):
        uci_options.OPTIONS["VirtualLoss"][1](o, "lost")
