"""User paths through ``etils.epath``: local files, ``gs://`` and whatever epath has a backend for.

``pathlib`` turns ``gs://b/run`` into a local ``gs:/b/run``; every path a user gives to the data
tools goes through here instead. ArrayRecord's C++ reader and writer and ``np.memmap`` only do
local files, so remote data is staged: ``local_copy`` copies a remote file into a cache, and
``staged_output`` builds an output folder locally and publishes it at the end, which also makes
a run write everything or nothing.
"""

from __future__ import annotations

import contextlib
import glob as glob_lib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence

from etils import epath

_GLOB_CHARS = "*?["


def as_path(path: str | os.PathLike) -> epath.Path:
    """An ``epath.Path`` for any user path (``~`` expanded for local ones)."""
    text = os.fspath(path)
    return epath.Path(text if "://" in text else os.path.expanduser(text))


def is_remote(path: str | os.PathLike) -> bool:
    """True for URLs such as ``gs://b/x`` (anything epath routes to a non-local backend)."""
    return "://" in os.fspath(path)


def glob(pattern: str) -> list[str]:
    """Files matching ``pattern`` (local or remote), sorted; an exact path matches itself."""
    if not is_remote(pattern):
        return sorted(glob_lib.glob(os.path.expanduser(pattern)))
    first = min((pattern.find(c) for c in _GLOB_CHARS if c in pattern), default=-1)
    if first < 0:
        return [pattern] if as_path(pattern).exists() else []
    base = pattern[: pattern.rfind("/", 0, first)]
    rest = pattern[len(base) + 1 :]
    root = as_path(base)
    if not root.exists():
        return []
    return sorted(os.fspath(p) for p in root.glob(rest))


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Files matching the patterns, in a stable order; "-" is stdin. Errors name the pattern."""
    paths: list[str] = []
    for pattern in patterns:
        if pattern == "-":
            paths.append(pattern)
            continue
        matches = glob(pattern)
        if not matches:
            raise FileNotFoundError(f"no input file matches {pattern!r}")
        paths.extend(matches)
    return paths


def cache_dir() -> str:
    """Where remote inputs are staged: $ALLIE_JAX_CACHE, else ~/.cache/allie_jax."""
    return os.environ.get("ALLIE_JAX_CACHE") or os.path.expanduser("~/.cache/allie_jax")


def local_copy(path: str | os.PathLike, *, cache: str | None = None) -> str:
    """A local file with the contents of ``path``: the path itself when local, else a cached copy.

    The copy is keyed by the URL, size and modification time, written to a temporary name and
    renamed, so concurrent processes (several hosts' workers) never read a half-written copy.
    """
    text = os.fspath(path)
    if not is_remote(text):
        return text
    src = as_path(text)
    stat = src.stat()
    size = stat.length
    key = hashlib.sha1(f"{text}\x00{size}\x00{stat.mtime}".encode()).hexdigest()[:16]
    folder = os.path.join(cache or cache_dir(), "remote", key)
    local = os.path.join(folder, os.path.basename(text.rstrip("/")))
    if os.path.exists(local) and os.path.getsize(local) == size:
        return local
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as f:
            shutil.copyfileobj(f, out, 1 << 24)
        os.replace(tmp, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return local


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with as_path(path).open("wb") as f:
        f.write(data)


@contextlib.contextmanager
def staged_output(output: str | os.PathLike, entries: Sequence[str]) -> Iterator[str]:
    """A local folder to write into; on success its ``entries`` replace those of ``output``.

    ``entries`` are the names the run owns in ``output`` (e.g. the split folders and
    ``stats.json``); they are published in the given order, so put the file that marks a
    complete output last. On an exception nothing in ``output`` changes and the staging folder
    is removed. A local output is staged next to it and published by renames; a remote one is
    staged in a temporary folder and uploaded.

    The local staging folder sits in the nearest existing folder on the way to ``output``
    (``output`` itself when it exists), so a failed run creates nothing.
    """
    out = as_path(output)
    remote = is_remote(output)
    if remote:
        stage = tempfile.mkdtemp(prefix="allie_stage_")
    else:  # in the nearest existing folder: same file system (renames), nothing created
        anchor = os.path.abspath(os.fspath(out))
        while not os.path.isdir(anchor):
            anchor = os.path.dirname(anchor)
        stage = tempfile.mkdtemp(prefix=".allie-staging-", dir=anchor)
    try:
        yield stage
        out.mkdir(parents=True, exist_ok=True)
        for name in entries:  # the old run's entries go first: a partial mix never shows
            old = out / name
            if old.is_dir():
                old.rmtree()
            elif old.exists():
                old.unlink()
        for name in entries:
            src = os.path.join(stage, name)
            if not os.path.exists(src):
                continue
            if remote:
                _upload(src, out / name)
            else:
                os.replace(src, os.path.join(os.fspath(out), name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _upload(src: str, dst: epath.Path) -> None:
    if os.path.isdir(src):
        dst.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(src)):
            _upload(os.path.join(src, name), dst / name)
        return
    with open(src, "rb") as f, dst.open("wb") as g:
        shutil.copyfileobj(f, g, 1 << 24)
