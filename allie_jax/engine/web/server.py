"""A local web page to play Allie: standard-library HTTP server, JSON API, static board page.

    GET  /                         the page (static/index.html)
    GET  /static/<file>            the page's scripts, styles and the vendored cm-chessboard
    GET  /api/info                 the checkpoint, the modes, the Elo range
    POST /api/new                  {"human_colour", "engine_elo", "human_elo", "mode", "base_s",
                                    "increment_s", "human_pacing"} -> the game's state
    GET  /api/state?id=ID          the game's state (FEN, moves, legal moves, clocks, result)
    POST /api/move                 {"id", "uci"}: the human's move, checked by python-chess
    POST /api/engine               {"id"}: the engine plays (waits for it) -> the new state
    POST /api/resign               {"id"}
    GET  /api/pgn?id=ID            the game as a PGN download

Every refused request gets a 4xx status and ``{"error": "..."}`` naming the problem. The server
is ``ThreadingHTTPServer`` (the page reads the state while the engine thinks); model calls are
serialised by one lock, as a single local player needs no more.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import pathlib
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from allie_jax.engine.web.session import (
    MAX_ELO,
    MIN_ELO,
    MODES,
    GameSession,
    GameSettings,
    RequestError,
)

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
MAX_BODY = 16 * 1024
MAX_GAMES = 64  # the oldest idle game is dropped beyond this
_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

log = logging.getLogger(__name__)


class PlayApp:
    """The games and the engine behind the page, independent of HTTP (tests call it directly)."""

    def __init__(self, play: Callable[[Any, str], Any], *, checkpoint: str = "") -> None:
        """``play(game, mode) -> Decision``; ``allie_player`` builds one from an ``Allie``."""
        self._play = play
        self._engine_lock = threading.Lock()
        self._games: dict[str, GameSession] = {}
        self._games_lock = threading.Lock()
        self.checkpoint = checkpoint

    def info(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "modes": list(MODES),
            "elo_range": [MIN_ELO, MAX_ELO],
            "defaults": GameSettings().__dict__,
        }

    def new_game(self, body: Any) -> GameSession:
        session = GameSession(GameSettings.from_request(body))
        with self._games_lock:
            if len(self._games) >= MAX_GAMES:
                oldest = min(self._games.values(), key=lambda g: g.last_seen)
                del self._games[oldest.id]
            self._games[session.id] = session
        return session

    def game(self, game_id: Any) -> GameSession:
        if not isinstance(game_id, str) or not game_id:
            raise RequestError(400, "missing game id ('id')")
        with self._games_lock:
            session = self._games.get(game_id)
        if session is None:
            raise RequestError(404, f"no game with id {game_id!r} (start one with POST /api/new)")
        return session

    def engine_move(self, session: GameSession) -> None:
        def play(game, mode):
            with self._engine_lock:
                return self._play(game, mode)

        session.engine_move(play)


def allie_player(allie: Any, seed: int = 0) -> Callable[[Any, str], Any]:
    """``play(game, mode)`` for ``PlayApp`` from an ``Allie``: one decision, a fresh key each move."""
    counter = iter(range(seed, 2**31))

    def play(game, mode):
        return allie.play([game], mode, rng=next(counter))[0]

    return play


def _handler(app: PlayApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "allie-play/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            log.debug("%s " + format, self.address_string(), *args)

        # ------------------------------------------------------------ replies
        def _send(self, status: int, body: bytes, content_type: str, extra=()) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data).encode(), "application/json")

        def _error(self, status: int, message: str) -> None:
            self._json(status, {"error": message})

        def _body(self) -> Any:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise RequestError(400, "bad Content-Length") from None
            if length > MAX_BODY:
                raise RequestError(413, f"body of {length} bytes is over {MAX_BODY}")
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RequestError(400, f"the body is not JSON ({err})") from None

        def _query(self) -> dict[str, str]:
            query = urllib.parse.urlsplit(self.path).query
            return {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}

        def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
            path = urllib.parse.urlsplit(self.path).path
            try:
                if path in routes:
                    routes[path]()
                elif path.startswith("/static/") and self.command in ("GET", "HEAD"):
                    self._static(path[len("/static/") :])
                elif path in _ROUTES_GET | _ROUTES_POST or path.startswith("/static/"):
                    allowed = "GET" if path in _ROUTES_GET or path.startswith("/static") else "POST"
                    raise RequestError(405, f"{self.command} {path}: use {allowed}")
                else:
                    raise RequestError(404, f"no such page or API: {path}")
            except RequestError as err:
                self._error(err.status, str(err))
            except Exception as err:  # a bug: say so in JSON, keep serving
                log.exception("error serving %s %s", self.command, self.path)
                self._error(500, f"internal error: {type(err).__name__}: {err}")

        # ------------------------------------------------------------ routes
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            q = self._query
            self._dispatch(
                {
                    "/": lambda: self._static("index.html"),
                    "/api/info": lambda: self._json(200, app.info()),
                    "/api/state": lambda: self._json(200, app.game(q().get("id")).state()),
                    "/api/pgn": lambda: self._pgn(q().get("id")),
                }
            )

        do_HEAD = do_GET  # noqa: N815

        def do_POST(self) -> None:  # noqa: N802
            self._dispatch(
                {
                    "/api/new": self._new,
                    "/api/move": self._move,
                    "/api/engine": self._engine,
                    "/api/resign": self._resign,
                }
            )

        def do_PUT(self) -> None:  # noqa: N802
            self._dispatch({})

        do_DELETE = do_PATCH = do_PUT  # noqa: N815

        def _new(self) -> None:
            self._json(201, app.new_game(self._body()).state())

        def _session(self) -> tuple[GameSession, dict]:
            body = self._body()
            if not isinstance(body, dict):
                raise RequestError(400, "the body must be a JSON object with the game 'id'")
            return app.game(body.get("id")), body

        def _move(self) -> None:
            session, body = self._session()
            if "uci" not in body:
                raise RequestError(400, "missing 'uci' (the move, e.g. 'e2e4')")
            session.human_move(body["uci"])
            self._json(200, session.state())

        def _engine(self) -> None:
            session, _ = self._session()
            app.engine_move(session)
            self._json(200, session.state())

        def _resign(self) -> None:
            session, _ = self._session()
            session.resign()
            self._json(200, session.state())

        def _pgn(self, game_id: str | None) -> None:
            session = app.game(game_id)
            name = f"allie-{session.started:%Y%m%d-%H%M%S}.pgn"
            self._send(
                200,
                session.pgn().encode(),
                "application/x-chess-pgn",
                [("Content-Disposition", f'attachment; filename="{name}"')],
            )

        def _static(self, rel: str) -> None:
            target = (STATIC_DIR / urllib.parse.unquote(rel)).resolve()
            if not target.is_relative_to(STATIC_DIR) or not target.is_file():
                raise RequestError(404, f"no such file: /static/{rel}")
            ctype = _TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0]
            self._send(200, target.read_bytes(), ctype or "application/octet-stream")

    return Handler


_ROUTES_GET = {"/", "/api/info", "/api/state", "/api/pgn"}
_ROUTES_POST = {"/api/new", "/api/move", "/api/engine", "/api/resign"}


def make_server(app: PlayApp, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0 picks a free one); call ``serve_forever``."""
    server = ThreadingHTTPServer((host, port), _handler(app))
    server.daemon_threads = True
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


def load_app(checkpoint: str, *, warmup_modes: tuple[str, ...] = ("policy", "adaptive")) -> PlayApp:
    """A ``PlayApp`` over ``Allie.load(checkpoint)``.

    ``warmup_modes`` are compiled now, so the engine's clock is not charged for compiling them
    during the first game (the tree search takes a while on CPU); other modes compile on first use.
    """
    from etils import epath

    from allie_jax.engine.api import Allie
    from allie_jax.game import Game

    path = epath.Path(checkpoint)
    allie = Allie.load(path)
    for mode in warmup_modes:
        if mode not in MODES:
            raise ValueError(f"warm-up mode {mode!r}: expected one of {list(MODES)}")
        print(f"compiling the {mode} mode (once) ...", flush=True)
        allie.play([Game(moves=["e2e4"], white_elo=1500, black_elo=1500)], mode)
    return PlayApp(allie_player(allie), checkpoint=str(path))


def serve(app: PlayApp, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the page until Ctrl-C."""
    server = make_server(app, host, port)
    print(f"Allie is ready: open {url_of(server)} in a browser (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
