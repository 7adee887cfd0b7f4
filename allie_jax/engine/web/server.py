"""A local web page to play Allie: standard-library HTTP server, JSON API, static board page.

    GET  /                         the page (static/index.html); ``/?id=ID`` resumes game ID
    GET  /static/<file>            the page's scripts, styles and the vendored cm-chessboard
    GET  /api/info                 the checkpoint, the modes, the Elo range
    POST /api/new                  {"human_colour", "engine_elo", "human_elo", "mode", "base_s",
                                    "increment_s", "human_pacing"} -> the game's state
    GET  /api/state?id=ID          the game's state (FEN, moves, legal moves, clocks, result)
    POST /api/move                 {"id", "uci"}: the human's move, checked by python-chess
    POST /api/engine               {"id"}: the engine plays (waits for it) -> the new state
    POST /api/takeback             {"id"}: undo the human's last move and the engine's answer
    POST /api/draw                 {"id"}: offer a draw; the engine answers from its value head
    POST /api/resign               {"id"}
    POST /api/rematch              {"id"}: a finished game's rematch, colours swapped (201)
    GET  /api/pgn?id=ID            the game as a PGN download

Every refused request gets a 4xx status and ``{"error": "..."}`` naming the problem, including
malformed HTTP: a bad or negative ``Content-Length``, a body over ``MAX_BODY``, a body that does
not arrive within the read timeout (the socket has one, so no client holds a thread forever),
JSON nested too deep, a non-JSON POST, a Host that is not this server (DNS rebinding) and a
cross-origin request (``Origin`` or ``Sec-Fetch-Site``). The server is ``ThreadingHTTPServer``
(the page reads the state while the engine thinks); model calls are serialised by one lock, as a
single local player needs no more.

A new game whose mode has not been compiled yet starts ``preparing``: the engine compiles every
shape the mode can meet (``Allie.warmup``, the fixed shapes the UCI engine uses) in the
background while the page says so and both clocks stand still. The server holds at most
``max_games`` games; a new game may push out a finished or idle one, never one in progress (then
it is refused with 503).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import pathlib
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from allie_jax.engine.web.session import (
    MAX_ELO,
    MIN_ELO,
    GameSession,
    GameSettings,
    PlayFn,
    RequestError,
)
from allie_jax.modes import MODES, default_mode

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
MAX_BODY = 16 * 1024
MAX_GAMES = 64
IDLE_S = 30 * 60.0  # a game nobody has looked at for this long may make room for a new one
READ_TIMEOUT_S = 10.0  # a request (line, headers, body) must arrive within this
_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}

log = logging.getLogger(__name__)


class PlayApp:
    """The games and the engine behind the page, independent of HTTP (tests call it directly).

    ``play(game, mode, budget_s) -> Decision`` moves; ``warmup(mode)`` compiles a mode before
    its first game (None: nothing to compile); ``evaluate(game) -> value_white`` answers draw
    offers (None: declined). ``allie_app`` builds all three from an ``Allie``.
    """

    def __init__(
        self,
        play: PlayFn,
        *,
        warmup: Callable[[str], Any] | None = None,
        evaluate: Callable[[Any], float] | None = None,
        checkpoint: str = "",
        max_games: int = MAX_GAMES,
        idle_s: float = IDLE_S,
        modes: tuple[str, ...] = MODES,
    ) -> None:
        self._play = play
        self.modes = tuple(modes)  # the modes the model plays (``Allie.modes``)
        self._warmup = warmup
        self._evaluate = evaluate
        self._engine_lock = threading.Lock()
        self._games: dict[str, GameSession] = {}
        self._games_lock = threading.Lock()
        self._warm: set[str] = set()
        self._preparing: list[threading.Thread] = []
        self.warmup_s: dict[str, float] = {}
        self.checkpoint = checkpoint
        self.max_games = max_games
        self.idle_s = idle_s

    def info(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "modes": list(self.modes),
            "elo_range": [MIN_ELO, MAX_ELO],
            "defaults": {**GameSettings().__dict__, "mode": default_mode(self.modes)},
            "warm_modes": sorted(self._warm) if self._warmup else list(self.modes),
            "games": len(self._games),
            "max_games": self.max_games,
        }

    # ------------------------------------------------------------------ compiling
    def is_warm(self, mode: str) -> bool:
        return self._warmup is None or mode in self._warm

    def ensure_warm(self, mode: str) -> None:
        """Compile ``mode``'s shapes once (under the engine lock: no move runs meanwhile)."""
        if self.is_warm(mode):
            return
        with self._engine_lock:
            if mode in self._warm:
                return
            t = time.monotonic()
            assert self._warmup is not None
            self._warmup(mode)
            self.warmup_s[mode] = time.monotonic() - t
            self._warm.add(mode)

    def _prepare(self, session: GameSession) -> None:
        try:
            self.ensure_warm(session.settings.mode)
        except Exception as err:  # still playable: the first moves compile on the clock
            log.exception("warm-up of %s failed", session.settings.mode)
            session.notice = f"warm-up failed ({type(err).__name__}: {err})"
        finally:
            session.ready()

    # ------------------------------------------------------------------ games
    def _evictable(self, session: GameSession, now: float) -> bool:
        if session.thinking:
            return False
        return session.result is not None or now - session.last_seen > self.idle_s

    def _add(self, session: GameSession) -> None:
        with self._games_lock:
            if len(self._games) >= self.max_games:
                now = time.monotonic()
                spare = [g for g in self._games.values() if self._evictable(g, now)]
                if not spare:
                    raise RequestError(
                        503,
                        f"the server holds {len(self._games)} games in progress (its limit): "
                        "finish or resign one, or try again later",
                    )
                # finished games go first, then the longest idle
                oldest = min(spare, key=lambda g: (g.result is None, g.last_seen))
                del self._games[oldest.id]
            self._games[session.id] = session
        if session.preparing:
            # not a daemon: exiting inside XLA's compiler aborts the process; exit waits instead
            thread = threading.Thread(target=self._prepare, args=(session,), daemon=False)
            self._preparing = [t for t in self._preparing if t.is_alive()] + [thread]
            thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Wait for warm-ups still compiling (a process exiting under one can abort in XLA)."""
        for thread in list(self._preparing):
            thread.join(timeout)

    def new_game(self, body: Any) -> GameSession:
        if isinstance(body, dict) and "mode" not in body:
            body = {**body, "mode": default_mode(self.modes)}
        settings = GameSettings.from_request(body)
        if settings.mode not in self.modes:
            raise RequestError(
                400, f"mode {settings.mode!r}: this model plays {', '.join(self.modes)}"
            )
        session = GameSession(settings, preparing=not self.is_warm(settings.mode))
        self._add(session)
        return session

    def rematch(self, session: GameSession) -> GameSession:
        """The finished game's rematch (colours swapped); asking twice gives the same game."""
        import dataclasses

        if session.result is None:
            raise RequestError(409, "the game is still in progress: finish or resign it first")
        with self._games_lock:
            existing = self._games.get(session.rematch_id or "")
        if existing is not None:
            return existing
        swapped = "black" if session.settings.human_colour == "white" else "white"
        settings = dataclasses.replace(session.settings, human_colour=swapped)
        new = GameSession(settings, preparing=not self.is_warm(settings.mode))
        self._add(new)
        session.rematch_id = new.id
        return new

    def game(self, game_id: Any) -> GameSession:
        if not isinstance(game_id, str) or not game_id:
            raise RequestError(400, "missing game id ('id')")
        with self._games_lock:
            session = self._games.get(game_id)
        if session is None:
            raise RequestError(404, f"no game with id {game_id!r} (start one with POST /api/new)")
        return session

    def engine_move(self, session: GameSession) -> None:
        def play(game, mode, budget_s):
            asked = time.monotonic()
            with self._engine_lock:  # another game's move or warm-up runs on this clock too
                if budget_s is not None:
                    budget_s = max(0.0, budget_s - (time.monotonic() - asked))
                return self._play(game, mode, budget_s)

        session.engine_move(play)

    def offer_draw(self, session: GameSession) -> None:
        evaluate = None
        if self._evaluate is not None:

            def evaluate(game):
                with self._engine_lock:
                    return self._evaluate(game)

        session.offer_draw(evaluate)


def allie_player(allie: Any, seed: int = 0) -> PlayFn:
    """``play(game, mode, budget_s)`` from an ``Allie``: the budget becomes ``Allie.play``'s
    deadline (from the moment of the call), each move gets a fresh key, and the game's id
    (``Game.game_id``) keeps its search cache between moves."""
    counter = iter(range(seed, 2**31))

    def play(game, mode, budget_s=None):
        deadline = None if budget_s is None else time.monotonic() + budget_s
        try:
            return allie.play([game], mode, rng=next(counter), deadline=deadline)[0]
        except Exception as err:  # never lose the move: the model's own most probable move
            log.exception("Allie.play failed; answering with the model's prior")
            return prior_decision(allie, game, f"fallback: the search failed ({err})")

    return play


def prior_decision(allie: Any, game: Any, note: str) -> Any:
    """A ``Decision`` from one forward pass: the model's most probable legal move."""
    from allie_jax.engine.api import Decision

    pred = allie.predict([game])[0]
    move = max(pred.move_probs.items(), key=lambda kv: kv[1])[0]
    return Decision(
        move, pred.think_time_s, pred.value_white, False, 0, dict(pred.move_probs), note=note
    )


def allie_app(allie: Any, *, checkpoint: str = "", seed: int = 0, **kwargs: Any) -> PlayApp:
    """A ``PlayApp`` over an ``Allie``: its moves, its warm-up (``Allie.warmup(mode, 1)``, the
    shapes the UCI engine compiles) and its value head for draw offers."""

    def evaluate(game):
        return allie.predict([game])[0].value_white

    return PlayApp(
        allie_player(allie, seed),
        warmup=lambda mode: allie.warmup(mode, 1),
        evaluate=evaluate,
        checkpoint=checkpoint,
        modes=allie.modes,
        **kwargs,
    )


def _host_name(host: str) -> tuple[str, str]:
    """``Host`` header -> (name, port); the port is '' when absent."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest.lstrip(":")
    name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    return name, port


def _handler(
    app: PlayApp, allowed_hosts: set[str] | None, read_timeout_s: float
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "allie-play/1"
        timeout = read_timeout_s  # StreamRequestHandler sets it on the socket: reads time out

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            log.debug("%s " + format, self.address_string(), *args)

        # ------------------------------------------------------------ replies
        def _send(self, status: int, body: bytes, content_type: str, extra=()) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data).encode(), "application/json")

        def _error(self, status: int, message: str) -> None:
            if status in (408, 411, 413):  # the body was not read: the connection is unusable
                self.close_connection = True
            self._json(status, {"error": message})

        # ------------------------------------------------------------ requests
        def _check_origin(self) -> None:
            """Refuse a Host that is not this server and any cross-origin request."""
            host = self.headers.get("Host")
            if allowed_hosts is not None:
                name, port = _host_name(host or "")
                if name.lower() not in allowed_hosts or port not in (
                    "",
                    str(self.server.server_address[1]),
                ):
                    raise RequestError(
                        403, f"Host {host!r} is not this server (open it as http://localhost)"
                    )
            origin = self.headers.get("Origin")
            if origin is not None and host is not None and origin != f"http://{host}":
                raise RequestError(403, f"cross-origin request from {origin!r} refused")
            if self.headers.get("Sec-Fetch-Site") == "cross-site":
                raise RequestError(403, "cross-site request refused")

        def _body(self) -> Any:
            if self.headers.get("Transfer-Encoding"):
                raise RequestError(411, "send the body with a Content-Length, not chunked")
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                raise RequestError(415, f"Content-Type {ctype or 'none'!r}: send application/json")
            raw_length = self.headers.get("Content-Length") or "0"
            try:
                length = int(raw_length)
            except ValueError:
                raise RequestError(400, f"bad Content-Length {raw_length!r}") from None
            if length < 0:
                raise RequestError(400, f"bad Content-Length {raw_length!r}: negative")
            if length > MAX_BODY:
                raise RequestError(413, f"body of {length} bytes is over {MAX_BODY}")
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                raise RequestError(
                    408, f"the body did not arrive within {read_timeout_s:g} s"
                ) from None
            if len(raw) < length:
                raise RequestError(400, f"the body ended after {len(raw)} of {length} bytes")
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RequestError(400, f"the body is not JSON ({err})") from None
            except RecursionError:
                raise RequestError(400, "the body's JSON is nested too deep") from None

        def _query(self) -> dict[str, str]:
            query = urllib.parse.urlsplit(self.path).query
            return {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}

        def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
            path = urllib.parse.urlsplit(self.path).path
            try:
                self._check_origin()
                if path in routes:
                    routes[path]()
                elif path.startswith("/static/") and self.command in ("GET", "HEAD"):
                    self._static(path[len("/static/") :])
                elif path in _ROUTES_GET | _ROUTES_POST or path.startswith("/static/"):
                    allowed = "GET" if path in _ROUTES_GET or path.startswith("/static") else "POST"
                    raise RequestError(405, f"{self.command} {path}: use {allowed}")
                else:
                    raise RequestError(404, f"no such page or API: {path[:200]}")
            except RequestError as err:
                self._reply_error(err.status, str(err))
            except ConnectionError:  # the client left (a reload, a closed tab): nobody to tell
                self.close_connection = True
            except Exception as err:  # a bug: say so in JSON, keep serving
                log.exception("error serving %s %s", self.command, self.path)
                self._reply_error(500, f"internal error: {type(err).__name__}: {err}")

        def _reply_error(self, status: int, message: str) -> None:
            try:
                self._error(status, message)
            except (ConnectionError, TimeoutError):
                self.close_connection = True

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
                    "/api/takeback": self._takeback,
                    "/api/draw": self._draw,
                    "/api/rematch": self._rematch,
                }
            )

        def do_PUT(self) -> None:  # noqa: N802
            self._dispatch({})

        do_DELETE = do_PATCH = do_OPTIONS = do_PUT  # noqa: N815

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

        def _takeback(self) -> None:
            session, _ = self._session()
            session.takeback()
            self._json(200, session.state())

        def _draw(self) -> None:
            session, _ = self._session()
            app.offer_draw(session)
            self._json(200, session.state())

        def _rematch(self) -> None:
            session, _ = self._session()
            self._json(201, app.rematch(session).state())

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
            name = urllib.parse.unquote(rel)
            missing = RequestError(404, f"no such file: /static/{rel[:200]}")
            if any(ord(c) < 32 or c in "\\\x7f" for c in name) or len(name) > 512:
                raise missing
            try:
                target = (STATIC_DIR / name).resolve()
                if not target.is_relative_to(STATIC_DIR) or not target.is_file():
                    raise missing
                data = target.read_bytes()
            except (OSError, ValueError):
                raise missing from None
            ctype = _TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0]
            self._send(200, data, ctype or "application/octet-stream")

    return Handler


_ROUTES_GET = {"/", "/api/info", "/api/state", "/api/pgn"}
_ROUTES_POST = {
    "/api/new",
    "/api/move",
    "/api/engine",
    "/api/resign",
    "/api/takeback",
    "/api/draw",
    "/api/rematch",
}


def make_server(
    app: PlayApp,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    read_timeout_s: float = READ_TIMEOUT_S,
    allowed_hosts: set[str] | None = None,
) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0 picks a free one); call ``serve_forever``.

    Bound to a loopback address, it answers only requests whose ``Host`` names the loopback
    (``allowed_hosts`` adds names, e.g. for a LAN address); bound elsewhere, any ``Host``.
    """
    hosts: set[str] | None = None
    if host in _LOOPBACK or allowed_hosts:
        hosts = (_LOOPBACK if host in _LOOPBACK else {host.lower()}) | {
            h.lower() for h in allowed_hosts or ()
        }
    server = ThreadingHTTPServer((host, port), _handler(app, hosts, read_timeout_s))
    server.daemon_threads = True
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


def load_app(checkpoint: str, *, warmup_modes: tuple[str, ...] = ("policy", "adaptive")) -> PlayApp:
    """A ``PlayApp`` over ``Allie.load(checkpoint)``.

    ``warmup_modes`` are compiled now (``Allie.warmup``: every shape the mode can meet), so no
    game waits for them; other modes compile when their first game starts, shown on the page as
    "preparing" with both clocks stopped.
    """
    from etils import epath

    from allie_jax.engine.api import Allie

    for mode in warmup_modes:
        if mode not in MODES:
            raise ValueError(f"warm-up mode {mode!r}: expected one of {list(MODES)}")
    path = epath.Path(checkpoint)
    app = allie_app(Allie.load(path), checkpoint=str(path))
    # a family without a think-time head warms its default (search) instead of adaptive
    warm = [m if m in app.modes else default_mode(app.modes) for m in warmup_modes]
    for mode in dict.fromkeys(warm):
        print(f"compiling the {mode} mode (once) ...", flush=True)
        app.ensure_warm(mode)
    return app


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
        app.close()
