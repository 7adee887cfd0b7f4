"""``launch.play``: game sessions, the HTTP API (every refusal a 4xx JSON error) and the page in a
real browser (Debian's chromium driven by playwright)."""

from __future__ import annotations

import http.client
import io
import json
import os
import pathlib
import shutil
import threading
import time

import chess
import chess.pgn
import pytest
from flax import nnx

from allie_jax.engine.api import Allie, Decision
from allie_jax.engine.web import GameSession, GameSettings, PlayApp, RequestError, allie_player
from allie_jax.engine.web.server import make_server, url_of
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.xdist_group("play_web")  # one worker compiles the model once


@pytest.fixture(scope="module")
def allie() -> Allie:
    """A tiny untrained model, compiled here so no timed wait below includes compilation."""
    from allie_jax.game import Game

    allie = Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))
    allie.play([Game(moves=["e2e4"], white_elo=1500, black_elo=1500)], "policy")
    return allie


@pytest.fixture(scope="module")
def server(allie):
    """The real server on a free port, with a real (tiny, untrained) model behind it."""
    srv = make_server(PlayApp(allie_player(allie), checkpoint="tiny (test)"), port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _request(server, method: str, path: str, body=None, raw: bytes | None = None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=300)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    ctype = resp.getheader("Content-Type", "")
    return resp.status, (json.loads(payload) if ctype == "application/json" else payload), resp


def _new(server, **settings):
    status, state, _ = _request(server, "POST", "/api/new", {"mode": "policy", **settings})
    assert status == 201, state
    return state


# ------------------------------------------------------------------ HTTP: errors
def test_bad_requests_get_4xx_json_errors(server):
    cases = [
        ("GET", "/nope", None, None, 404, "no such page"),
        ("GET", "/static/../server.py", None, None, 404, "no such file"),
        ("GET", "/static/%2e%2e/server.py", None, None, 404, "no such file"),
        ("GET", "/api/new", None, None, 405, "use POST"),
        ("POST", "/api/state", {}, None, 405, "use GET"),
        ("DELETE", "/api/new", None, None, 405, "use POST"),
        ("POST", "/api/new", None, b"{not json", 400, "not JSON"),
        ("POST", "/api/new", [1, 2], None, 400, "JSON object"),
        ("POST", "/api/new", {"colour": "white"}, None, 400, "unknown setting(s) ['colour']"),
        ("POST", "/api/new", {"engine_elo": 99}, None, 400, "engine_elo 99"),
        ("POST", "/api/new", {"engine_elo": "1500"}, None, 400, "engine_elo '1500'"),
        ("POST", "/api/new", {"mode": "strong"}, None, 400, "mode 'strong'"),
        ("POST", "/api/new", {"human_colour": "red"}, None, 400, "human_colour 'red'"),
        ("POST", "/api/new", {"base_s": -1}, None, 400, "base_s -1"),
        ("POST", "/api/new", {"human_pacing": "yes"}, None, 400, "human_pacing 'yes'"),
        ("POST", "/api/new", None, b"x" * 20000, 413, "over"),
        ("GET", "/api/state", None, None, 400, "missing game id"),
        ("GET", "/api/state?id=zzz", None, None, 404, "no game with id 'zzz'"),
        ("GET", "/api/pgn?id=zzz", None, None, 404, "no game with id 'zzz'"),
        ("POST", "/api/move", {"uci": "e2e4"}, None, 400, "missing game id"),
    ]
    for method, path, body, raw, want_status, want_text in cases:
        status, data, _ = _request(server, method, path, body, raw)
        assert status == want_status, (method, path, status, data)
        assert want_text in data["error"], (method, path, data)


def test_moves_are_checked_by_python_chess(server):
    game = _new(server, human_colour="white")
    gid = game["id"]
    assert sorted(game["legal_moves"]) == sorted(m.uci() for m in chess.Board().legal_moves)
    for uci, status, text in [
        ("e2e5", 400, "'e2e5' is illegal in rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w"),
        ("hello", 400, "'hello' is not UCI"),
        (42, 400, "expected a UCI string"),
        ("e7e5", 400, "illegal"),  # Black's move on White's turn
    ]:
        got, data, _ = _request(server, "POST", "/api/move", {"id": gid, "uci": uci})
        assert (got, text in data["error"]) == (status, True), data
    got, data, _ = _request(server, "POST", "/api/move", {"id": gid})
    assert got == 400 and "missing 'uci'" in data["error"]
    got, data, _ = _request(server, "POST", "/api/engine", {"id": gid})
    assert got == 409 and "your turn" in data["error"]
    got, state, _ = _request(server, "POST", "/api/move", {"id": gid, "uci": "e2e4"})
    assert got == 200 and state["moves"] == ["e2e4"] and state["engine_to_move"]
    got, data, _ = _request(server, "POST", "/api/move", {"id": gid, "uci": "d2d4"})
    assert got == 409 and "engine's turn" in data["error"]


def test_promotion_without_its_piece_is_explained():
    session = GameSession(GameSettings(base_s=0))
    session.board = chess.Board("8/4P3/8/8/8/8/k7/4K3 w - - 0 1")
    with pytest.raises(RequestError, match="promotion needs its piece") as err:
        session.human_move("e7e8")
    assert err.value.status == 400
    session.human_move("e7e8q")
    assert session.board.piece_at(chess.E8) == chess.Piece(chess.QUEEN, chess.WHITE)


# ------------------------------------------------------------------ HTTP: a game
def test_a_game_through_the_api_with_the_real_model(server):
    # a long clock: the first engine move includes compiling the model (slow on a loaded CI box)
    state = _new(server, human_colour="black", engine_elo=1800, human_elo=1200, base_s=3600)
    gid = state["id"]
    assert state["engine_to_move"] and state["moves"] == []
    board = chess.Board()
    for _ in range(3):
        got, state, _ = _request(server, "POST", "/api/engine", {"id": gid})
        assert got == 200, state
        engine_uci = state["moves"][-1]
        assert chess.Move.from_uci(engine_uci) in board.legal_moves
        board.push_uci(engine_uci)
        info = state["last_engine_move"]
        assert info["uci"] == engine_uci and info["san"] == state["san"][-1]
        assert info["predicted_think_s"] >= 0 and -1 <= info["value_white"] <= 1
        assert 1 <= len(info["top_moves"]) <= 3
        assert state["clocks"]["white"] <= 3600 + 3 * 3  # charged, plus at most 3 increments
        reply = sorted(state["legal_moves"])[0]
        assert sorted(state["legal_moves"]) == sorted(m.uci() for m in board.legal_moves)
        got, state, _ = _request(server, "POST", "/api/move", {"id": gid, "uci": reply})
        assert got == 200, state
        board.push_uci(reply)
    assert state["fen"] == board.fen()
    got, state, _ = _request(server, "POST", "/api/resign", {"id": gid})
    assert got == 200 and state["result"] == "1-0" and state["termination"] == "human resigned"
    got, data, _ = _request(server, "POST", "/api/move", {"id": gid, "uci": "a2a3"})
    assert got == 409 and "game is over" in data["error"]

    got, pgn, resp = _request(server, "GET", f"/api/pgn?id={gid}")
    assert got == 200 and "attachment" in resp.getheader("Content-Disposition")
    game = chess.pgn.read_game(io.StringIO(pgn.decode()))
    assert [m.uci() for m in game.mainline_moves()] == [m.uci() for m in board.move_stack]
    h = game.headers
    assert (h["White"], h["WhiteElo"], h["BlackElo"]) == ("Allie (policy, 1800)", "1800", "1200")
    assert (h["Result"], h["TimeControl"]) == ("1-0", "3600+3")
    first = game.next()
    assert first.clock() is not None and "predicted" in first.comment


def test_static_page_and_vendored_board(server):
    status, body, resp = _request(server, "GET", "/")
    assert status == 200 and b"play.js" in body
    status, body, resp = _request(server, "GET", "/static/vendor/cm-chessboard/src/Chessboard.js")
    assert status == 200 and resp.getheader("Content-Type") == "text/javascript"
    status, body, _ = _request(server, "GET", "/static/vendor/cm-chessboard/LICENSE")
    assert status == 200 and b"MIT License" in body


# ------------------------------------------------------------------ sessions: clocks and pacing
class _FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def _decision(move: str, think: float) -> Decision:
    return Decision(move, think, 0.1, False, 8, {move: 0.6, "d2d4": 0.4})


def test_clocks_increments_pacing_and_flag():
    clock = _FakeTime()
    settings = GameSettings(human_colour="black", base_s=60, increment_s=2, human_pacing=True)
    session = GameSession(settings, clock=clock, sleep=clock.sleep)

    def play(game, mode):
        assert (game.white_elo, game.black_elo, game.time_control) == (1500, 1500, "60+2")
        clock.t += 0.5  # the model's own compute
        return _decision("e2e4", 7.0)

    info = session.engine_move(play)
    # paced to the predicted 7 s (the clock's budget is 60/4 + 2 = 17 s): 6.5 s more after compute
    assert clock.slept == [pytest.approx(6.5)] and info.spent_s == pytest.approx(7.0)
    assert session.time_left(chess.WHITE) == pytest.approx(60 - 7 + 2)
    clock.t += 10
    assert session.time_left(chess.BLACK) == pytest.approx(50)  # Black's clock is running
    session.human_move("e7e5")
    assert session.time_left(chess.BLACK) == pytest.approx(52)
    clock.t += 100  # the engine's side (White) hangs past its 55 s
    assert session.state()["result"] == "0-1" and session.termination == "Time forfeit"
    with pytest.raises(RequestError, match="game is over"):
        session.engine_move(play)


def test_engine_resignation_ends_the_game():
    session = GameSession(GameSettings(human_colour="black", base_s=0))
    session.engine_move(lambda g, m: Decision("e2e4", 1.0, -0.95, True, 0, {"e2e4": 1.0}))
    assert (session.result, session.termination) == ("0-1", "engine resigned")
    assert session.state()["legal_moves"] == []


def test_settings_random_colour():
    assert GameSettings.from_request({"human_colour": "random"}, rng=lambda: True).human_colour == (
        "white"
    )
    assert GameSettings.from_request(
        {"human_colour": "random"}, rng=lambda: False
    ).human_colour == ("black")


# ------------------------------------------------------------------ the page in a real browser
def _need_chromium() -> None:
    have = os.path.exists(CHROMIUM)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        have = False
    if not have:
        msg = f"needs {CHROMIUM} (apt-get install chromium) and playwright (the dev extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def test_play_three_moves_in_chromium(server, tmp_path):
    """Load the page, play three moves by clicking and dragging, see the engine answer each."""
    _need_chromium()
    from playwright.sync_api import sync_playwright

    t0 = time.perf_counter()
    url = url_of(server)
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    args += ["--disable-component-update", "--disable-sync"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("body[data-status=ready]", timeout=60_000)
        page.select_option("select[name=mode]", "policy")
        page.fill("input[name=engine_elo]", "1700")
        page.click("#new-game")
        page.wait_for_selector("body[data-status=human]", timeout=60_000)

        def centre(name: str) -> tuple[float, float]:
            box = page.locator(f'#board rect[data-square="{name}"]').bounding_box()
            return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

        # move 1 and 3 by two clicks, move 2 by dragging
        plan = [("e2", "e4", "click"), ("g1", "f3", "drag"), ("f1", "c4", "click")]
        for ply, (src, dst, how) in enumerate(plan):
            board = chess.Board()
            state = page.evaluate("fetch('/api/state?id=' + currentId()).then(r => r.json())")
            for m in state["moves"]:
                board.push_uci(m)
            move = chess.Move.from_uci(src + dst)
            if move not in board.legal_moves:  # the engine's reply blocked our plan
                move = sorted(board.legal_moves, key=lambda m: m.uci())[0]
                src, dst = chess.square_name(move.from_square), chess.square_name(move.to_square)
            (x0, y0), (x1, y1) = centre(src), centre(dst)
            if how == "click":
                page.mouse.click(x0, y0)
                page.mouse.click(x1, y1)
            else:
                page.mouse.move(x0, y0)
                page.mouse.down()
                page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
                page.mouse.move(x1, y1, steps=5)
                page.mouse.up()
            page.wait_for_selector(f"body[data-ply='{2 * ply + 2}']", timeout=180_000)
            page.wait_for_selector("body[data-status=human]", timeout=180_000)
        state = page.evaluate("fetch('/api/state?id=' + currentId()).then(r => r.json())")
        assert len(state["moves"]) == 6
        replay = chess.Board()
        for m in state["moves"]:
            replay.push_uci(m)  # raises if any move were illegal
        shown = page.locator("#moves li").all_inner_texts()
        assert len(shown) == 3 and shown[0].split()[0] == state["san"][0]
        assert page.locator("#ei-move").inner_text() == state["san"][-1]
        assert "s" in page.locator("#ei-think").inner_text()
        page.mouse.move(5, 5)  # no hover highlight in the picture
        shot = tmp_path / "play.png"
        page.screenshot(path=str(shot))
        browser.close()
    assert not errors, errors
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("ALLIE_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, pathlib.Path(keep) / "play.png")
    print(f"browser test: {time.perf_counter() - t0:.1f} s, screenshot {shot}")


def test_launch_play_bad_checkpoint_is_one_line(tmp_path):
    import subprocess
    import sys

    repo = pathlib.Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "launch.play", "--checkpoint", str(tmp_path / "nope")]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("launch.play: error:") and "nope" in last


def test_load_app_from_a_checkpoint_dir(allie, tmp_path):
    from allie_jax.engine.web import load_app
    from allie_jax.model.checkpoint import save_model

    path = save_model(allie.model, tmp_path / "model")
    app = load_app(str(path), warmup_modes=())
    assert app.info()["checkpoint"] == str(path)
    with pytest.raises(ValueError, match="warm-up mode 'fast'"):
        load_app(str(path), warmup_modes=("fast",))
