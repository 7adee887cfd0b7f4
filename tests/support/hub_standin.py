"""A local stand-in for the Hugging Face Hub's file endpoints, for tests that must not reach it.

It answers what ``huggingface_hub.hf_hub_download`` asks (``HEAD`` and ``GET`` on
``/{datasets/}{repo}/resolve/{revision}/{path}``) with the headers the Hub sends for an LFS
file: ``X-Repo-Commit``, ``X-Linked-Etag`` (the file's sha256), ``X-Linked-Size``, and honours
``Range`` requests. Point ``HF_ENDPOINT`` at ``server.url``. ``cut_first_get_at=N`` closes the
first download after N bytes (an interrupted transfer); ``requests`` records every request.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class StandInHub:
    def __init__(
        self,
        files: dict[str, bytes],
        *,
        repo: str = "yimingzhang/allie-models",
        repo_type: str = "dataset",
        listed_sha256: dict[str, str] | None = None,
        cut_first_get_at: int | None = None,
    ) -> None:
        """``files``: path in the repo -> bytes. ``listed_sha256``: digests to announce instead
        of the real ones (a Hub whose metadata and bytes disagree)."""
        self.files = files
        prefix = "datasets/" if repo_type == "dataset" else ""
        self.prefix = f"/{prefix}{repo}/resolve/"
        self.listed = {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
        self.listed.update(listed_sha256 or {})
        self.cut_first_get_at = cut_first_get_at
        self.closed = False  # after __exit__: kept-alive connections are dropped, not served
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closed = True
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _lookup(self):
                if hub.closed:  # a pooled connection outliving the server: drop it
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None, b""
                path = urllib.parse.urlparse(self.path).path
                with hub._lock:
                    hub.requests.append((self.command, path, self.headers.get("Range")))
                if not path.startswith(hub.prefix):
                    return None, None
                _revision, _, name = path[len(hub.prefix) :].partition("/")
                name = urllib.parse.unquote(name)
                return name, hub.files.get(name)

            def _not_found(self) -> None:
                body = b'{"error": "Entry not found"}'
                self.send_response(404)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _headers(self, name: str, data: bytes, status: int, start: int) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("X-Linked-Etag", f'"{hub.listed[name]}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("ETag", f'"{hub.listed[name]}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data) - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                name, data = self._lookup()
                if hub.closed:
                    return
                if data is None:
                    return self._not_found()
                self._headers(name, data, 200, 0)

            def do_GET(self) -> None:  # noqa: N802
                name, data = self._lookup()
                if hub.closed:
                    return
                if data is None:
                    return self._not_found()
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[len("bytes=") :].split("-")[0])
                self._headers(name, data, 206 if start else 200, start)
                body = data[start:]
                with hub._lock:
                    cut, hub.cut_first_get_at = hub.cut_first_get_at, None
                if cut is not None and cut < len(body):
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the transfer dies mid-file
                    return
                self.wfile.write(body)

        return Handler
