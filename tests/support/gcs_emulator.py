"""A Cloud Storage JSON-API emulator on 127.0.0.1, so ``gs://`` runs end to end offline.

Three different clients reach Cloud Storage when a run's paths are ``gs://...``:

- ``etils.epath`` → fsspec → **gcsfs** (directories, JSON, metrics, Orbax's metadata and
  commit files), pointed here by ``STORAGE_EMULATOR_HOST``;
- **TensorStore**'s own ``gcs`` kvstore driver (Orbax's array data), pointed here by
  ``TENSORSTORE_GCS_HTTP_URL`` with ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` as its bearer token;
- **google-cloud-storage** (Orbax asks it whether a bucket has a hierarchical namespace),
  pointed here by ``STORAGE_EMULATOR_HOST`` with anonymous credentials.

All three speak the JSON API over HTTP, so one in-memory store serves them and they see each
other's objects, as on the real service. What is implemented is the subset those clients use,
with the real service's semantics where the clients depend on them: generations and the
``ifGenerationMatch`` / ``ifGenerationNotMatch`` / ``ifMetagenerationMatch`` preconditions
(TensorStore's OCDBT manifest is a compare-and-swap on them), media / multipart / resumable
uploads, ranged and conditional reads with ``x-goog-generation`` and ``x-goog-hash`` headers,
listings with ``prefix`` / ``delimiter`` / ``startOffset`` / ``endOffset`` / pagination, delete,
rewrite (copy), move (gcsfs's rename) and bucket metadata. Anything else is answered 501 and recorded in
``unsupported``, so a test can assert that no client needed more than this.

The listening socket is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

import google_crc32c

TEST_TOKEN = "allie-jax-test-token"
# A request header naming the client process (e.g. "host-1"): tests of several processes give
# each one its own value (``client_env``), and ``GCSEmulator.reads`` says who read which bytes.
CLIENT_HEADER = "X-Test-Client"
_DESTINATION_PRECONDITIONS = ("ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch")


@dataclass(frozen=True)
class Read:
    """Object bytes served to a client (one media download or ranged read)."""

    bucket: str
    name: str
    nbytes: int
    client: str  # the CLIENT_HEADER value, "" when the client sent none


@dataclass
class Blob:
    data: bytes
    generation: int
    metageneration: int = 1
    content_type: str = "application/octet-stream"
    metadata: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


class GCSError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class Store:
    """Buckets of objects with generations; every method takes the lock."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, Blob]] = {}
        self.lock = threading.Lock()
        self._generation = itertools.count(int(time.time() * 1e6))

    def create_bucket(self, name: str) -> None:
        with self.lock:
            self.buckets.setdefault(name, {})

    def bucket(self, name: str) -> dict[str, Blob]:
        if name not in self.buckets:
            raise GCSError(404, f"bucket {name} not found")
        return self.buckets[name]

    def check(self, blob: Blob | None, query: dict[str, str], *, read: bool = False) -> None:
        """The JSON API's preconditions (412; 304 for a read whose generation did not change)."""
        gen = blob.generation if blob else 0
        if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != gen:
            raise GCSError(412, "ifGenerationMatch failed")
        if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"]) == gen:
            raise GCSError(304 if read else 412, "ifGenerationNotMatch failed")
        if "ifMetagenerationMatch" in query:
            if blob is None or int(query["ifMetagenerationMatch"]) != blob.metageneration:
                raise GCSError(412, "ifMetagenerationMatch failed")

    def get(self, bucket: str, name: str, query: dict[str, str], *, read=False) -> Blob:
        with self.lock:
            blob = self.bucket(bucket).get(name)
            if "generation" in query and blob and int(query["generation"]) != blob.generation:
                blob = None
            if blob is None:
                if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != 0:
                    raise GCSError(412, "ifGenerationMatch failed")
                raise GCSError(404, f"No such object: {bucket}/{name}")
            self.check(blob, query, read=read)
            return blob

    def put(self, bucket: str, name: str, data: bytes, query: dict[str, str], **meta) -> Blob:
        if not name:
            raise GCSError(400, "object name required")
        with self.lock:
            objects = self.bucket(bucket)
            self.check(objects.get(name), query)
            blob = Blob(data=bytes(data), generation=next(self._generation), **meta)
            objects[name] = blob
            return blob

    def delete(self, bucket: str, name: str, query: dict[str, str]) -> None:
        with self.lock:
            objects = self.bucket(bucket)
            blob = objects.get(name)
            if blob is None:
                raise GCSError(404, f"No such object: {bucket}/{name}")
            self.check(blob, query)
            del objects[name]

    def names(self, bucket: str) -> list[str]:
        with self.lock:
            return sorted(self.bucket(bucket))


def resource(bucket: str, name: str, blob: Blob) -> dict:
    """An object resource as the JSON API returns it (int64 fields as strings)."""
    return {
        "kind": "storage#object",
        "id": f"{bucket}/{name}/{blob.generation}",
        "selfLink": f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
        "name": name,
        "bucket": bucket,
        "generation": str(blob.generation),
        "metageneration": str(blob.metageneration),
        "contentType": blob.content_type,
        "storageClass": "STANDARD",
        "size": str(len(blob.data)),
        "md5Hash": _md5(blob.data),
        "crc32c": _crc32c(blob.data),
        "etag": f"{blob.generation}",
        "timeCreated": _rfc3339(blob.created),
        "updated": _rfc3339(blob.created),
        "metadata": dict(blob.metadata),
    }


def _parse_multipart(body: bytes, content_type: str) -> list[tuple[dict[str, str], bytes]]:
    """Parts of a multipart body (CRLF or bare LF line ends, as gcsfs sends)."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        raise GCSError(400, "multipart body without a boundary")
    delimiter = b"--" + match.group(1).encode()
    parts = []
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        crlf = chunk.startswith(b"\r\n")
        chunk = chunk[2:] if crlf else chunk[1:]
        sep = b"\r\n\r\n" if crlf else b"\n\n"
        head, _, content = chunk.partition(sep)
        end = b"\r\n" if crlf else b"\n"
        if content.endswith(end):
            content = content[: -len(end)]
        headers = {}
        for line in head.decode().splitlines():
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        parts.append((headers, content))
    return parts


class GCSEmulator:
    """The server: ``with GCSEmulator(buckets=("bucket",)) as gcs: ... gcs.url ...``."""

    def __init__(self, buckets=("bucket",)) -> None:
        self.store = Store()
        for b in buckets:
            self.store.create_bucket(b)
        self.requests: list[tuple[str, str, str]] = []  # (method, path, user agent)
        self.unsupported: list[str] = []
        self.statuses: list[int] = []  # the status of every response, in order
        self.reads: list[Read] = []  # every media download (whole or ranged), in order
        self.uploads: dict[str, dict] = {}  # resumable upload sessions
        self._ids = itertools.count(1)
        emulator = self

        class Handler(_Handler):
            gcs = emulator

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> GCSEmulator:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def objects(self, bucket: str = "bucket", prefix: str = "") -> list[str]:
        return [n for n in self.store.names(bucket) if n.startswith(prefix)]

    def read(self, bucket: str, name: str) -> bytes:
        return self.store.get(bucket, name, {}).data

    def env(self) -> dict[str, str]:
        """Environment that sends gcsfs, google-cloud-storage and TensorStore here.

        The metadata-server variables point at a closed loopback port, so no client can probe
        Google's metadata address for credentials.
        """
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "TENSORSTORE_GCS_HTTP_VERSION": "1.1",
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": TEST_TOKEN,
            "GOOGLE_CLOUD_PROJECT": "test-project",
            "FSSPEC_GCS_TOKEN": "anon",
            "FSSPEC_GS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # no gRPC storage-layout probe
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
            "GCE_METADATA_ROOT": "127.0.0.1:9",
            "NO_GCE_CHECK": "True",
            "GOOGLE_APPLICATION_CREDENTIALS": "",
        }


class _Handler(BaseHTTPRequestHandler):
    gcs: GCSEmulator
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet; requests are recorded instead
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionError:  # a client that dropped a connection it no longer needed
            pass

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.gcs.statuses.append(code)
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if code not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD" and code not in (204, 304):
            self.wfile.write(body)

    def _json(self, code: int, obj: dict) -> None:
        self._send(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _error(self, err: GCSError) -> None:
        if err.code == 304:
            self._send(304)
            return
        body = {"error": {"code": err.code, "message": err.message, "errors": []}}
        self._json(err.code, body)

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.gcs.requests.append((self.command, self.path, self.headers.get("User-Agent", "")))
        body = self._body()
        try:
            if not self._route(url.path, query, body):
                self.gcs.unsupported.append(f"{self.command} {self.path}")
                self._json(501, {"error": {"code": 501, "message": "not emulated"}})
        except GCSError as err:
            self._error(err)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _dispatch

    # ------------------------------------------------------------------ routes
    def _route(self, path: str, query: dict, body: bytes) -> bool:
        store, method = self.gcs.store, self.command
        if path.startswith("/upload/storage/v1/b/"):
            return self._upload(path[len("/upload/storage/v1/b/") :], query, body)
        if path.startswith("/download/storage/v1/b/"):
            bucket, _, name = path[len("/download/storage/v1/b/") :].partition("/o/")
            return self._media(unquote(bucket), unquote(name), query)
        if path.rstrip("/") == "/storage/v1/b" and method == "POST":
            store.create_bucket(json.loads(body)["name"])
            self._json(200, self._bucket(json.loads(body)["name"]))
            return True
        if not path.startswith("/storage/v1/b/"):
            return False
        rest = path[len("/storage/v1/b/") :]
        bucket, sep, obj = rest.partition("/o")
        bucket = unquote(bucket)
        if not sep:  # bucket metadata
            if method != "GET":
                return False
            store.bucket(bucket)
            self._json(200, self._bucket(bucket))
            return True
        if obj in ("", "/"):
            if method != "GET":
                return False
            self._json(200, self._list(bucket, query))
            return True
        obj = obj[1:]
        for verb in ("/rewriteTo/b/", "/copyTo/b/"):
            if verb in obj and method == "POST":
                src, _, dst = obj.partition(verb)
                dst_bucket, _, dst_name = dst.partition("/o/")
                blob = store.get(bucket, unquote(src), {})
                new = store.put(
                    unquote(dst_bucket),
                    unquote(dst_name),
                    blob.data,
                    {k: v for k, v in query.items() if k in _DESTINATION_PRECONDITIONS},
                    content_type=blob.content_type,
                    metadata=blob.metadata,
                )
                out = resource(unquote(dst_bucket), unquote(dst_name), new)
                if verb == "/rewriteTo/b/":
                    size = str(len(new.data))
                    out = {
                        "kind": "storage#rewriteResponse",
                        "totalBytesRewritten": size,
                        "objectSize": size,
                        "done": True,
                        "resource": out,
                    }
                self._json(200, out)
                return True
        if "/moveTo/o/" in obj and method == "POST":  # an atomic rename within the bucket
            src, _, dst = (unquote(x) for x in obj.partition("/moveTo/o/"))
            with store.lock:
                objects = store.bucket(bucket)
                blob = objects.get(src)
                if blob is None:
                    raise GCSError(404, f"No such object: {bucket}/{src}")
                if (
                    "ifSourceGenerationMatch" in query
                    and int(query["ifSourceGenerationMatch"]) != blob.generation
                ):
                    raise GCSError(412, "ifSourceGenerationMatch failed")
                store.check(objects.get(dst), query)
                objects[dst] = Blob(
                    data=blob.data,
                    generation=next(store._generation),
                    content_type=blob.content_type,
                    metadata=blob.metadata,
                )
                del objects[src]
                moved = objects[dst]
            self._json(200, resource(bucket, dst, moved))
            return True
        name = unquote(obj)
        if method in ("GET", "HEAD"):
            if query.get("alt") == "media":
                return self._media(bucket, name, query)
            self._json(200, resource(bucket, name, store.get(bucket, name, query)))
            return True
        if method == "DELETE":
            store.delete(bucket, name, query)
            self._send(204)
            return True
        return False

    def _bucket(self, name: str) -> dict:
        return {
            "kind": "storage#bucket",
            "id": name,
            "name": name,
            "projectNumber": "0",
            "metageneration": "1",
            "location": "US",
            "storageClass": "STANDARD",
            "etag": "CAE=",
            "timeCreated": _rfc3339(0),
            "updated": _rfc3339(0),
        }

    def _list(self, bucket: str, query: dict) -> dict:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        start, end = query.get("startOffset", ""), query.get("endOffset")
        token = query.get("pageToken", "")
        limit = int(query.get("maxResults") or 1000)
        with self.gcs.store.lock:
            objects = dict(self.gcs.store.bucket(bucket))
        entries: dict[str, Blob | None] = {}  # name -> blob, or None for a prefix
        for name, blob in sorted(objects.items()):
            if not name.startswith(prefix) or name < start or (end and name >= end):
                continue
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                entries[name[: cut + len(delimiter)]] = None
                if query.get("includeTrailingDelimiter") == "true" and cut + 1 == len(name):
                    entries[name] = blob
            else:
                entries[name] = blob
        keys = sorted(k for k in entries if k > token)
        page, more = keys[:limit], keys[limit:]
        out: dict = {"kind": "storage#objects"}
        items = [resource(bucket, k, entries[k]) for k in page if entries[k] is not None]
        prefixes = [k for k in page if entries[k] is None]
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        if more:
            out["nextPageToken"] = page[-1]
        return out

    def _media(self, bucket: str, name: str, query: dict) -> bool:
        blob = self.gcs.store.get(bucket, name, query, read=True)
        data, size = blob.data, len(blob.data)
        headers = {
            "Content-Type": blob.content_type,
            "x-goog-generation": str(blob.generation),
            "x-goog-metageneration": str(blob.metageneration),
            "x-goog-stored-content-length": str(size),
            "x-goog-hash": f"crc32c={_crc32c(data)},md5={_md5(data)}",
            "ETag": f'"{blob.generation}"',
            "Accept-Ranges": "bytes",
        }
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m:
                raise GCSError(400, f"bad Range {rng}")
            if m.group(1):
                first = int(m.group(1))
                last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                first, last = max(size - int(m.group(2)), 0), size - 1
            if first >= size and size > 0 or first > last + 1:
                headers["Content-Range"] = f"bytes */{size}"
                self._send(416, b"", headers)
                return True
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
            self._record_read(bucket, name, last + 1 - first)
            self._send(206, data[first : last + 1], headers)
            return True
        self._record_read(bucket, name, size)
        self._send(200, data, headers)
        return True

    def _record_read(self, bucket: str, name: str, nbytes: int) -> None:
        if self.command != "HEAD":
            self.gcs.reads.append(Read(bucket, name, nbytes, self.headers.get(CLIENT_HEADER, "")))

    def _upload(self, rest: str, query: dict, body: bytes) -> bool:
        bucket, _, _ = rest.partition("/o")
        bucket = unquote(bucket)
        store, kind = self.gcs.store, query.get("uploadType")
        if "upload_id" in query:  # a chunk of a resumable upload
            return self._resumable_chunk(query["upload_id"], body)
        if kind == "media":
            ctype = self.headers.get("Content-Type") or "application/octet-stream"
            blob = store.put(bucket, query.get("name", ""), body, query, content_type=ctype)
            self._json(200, resource(bucket, query["name"], blob))
            return True
        if kind == "multipart":
            (_, meta), (part_headers, data) = _parse_multipart(body, self.headers["Content-Type"])[
                :2
            ]
            meta = json.loads(meta or b"{}")
            name = meta.get("name") or query.get("name", "")
            blob = store.put(
                bucket,
                name,
                data,
                query,
                content_type=meta.get("contentType")
                or part_headers.get("content-type", "application/octet-stream"),
                metadata=meta.get("metadata") or {},
            )
            self._json(200, resource(bucket, name, blob))
            return True
        if kind == "resumable" and self.command == "POST":
            meta = json.loads(body or b"{}")
            name = meta.get("name") or query.get("name", "")
            store.check(store.buckets.get(bucket, {}).get(name), query)  # fail early, like GCS
            upload_id = str(next(self.gcs._ids))
            self.gcs.uploads[upload_id] = {
                "bucket": bucket,
                "name": name,
                "data": bytearray(),
                "query": query,
                "content_type": meta.get("contentType")
                or self.headers.get("X-Upload-Content-Type")
                or "application/octet-stream",
                "metadata": meta.get("metadata") or {},
            }
            location = f"{self.gcs.url}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=resumable&upload_id={upload_id}"
            self._send(200, b"", {"Location": location, "X-GUploader-UploadID": upload_id})
            return True
        return False

    def _resumable_chunk(self, upload_id: str, body: bytes) -> bool:
        session = self.gcs.uploads.get(upload_id)
        if session is None:
            raise GCSError(404, f"no upload session {upload_id}")
        if self.command == "DELETE":
            self.gcs.uploads.pop(upload_id, None)
            self._send(499)
            return True
        crange = self.headers.get("Content-Range", "")
        m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", crange.strip())
        if crange and not m:
            raise GCSError(400, f"bad Content-Range {crange}")
        data = session["data"]
        if m and m.group(1) is not None:
            first = int(m.group(1))
            if first > len(data):
                raise GCSError(400, "chunk leaves a gap")
            del data[first:]
            data += body
        elif not crange:
            data[:] = body
        total = m.group(3) if m else str(len(data))
        if total != "*" and int(total) == len(data):
            blob = self.gcs.store.put(
                session["bucket"],
                session["name"],
                bytes(data),
                session["query"],
                content_type=session["content_type"],
                metadata=session["metadata"],
            )
            self.gcs.uploads.pop(upload_id, None)
            self._json(200, resource(session["bucket"], session["name"], blob))
            return True
        headers = {"Range": f"bytes=0-{len(data) - 1}"} if data else {}
        self._send(308, b"", headers)
        return True


def client_env(client: str) -> dict[str, str]:
    """Environment that makes a subprocess's gcsfs requests carry ``CLIENT_HEADER: client``
    (fsspec reads ``FSSPEC_<protocol>`` as JSON keyword arguments of the file system)."""
    options = json.dumps({"session_kwargs": {"headers": {CLIENT_HEADER: client}}})
    return {"FSSPEC_GS": options, "FSSPEC_GCS": options}


@contextlib.contextmanager
def patched_env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration (restoring the previous values after)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def emulated_gcs(buckets=("bucket",)) -> Iterator[GCSEmulator]:
    """This process's ``gs://`` served by a fresh emulator for the duration.

    Besides the environment (``GCSEmulator.env``; subprocesses need nothing else), the clients
    already imported in this process are reset: fsspec's and etils' cached filesystems, gcsfs's
    credentials default (``token="anon"``, read from the environment only at import), and
    Orbax's cached bucket clients. gcsfs's ``ExtendedGcsFileSystem`` (its default) asks the gRPC
    storage-control API for the bucket's layout and, for a standard bucket, then behaves as the
    plain ``GCSFileSystem``; this plain HTTP emulator has no gRPC, so the plain one is used.
    """
    import fsspec
    import gcsfs.core
    from etils.epath import backend
    from orbax.checkpoint._src.path import gcs_utils

    protocols = ("gs", "gcs")
    registry = sys.modules["fsspec.registry"]._registry  # the module's writable dict
    saved_impl = {p: registry.get(p) for p in protocols}
    saved_conf = {p: fsspec.config.conf.get(p) for p in protocols}

    def reset() -> None:
        gcsfs.core.GCSFileSystem.clear_instance_cache()
        backend.fsspec_backend._get_filesystem.cache_clear()
        gcs_utils.get_bucket.cache_clear()

    with GCSEmulator(buckets) as gcs, patched_env(gcs.env()):
        for p in protocols:
            fsspec.register_implementation(p, gcsfs.core.GCSFileSystem, clobber=True)
            fsspec.config.conf[p] = {"token": "anon"}
        reset()
        try:
            yield gcs
        finally:
            for p in protocols:
                if saved_impl[p] is None:
                    registry.pop(p, None)
                else:
                    registry[p] = saved_impl[p]
                if saved_conf[p] is None:
                    fsspec.config.conf.pop(p, None)
                else:
                    fsspec.config.conf[p] = saved_conf[p]
            reset()
