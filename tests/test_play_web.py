"""``launch.play``: game sessions, the HTTP API (every refusal a 4xx JSON error, malformed HTTP
included) and the page in a real browser (Debian's chromium driven by playwright)."""

from __future__ import annotations

import http.client
import io
import json
import os
import pathlib
import shutil
import socket
import threading
import time

import chess
import chess.pgn
import pytest
from flax import nnx

from allie_jax.engine.api import Allie, Decision
from allie_jax.engine.pacing import Clock, time_budget
from allie_jax.engine.web import GameSession, GameSettings, PlayApp, RequestError, allie_app
from allie_jax.engine.web.server import MAX_BODY, make_server, url_of
from allie_jax.model.config import ModelConfig
from allie_jax.model.transformer import AllieModel

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.xdist_group("play_web")  # one worker compiles the model once


READ_TIMEOUT_S = 2.0  # the test server's read timeout (the real one waits 10 s)


@pytest.fixture(scope="module")
def allie() -> Allie:
    """A tiny untrained model; its first game compiles the policy mode (``preparing``)."""
    return Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))


def _serve(app: PlayApp):
    srv = make_server(app, port=0, read_timeout_s=READ_TIMEOUT_S)
    srv.app = app
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _stop(srv) -> None:
    srv.shutdown()
    srv.server_close()
    srv.app.close()  # no warm-up left compiling when the process exits


@pytest.fixture(scope="module")
def server(allie):
    """The real server on a free port, with a real (tiny, untrained) model behind it."""
    srv = _serve(allie_app(allie, checkpoint="tiny (test)"))
    yield srv
    _stop(srv)


def _request(server, method: str, path: str, body=None, raw: bytes | None = None, headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=300)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(
        method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    ctype = resp.getheader("Content-Type", "")
    return resp.status, (json.loads(payload) if ctype == "application/json" else payload), resp


def _ready(server, state):
    """The state once the engine has compiled the game's mode (clocks stand still until then)."""
    for _ in range(1200):
        if not state["preparing"]:
            return state
        time.sleep(0.25)
        status, state, _ = _request(server, "GET", f"/api/state?id={state['id']}")
        assert status == 200, state
    raise AssertionError(f"game {state['id']} still preparing")


def _new(server, **settings):
    status, state, _ = _request(server, "POST", "/api/new", {"mode": "policy", **settings})
    assert status == 201, state
    return _ready(server, state)


def _raw_http(server, data: bytes, read_timeout: float = 60.0) -> tuple[int, dict]:
    """Send raw bytes; the status and JSON body of the reply (the server closes after it)."""
    with socket.create_connection(server.server_address[:2], timeout=read_timeout) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    assert b"application/json" in head, head
    return status, json.loads(body)


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
        ("POST", "/api/new", None, b"[" * 5000 + b"]" * 5000, 400, "nested too deep"),
        ("POST", "/api/new", None, b'{"base_s": NaN}', 400, "base_s nan"),
        ("GET", "/static/%00x", None, None, 404, "no such file"),
        ("GET", "/static/vendor%5c..%5c..%5cserver.py", None, None, 404, "no such file"),
        ("GET", "/static/" + "a" * 5000, None, None, 404, "no such file"),
        ("OPTIONS", "/api/new", None, None, 405, "use POST"),
        ("GET", "/api/state", None, None, 400, "missing game id"),
        ("GET", "/api/state?id=zzz", None, None, 404, "no game with id 'zzz'"),
        ("GET", "/api/pgn?id=zzz", None, None, 404, "no game with id 'zzz'"),
        ("POST", "/api/move", {"uci": "e2e4"}, None, 400, "missing game id"),
    ]
    for method, path, body, raw, want_status, want_text in cases:
        status, data, _ = _request(server, method, path, body, raw)
        assert status == want_status, (method, path, status, data)
        assert want_text in data["error"], (method, path, data)


def test_malformed_http_gets_4xx_json_and_frees_the_thread(server):
    """Bad lengths, a body that never arrives (read with a timeout: the thread is freed and the
    client told), chunked bodies, a foreign Host and cross-origin posts: each a 4xx JSON reply,
    and the server still serves afterwards."""
    port = server.server_address[1]
    host = f"127.0.0.1:{port}"

    def post(headers: str, body: bytes = b"") -> tuple[int, dict]:
        head = f"POST /api/new HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
        return _raw_http(server, head.encode() + body)

    json_ct = "Content-Type: application/json\r\n"
    cases = [
        (json_ct + "Content-Length: -5\r\n", b"{}", 400, "negative"),
        (json_ct + "Content-Length: five\r\n", b"{}", 400, "bad Content-Length 'five'"),
        (json_ct + f"Content-Length: {MAX_BODY + 1}\r\n", b"", 413, "over"),
        (json_ct + "Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n", 411, "chunked"),
        ("Content-Type: text/plain\r\nContent-Length: 2\r\n", b"{}", 415, "application/json"),
        # promises 100 bytes, sends 10: answered at the read timeout, not when the client leaves
        (json_ct + "Content-Length: 100\r\n", b'{"mode": 1', 408, "did not arrive"),
    ]
    for headers, body, want, text in cases:
        status, data = post(headers, body)
        assert (status, text in data["error"]) == (want, True), (headers, status, data)
    nested = b"[" * 5000 + b"]" * 5000
    status, data = post(json_ct + f"Content-Length: {len(nested)}\r\n", nested)
    assert status == 400 and "nested too deep" in data["error"]

    games_before = _count_games(server)
    refused = [  # DNS rebinding (a foreign Host) and cross-origin requests from a web page
        ({"Host": f"evil.example:{port}"}, 403, "is not this server"),
        ({"Host": "127.0.0.1:1"}, 403, "is not this server"),
        ({"Origin": "http://evil.example"}, 403, "cross-origin"),
        ({"Origin": "null"}, 403, "cross-origin"),
        ({"Sec-Fetch-Site": "cross-site"}, 403, "cross-site"),
        ({"Origin": "http://evil.example", "Content-Type": "text/plain"}, 403, "cross-origin"),
    ]
    for headers, want, text in refused:
        status, data, _ = _request(server, "POST", "/api/new", {"mode": "policy"}, headers=headers)
        assert (status, text in data["error"]) == (want, True), (headers, status, data)
    status, data, _ = _request(server, "GET", "/api/info", headers={"Host": "evil.example"})
    assert status == 403
    assert _count_games(server) == games_before  # nothing refused made a game
    # the same origin (what the page sends) and localhost are served
    status, state, _ = _request(
        server, "POST", "/api/new", {"mode": "policy"}, headers={"Origin": f"http://{host}"}
    )
    assert status == 201 and state["moves"] == []
    status, _, _ = _request(server, "GET", "/api/info", headers={"Host": f"localhost:{port}"})
    assert status == 200


def _count_games(server) -> int:
    status, info, _ = _request(server, "GET", "/api/info")
    assert status == 200
    return info["games"]


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

    budget = time_budget(Clock(time_left_s=60.0, increment_s=2.0))
    seen = []

    def play(game, mode, budget_s):
        assert (game.white_elo, game.black_elo, game.time_control) == (1500, 1500, "60+2")
        seen.append((game.game_id, budget_s))
        clock.t += 0.5  # the model's own compute
        return _decision("e2e4", 7.0)

    info = session.engine_move(play)
    # the search's budget is the clock's; paced to the predicted 7 s within that budget
    assert seen == [(f"web-{session.id}", pytest.approx(budget))]
    paced = min(7.0, budget)
    assert clock.slept == [pytest.approx(paced - 0.5)] and info.spent_s == pytest.approx(paced)
    assert info.budget_s == pytest.approx(budget)
    assert session.time_left(chess.WHITE) == pytest.approx(60 - paced + 2)
    clock.t += 10
    assert session.time_left(chess.BLACK) == pytest.approx(50)  # Black's clock is running
    session.human_move("e7e5")
    assert session.time_left(chess.BLACK) == pytest.approx(52)
    clock.t += 100  # the engine's side (White) hangs past its clock
    assert session.state()["result"] == "0-1" and session.termination == "Time forfeit"
    with pytest.raises(RequestError, match="game is over"):
        session.engine_move(play)


def test_engine_resignation_ends_the_game():
    session = GameSession(GameSettings(human_colour="black", base_s=0))
    session.engine_move(lambda g, m, b: Decision("e2e4", 1.0, -0.95, True, 0, {"e2e4": 1.0}))
    assert (session.result, session.termination) == ("0-1", "engine resigned")
    assert session.state()["legal_moves"] == []


def test_settings_random_colour():
    assert GameSettings.from_request({"human_colour": "random"}, rng=lambda: True).human_colour == (
        "white"
    )
    assert GameSettings.from_request(
        {"human_colour": "random"}, rng=lambda: False
    ).human_colour == ("black")


def _fake_play(game, mode, budget_s):
    """The first legal move in python-chess's order (a stand-in engine for session logic)."""
    board = chess.Board()
    for m in game.moves:
        board.push_uci(m)
    move = sorted(m.uci() for m in board.legal_moves)[0]
    return _decision(move, 1.0)


def test_flag_against_a_side_without_mating_material_is_a_draw():
    """FIDE 6.9 / lichess: running out of time loses only if the opponent could still mate."""
    for fen, want in [
        ("4k3/8/8/8/8/8/8/3BK3 w - - 0 1", "1/2-1/2"),  # White flags, Black has a lone king
        ("4kb2/8/8/8/8/8/8/4K3 w - - 0 1", "1/2-1/2"),  # king and bishop cannot mate
        ("4k3/8/8/8/8/8/7p/4K3 w - - 0 1", "0-1"),  # a pawn can still promote and mate
        ("4kq2/8/8/8/8/8/8/4K3 w - - 0 1", "0-1"),
    ]:
        clock = _FakeTime()
        session = GameSession(GameSettings(base_s=30, increment_s=0), clock=clock)
        session.board = chess.Board(fen)
        clock.t += 31
        state = session.state()
        board = chess.Board(fen)
        independent = "1/2-1/2" if board.has_insufficient_material(chess.BLACK) else "0-1"
        assert state["result"] == want == independent, (fen, state["termination"])
        assert state["termination"].startswith("Time forfeit")


def test_takeback_draw_offer_and_rematch():
    app = PlayApp(_fake_play, evaluate=lambda game: -0.3)  # Black (the engine here) is better
    session = app.new_game({"human_colour": "white", "base_s": 60, "increment_s": 1})
    with pytest.raises(RequestError, match="not moved yet") as err:
        session.takeback()
    assert err.value.status == 409
    session.human_move("e2e4")
    app.engine_move(session)
    session.human_move("d2d4")
    app.engine_move(session)
    assert len(session.board.move_stack) == 4 and sorted(session.engine_moves) == [1, 3]
    white_clock = session.time_left(chess.WHITE)
    session.takeback()  # the engine's answer and the human's move
    assert [m.uci() for m in session.board.move_stack] == [
        "e2e4",
        session.board.move_stack[1].uci(),
    ]
    assert sorted(session.engine_moves) == [1] and session.state()["can_takeback"]
    assert session.time_left(chess.WHITE) <= white_clock  # no time given back
    session._thinking = True  # the engine is busy: nothing may change under it
    with pytest.raises(RequestError, match="thinking"):
        session.takeback()
    session._thinking = False
    session.takeback()
    assert session.board.move_stack == [] and not session.state()["can_takeback"]

    # the engine (Black) thinks it stands better: it declines, and only once per position
    app.offer_draw(session)
    assert session.result is None and "declines" in session.notice
    with pytest.raises(RequestError, match="already answered"):
        app.offer_draw(session)
    app._evaluate = lambda game: 0.0  # an even position: accepted
    session.human_move("e2e4")
    app.offer_draw(session)
    assert (session.result, session.termination) == ("1/2-1/2", "draw agreed")

    with pytest.raises(RequestError, match="still in progress"):
        app.rematch(app.new_game({}))
    again = app.rematch(session)
    assert again.settings.human_colour == "black" and again.id != session.id
    assert again.settings.base_s == 60 and app.rematch(session) is again
    assert session.state()["rematch_id"] == again.id


def test_a_full_server_never_evicts_a_game_in_progress():
    app = PlayApp(_fake_play, max_games=3)
    games = [app.new_game({"base_s": 0}) for _ in range(3)]
    with pytest.raises(RequestError, match="games in progress") as err:
        app.new_game({})
    assert err.value.status == 503
    assert [app.game(g.id) for g in games] == games  # all three still there
    games[1].resign()
    fourth = app.new_game({})
    with pytest.raises(RequestError) as err:
        app.game(games[1].id)  # the finished one made room
    assert err.value.status == 404
    assert app.game(games[0].id) is games[0] and app.game(fourth.id) is fourth
    time.sleep(0.01)  # nobody has looked at the first game since: an idle game may go too
    app.game(games[2].id).state()
    app.idle_s = 0.005
    app.new_game({})
    with pytest.raises(RequestError):
        app.game(games[0].id)


def test_over_http_a_full_server_says_503(allie):
    srv = _serve(PlayApp(_fake_play, max_games=1))
    try:
        status, state, _ = _request(srv, "POST", "/api/new", {})
        assert status == 201
        status, data, _ = _request(srv, "POST", "/api/new", {})
        assert status == 503 and "games in progress" in data["error"]
        status, _, _ = _request(srv, "GET", f"/api/state?id={state['id']}")
        assert status == 200
    finally:
        _stop(srv)


def test_a_failing_search_still_answers_with_the_models_prior(allie):
    from allie_jax.engine.web import allie_player
    from allie_jax.game import Game

    class Broken:
        def play(self, *args, **kwargs):
            raise RuntimeError("boom")

        def predict(self, games, **kwargs):
            return allie.predict(games, **kwargs)

    game = Game(moves=["e2e4", "c7c5"], white_elo=1500, black_elo=1500)
    decision = allie_player(Broken())(game, "adaptive", 5.0)
    probs = allie.predict([game])[0].move_probs
    board = chess.Board()
    board.push_uci("e2e4")
    board.push_uci("c7c5")
    assert set(probs) == {m.uci() for m in board.legal_moves}
    assert decision.move == max(probs, key=probs.get) and decision.sims == 0
    assert "search failed (boom)" in decision.note


def test_new_game_prepares_off_the_clock():
    """A mode not compiled yet: the game waits ``preparing`` with both clocks stopped, refuses
    moves, and starts the clocks once the warm-up ends; the next game of that mode is ready."""
    release = threading.Event()
    warmed = []

    def warmup(mode):
        release.wait(60)
        warmed.append(mode)

    app = PlayApp(_fake_play, warmup=warmup)
    session = app.new_game({"human_colour": "black", "base_s": 2, "mode": "adaptive"})
    state = session.state()
    assert state["preparing"] and state["engine_to_move"]
    time.sleep(2.5)  # longer than the whole clock: it must not run while compiling
    state = session.state()
    assert state["result"] is None and state["clocks"] == {"white": 2.0, "black": 2.0}
    with pytest.raises(RequestError, match="preparing") as err:
        app.engine_move(session)
    assert err.value.status == 409
    release.set()
    for _ in range(400):
        if not session.preparing:
            break
        time.sleep(0.05)
    assert not session.preparing and warmed == ["adaptive"]
    app.engine_move(session)
    assert len(session.board.move_stack) == 1
    assert not app.new_game({"mode": "adaptive"}).preparing  # compiled once
    app.new_game({"mode": "policy"})  # another mode compiles on its own
    app.close()
    assert warmed == ["adaptive", "policy"]


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


_CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _page_state(page) -> dict:
    return page.evaluate("fetch('/api/state?id=' + currentId()).then(r => r.json())")


def _centre(page, name: str) -> tuple[float, float]:
    box = page.locator(f'#board rect[data-square="{name}"]').bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def _click_move(page, src: str, dst: str, how: str = "click") -> None:
    (x0, y0), (x1, y1) = _centre(page, src), _centre(page, dst)
    if how == "click":
        page.mouse.click(x0, y0)
        page.mouse.click(x1, y1)
    else:
        page.mouse.move(x0, y0)
        page.mouse.down()
        page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
        page.mouse.move(x1, y1, steps=5)
        page.mouse.up()


def test_play_in_chromium_flip_takeback_reload_draw_rematch(server, tmp_path):
    """Load the page, play three moves by clicking and dragging, see the engine answer each with
    arrows for its top moves; flip the board, take back, reload (the game resumes from ``?id=``),
    offer a draw, resign, and start the rematch with colours swapped."""
    _need_chromium()
    from playwright.sync_api import sync_playwright

    t0 = time.perf_counter()
    url = url_of(server)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=_CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("body[data-status=ready]", timeout=60_000)
        page.select_option("select[name=mode]", "policy")
        page.fill("input[name=engine_elo]", "1700")
        page.click("#new-game")
        # the first policy game compiles it ("preparing", clocks stopped), then it is our move
        page.wait_for_selector("body[data-status=human]", timeout=600_000)

        # move 1 and 3 by two clicks, move 2 by dragging
        plan = [("e2", "e4", "click"), ("g1", "f3", "drag"), ("f1", "c4", "click")]
        for ply, (src, dst, how) in enumerate(plan):
            board = chess.Board()
            for m in _page_state(page)["moves"]:
                board.push_uci(m)
            move = chess.Move.from_uci(src + dst)
            if move not in board.legal_moves:  # the engine's reply blocked our plan
                move = sorted(board.legal_moves, key=lambda m: m.uci())[0]
                src, dst = chess.square_name(move.from_square), chess.square_name(move.to_square)
            _click_move(page, src, dst, how)
            page.wait_for_selector(f"body[data-ply='{2 * ply + 2}']", timeout=180_000)
            page.wait_for_selector("body[data-status=human]", timeout=180_000)
        state = _page_state(page)
        assert len(state["moves"]) == 6
        replay = chess.Board()
        for m in state["moves"]:
            replay.push_uci(m)  # raises if any move were illegal
        shown = page.locator("#moves li").all_inner_texts()
        assert len(shown) == 3 and shown[0].split()[0] == state["san"][0]
        assert page.locator("#ei-move").inner_text() == state["san"][-1]
        assert "s" in page.locator("#ei-think").inner_text()
        # one arrow per top move of the engine's last decision, drawn by the Arrows extension
        top = state["last_engine_move"]["top_uci"]
        assert 1 <= len(top) <= 3
        assert page.locator("#board g.arrows g.arrow").count() == len(top)
        assert "budget" in page.locator("#think-text").inner_text()
        page.mouse.move(5, 5)  # no hover highlight in the picture
        shot = tmp_path / "play.png"
        page.screenshot(path=str(shot))

        # flip: the board turns (a8 at the bottom left for White's player), and back
        a1_y = _centre(page, "a1")[1]
        page.click("#flip")
        page.wait_for_selector("body[data-orientation=black]")
        assert page.evaluate("isFlipped()") and _centre(page, "a1")[1] < a1_y
        assert page.locator("#name-bottom").inner_text().startswith("Allie")
        page.click("#flip")
        page.wait_for_selector("body[data-orientation=white]")
        assert _centre(page, "a1")[1] == pytest.approx(a1_y)

        # take back our move and the engine's answer
        page.click("#takeback")
        page.wait_for_selector("body[data-ply='4'][data-status=human]", timeout=60_000)
        assert _page_state(page)["moves"] == state["moves"][:4]

        # reload: the page resumes the game from ?id= in its URL
        gid = page.evaluate("currentId()")
        assert f"id={gid}" in page.url
        page.reload()
        page.wait_for_selector("body[data-ply='4'][data-status=human]", timeout=60_000)
        assert page.evaluate("currentId()") == gid
        assert page.locator("#moves li").count() == 2

        # a draw offer is answered (the untrained model's value decides which way)
        page.click("#draw")
        page.wait_for_function("document.getElementById('notice').textContent.includes('draw')")
        notice = page.locator("#notice").inner_text()
        assert "accepts" in notice or "declines" in notice
        if "declines" in notice:
            page.click("#resign")
        page.wait_for_selector("body[data-status=over]", timeout=60_000)
        page.click("#rematch")
        page.wait_for_function(f"currentId() !== {json.dumps(gid)}")
        new_state = _page_state(page)
        assert new_state["settings"]["human_colour"] == "black"
        assert new_state["settings"]["engine_elo"] == 1700
        page.wait_for_selector("body[data-ply='1'][data-status=human]", timeout=120_000)
        browser.close()
    assert not errors, errors
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("ALLIE_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, pathlib.Path(keep) / "play.png")
    print(f"browser test: {time.perf_counter() - t0:.1f} s, screenshot {shot}")


# What a move may run past its budget and still count as on time: the search checks its deadline
# between chunks, so one chunk, the finish and the reply (and a busy machine's scheduling) come
# after it. The clock itself is the hard check: the game is never lost on time.
MOVE_MARGIN_S = 1.0


def play_clocked_browser_game(
    allie: Allie, base_s: float, increment_s: float, engine_moves: int, mode: str = "adaptive"
) -> dict:
    """Play a game through the page in Chromium, the human's moves clicked on the board (a
    seeded choice among python-chess's legal moves, captures first); per engine move its clock
    charge against its budget. Also the measuring tool for the browser game's figures."""
    import random

    from playwright.sync_api import sync_playwright

    rng = random.Random(0)
    srv = _serve(allie_app(allie, checkpoint="clocked game (test)"))
    rows: list[dict] = []
    saw_preparing = None
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=_CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url_of(srv))
            page.wait_for_selector("body[data-status=ready]", timeout=60_000)
            page.select_option("select[name=mode]", mode)
            page.fill("input[name=base_min]", f"{base_s / 60:g}")
            page.fill("input[name=increment_s]", f"{increment_s:g}")
            page.click("#new-game")
            page.wait_for_selector("body[data-status=preparing]", timeout=60_000)
            saw_preparing = _page_state(page)
            page.wait_for_selector("body[data-status=human]", timeout=1_800_000)
            state = _page_state(page)
            while len(rows) < engine_moves and not state["result"]:
                board = chess.Board()
                for m in state["moves"]:
                    board.push_uci(m)
                legal = sorted(board.legal_moves, key=lambda m: m.uci())
                captures = [m for m in legal if board.is_capture(m)]
                move = rng.choice(captures or legal)
                if move.promotion:  # the page asks for the piece; take a queen
                    move = chess.Move(move.from_square, move.to_square, chess.QUEEN)
                ply = len(state["moves"])
                _click_move(
                    page, chess.square_name(move.from_square), chess.square_name(move.to_square)
                )
                if move.promotion:
                    page.click('#board rect.promotion-dialog-button[data-piece="wq"]')
                page.wait_for_function(
                    f"Number(document.body.dataset.ply) >= {ply + 2} || "
                    "document.body.dataset.status === 'over'",
                    timeout=600_000,
                )
                page.wait_for_selector("body[data-status=human], body[data-status=over]")
                state = _page_state(page)
                info = state["last_engine_move"]
                if info and info["ply"] == ply + 1:
                    rows.append(
                        {
                            "ply": info["ply"],
                            "san": info["san"],
                            "spent_s": info["spent_s"],
                            "budget_s": info["budget_s"],
                            "sims": info["sims"],
                            "note": info["note"],
                        }
                    )
            browser.close()
    finally:
        _stop(srv)
    return {"rows": rows, "state": state, "errors": errors, "preparing": saw_preparing}


@pytest.mark.slow
def test_a_clocked_adaptive_game_in_chromium_keeps_every_move_within_its_budget():
    """The page in ``adaptive`` mode at 1+1: the engine compiles first ("preparing", both clocks
    full), then every engine move is charged at most its budget plus ``MOVE_MARGIN_S``, and
    nobody loses on time. ``ALLIE_WEB_GAME="300+3:20"`` replays it at 5+3 for 20 engine moves
    and prints the per-move table (the browser game's figures in bench/RESULTS.md)."""
    _need_chromium()
    tc, _, n = os.environ.get("ALLIE_WEB_GAME", "60+1:6").partition(":")
    base, inc = (float(x) for x in tc.split("+"))
    size = os.environ.get("ALLIE_WEB_MODEL", "tiny")
    allie = Allie(AllieModel(ModelConfig.named(size), rngs=nnx.Rngs(0)))
    out = play_clocked_browser_game(allie, base, inc, int(n))
    assert not out["errors"], out["errors"]
    prep = out["preparing"]
    assert prep["preparing"] and prep["clocks"] == {"white": base, "black": base}
    rows, state = out["rows"], out["state"]
    print(f"\n{size} adaptive at {tc}: ply, move, spent s, budget s, sims")
    for r in rows:
        print(
            f"{r['ply']:3d} {r['san']:7s} {r['spent_s']:7.2f} {r['budget_s']:7.2f} {r['sims']:4d}"
        )
    assert len(rows) == int(n) or state["result"], state
    assert "Time forfeit" not in state["termination"], state["termination"]
    for r in rows:
        assert r["budget_s"] is not None and r["spent_s"] <= r["budget_s"] + MOVE_MARGIN_S, r
        assert r["sims"] > 0, r  # searched: neither the direct policy nor a fallback


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
