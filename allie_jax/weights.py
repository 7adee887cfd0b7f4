"""Released weights, fetched and checked: the released Allie from the Hugging Face Hub, Maia-1.

``fetch_released_allie`` downloads the released ``best.pt`` with ``huggingface_hub`` (so
``HF_ENDPOINT``, ``HF_HOME``, ``HF_TOKEN`` and offline mode behave as everywhere else on the Hub),
checks its size and sha256 against the Hub's own metadata for the file (and against a pinned
digest when one is given), converts it once through torch's restricted loader and caches the
model directory, keyed by the file's digest. A run that was interrupted resumes: the Hub client
keeps the partial download in its cache and asks for the rest with an HTTP range.

``fetch_maia`` downloads the nine Maia-1 nets from their public repository at a pinned commit,
each checked against the size and sha256 recorded for it, resuming a partial file.

Every failure is a ``FetchError`` whose message names the URL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import json
import os
import pathlib
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

# The released Allie (README of y0mingzhang/allie: "Download the Allie model weights from Hugging
# Face", a dataset repo). ``medium/best.pt`` is the paper's GPT-2-medium shape.
ALLIE_REPO = "yimingzhang/allie-models"
ALLIE_REPO_TYPE = "dataset"
ALLIE_FILE = "medium/best.pt"
ALLIE_REVISION = "main"
# sha256 of medium/best.pt at the Hub commit 29ae29c84a1587e2a64257406cc194f1bd329e89, as another
# public project pins it; pass it as ``sha256=`` to refuse any other file.
ALLIE_MEDIUM_SHA256 = "e64e8862ca630dd1b8cc0b3ff9d6dfa78014ea2c93247192b8f6e835ecf4f523"

# Maia-1: CSSLab/maia-chess at a pinned commit, folder maia_weights/ (GPL-3.0 weights).
MAIA_COMMIT = "e464f161c295f4246c2082f7b36d646d9bd14e7c"
MAIA_BASE_URL = f"https://raw.githubusercontent.com/CSSLab/maia-chess/{MAIA_COMMIT}/maia_weights"
MAIA_FILES: dict[int, tuple[int, str]] = {  # rating: (bytes, sha256)
    1100: (1313193, "e1cf1cd0c96b8a4fa6a275f4b9fd54ed1ffebf9fe44641b9fceded310e9619c4"),
    1200: (1249692, "ead4ba953f233ae732999ebc1e2b675378148527ebcfad2f0acbc5e4c224d98e"),
    1300: (1244431, "36195f87bf4761834baa0bf87472b18509a7261a9d7d6f1a8443261369a733f2"),
    1400: (1328977, "d5353ea6766356dad2d28920c6692f37a5f30963767f1a3105d33b4d0af011e8"),
    1500: (1258199, "35ab6f20421d59e1df3b17c5a5016947af4c6761368ef84044a9a9c7619a9a00"),
    1600: (1313870, "d2c9e5948581acf4b9fc0b1e720c5dc0fe64ce80cfc4a239d3f8a42e1176c876"),
    1700: (1313415, "d277eacd792d340a30abb464dc65127254e65cac57abca17facc469889b96478"),
    1800: (1289431, "0031ad7c4256b1fd09fbebd28418d644d68b26cd2a45df4967ccf5c7ec9c4965"),
    1900: (1262607, "e2f565f42d7cd9f122557e6dc4eb84e5bbaedceda1d404dc485d3611c7c97a12"),
}

RELEASED_MARKER = "released.json"  # written last into a converted model directory
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
_BLOCK = 64 << 10  # read size: at most this much is lost when a transfer breaks
_ATTEMPTS = 3


class FetchError(RuntimeError):
    """A download or check failed; the message names the URL (or the file) and the problem."""


def cache_root() -> pathlib.Path:
    """Where converted weights go by default: ``$ALLIE_JAX_HOME``, else ``~/.cache/allie_jax``."""
    root = os.environ.get("ALLIE_JAX_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "allie_jax"
    )
    return pathlib.Path(root)


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 * _CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------- released Allie
@dataclasses.dataclass(frozen=True)
class HubFile:
    """One file on the Hub and what the Hub says about it."""

    url: str
    commit: str | None
    size: int | None
    sha256: str | None  # the LFS object id (the file's sha256), when the Hub gives one
    location: str | None = None  # where the bytes are: the Hub's redirect, or the commit's URL


def _endpoint() -> str:
    """``HF_ENDPOINT`` read at call time (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _hub_cache(cache_dir: str | os.PathLike | None) -> str:
    """The Hub download cache: ``cache_dir``, else ``HF_HUB_CACHE`` / ``HF_HOME/hub`` read at call
    time (huggingface_hub fixes its default at import), else the client's own default."""
    if cache_dir:
        return os.fspath(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def hub_metadata(
    repo_id: str = ALLIE_REPO,
    filename: str = ALLIE_FILE,
    *,
    repo_type: str = ALLIE_REPO_TYPE,
    revision: str = ALLIE_REVISION,
    token: str | bool | None = None,
) -> HubFile:
    """Size and sha256 of ``filename`` from the Hub's own metadata (one HEAD request)."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
    except ImportError:
        raise FetchError(
            "fetching the released Allie needs huggingface_hub: pip install 'allie-jax[weights]'"
        ) from None
    endpoint = _endpoint()
    url = hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    except Exception as err:  # noqa: BLE001 - httpx, Hub and OS errors: one line naming the URL
        raise FetchError(f"{url}: cannot read the Hub's metadata ({_reason(err)})") from None
    etag = (meta.etag or "").strip('"').lower()
    return HubFile(
        url=url,
        commit=meta.commit_hash,
        size=meta.size,
        sha256=etag if _SHA256.match(etag) else None,
        location=meta.location
        if meta.location and meta.location != url
        else hf_hub_url(
            repo_id,
            filename,
            repo_type=repo_type,
            revision=meta.commit_hash or revision,
            endpoint=endpoint,
        ),  # fmt: skip
    )


def fetch_released_allie(
    output: str | os.PathLike | None = None,
    *,
    repo_id: str = ALLIE_REPO,
    filename: str = ALLIE_FILE,
    repo_type: str = ALLIE_REPO_TYPE,
    revision: str = ALLIE_REVISION,
    sha256: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    size: str | None = None,
    log: Callable[[str], None] | None = None,
) -> pathlib.Path:
    """The released Allie as an allie-jax model directory (downloaded and converted once).

    ``output``: the model directory (default: under ``cache_root()``, named by the file's
    digest). ``sha256``: a pinned digest the file must have (e.g. ``ALLIE_MEDIUM_SHA256``), on top
    of the Hub's own. ``cache_dir``: the Hub download cache (default: ``HF_HOME``'s). ``size``:
    the named model size, inferred from the file when not given.
    """
    log = log or (lambda _msg: None)
    pinned = sha256.lower() if sha256 else None
    if pinned and not _SHA256.match(pinned):
        raise FetchError(f"--sha256 {sha256!r} is not a sha256 digest (64 hex digits)")
    try:
        meta = hub_metadata(repo_id, filename, repo_type=repo_type, revision=revision, token=token)
    except FetchError:
        # offline (HF_HUB_OFFLINE, no network): a model converted earlier from the same file is
        # still the answer; without one, the error names the URL
        done = (
            _converted(pathlib.Path(os.path.expanduser(os.fspath(output))), pinned)
            if output
            else None
        )
        if done and (done.get("repo_id"), done.get("filename")) == (repo_id, filename):
            log(
                f"the Hub is unreachable; using {output} (converted from sha256 {done['sha256'][:12]}…)"
            )
            return pathlib.Path(os.path.expanduser(os.fspath(output)))
        raise
    if pinned and meta.sha256 and meta.sha256 != pinned:
        raise FetchError(
            f"{meta.url}: the Hub lists sha256 {meta.sha256}, not the pinned {pinned}; "
            "refusing to download it"
        )
    digest = pinned or meta.sha256
    if output is None:
        key = (digest or meta.commit or revision)[:12]
        stem = f"{repo_id.split('/')[-1]}-{filename.replace('/', '-').rsplit('.', 1)[0]}-{key}"
        output = cache_root() / stem
    output = pathlib.Path(os.path.expanduser(os.fspath(output)))
    done = _converted(output, digest)
    if done:
        log(f"cached: {output} ({done['filename']}, sha256 {done['sha256'][:12]}…)")
        return output

    local = os.fspath(_hub_download(meta, repo_id, filename, cache_dir, token, log))
    got_size = os.path.getsize(local)
    if meta.size is not None and got_size != meta.size:
        _forget(local)
        raise FetchError(f"{meta.url}: downloaded {got_size} bytes, the Hub lists {meta.size}")
    got = sha256_of(local)
    for expected, who in ((meta.sha256, "the Hub lists"), (pinned, "pinned")):
        if expected and got != expected:
            _forget(local)
            raise FetchError(f"{meta.url}: downloaded file has sha256 {got}, {who} {expected}")

    log(f"converting {filename} ({got_size / 1e6:,.0f} MB) -> {output}")
    from allie_jax.convert import ConversionError, convert_released_allie
    from allie_jax.data import paths
    from allie_jax.model.checkpoint import CONFIG_FILE, PARAMS_DIR, save_model

    try:
        model = convert_released_allie(local, size=size)
    except ConversionError as err:
        raise FetchError(f"{meta.url}: {err}") from None
    record = {
        "repo_id": repo_id,
        "repo_type": repo_type,
        "filename": filename,
        "revision": revision,
        "commit": meta.commit,
        "url": meta.url,
        "size": got_size,
        "sha256": got,
    }
    with paths.staged_output(output, [CONFIG_FILE, PARAMS_DIR, RELEASED_MARKER]) as stage:
        save_model(model, stage)
        pathlib.Path(stage, RELEASED_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    return output


def _converted(output: pathlib.Path, digest: str | None) -> dict | None:
    """The marker of a finished conversion of the file with ``digest`` in ``output``, if any."""
    marker = output / RELEASED_MARKER
    if not marker.is_file() or not (output / "config.json").is_file():
        return None
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if digest and record.get("sha256") != digest:
        return None
    return record


def download_path(
    meta: HubFile, repo_id: str, filename: str, cache_dir: str | os.PathLike | None
) -> pathlib.Path:
    """Where the file is downloaded to (``<Hub cache>/allie_jax/``, so ``HF_HOME`` and
    ``HF_HUB_CACHE`` decide where the large file lives); ``.part`` while incomplete."""
    key = (meta.sha256 or meta.commit or "unknown")[:16]
    name = f"{repo_id.replace('/', '--')}--{filename.replace('/', '--')}--{key}"
    return pathlib.Path(_hub_cache(cache_dir)) / "allie_jax" / name


def _hub_download(
    meta: HubFile,
    repo_id: str,
    filename: str,
    cache_dir: str | os.PathLike | None,
    token: str | bool | None,
    log: Callable[[str], None],
) -> pathlib.Path:
    """The file, downloaded where ``download_path`` says; a ``.part`` left by an interrupted
    run is continued with an HTTP range. The URL is the one the Hub's metadata resolved (its CDN
    for large files); the Hub's auth headers go only to the Hub's own host."""
    from huggingface_hub.utils import build_hf_headers

    target = download_path(meta, repo_id, filename, cache_dir)
    if target.is_file() and (meta.size is None or target.stat().st_size == meta.size):
        log(f"downloaded already: {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if meta.size is not None and have > meta.size:
        part.unlink()
        have = 0
    size = f"{meta.size / 1e6:,.0f} MB" if meta.size else "size unknown"
    resumed = f", resuming at {have / 1e6:,.1f} MB" if have else ""
    log(f"downloading {meta.url} ({size}{resumed})")
    headers = build_hf_headers(token=token)
    headers["Accept-Encoding"] = "identity"
    location = meta.location or meta.url
    if urllib.parse.urlparse(location).netloc != urllib.parse.urlparse(meta.url).netloc:
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    if meta.size is None or have < meta.size:
        _ranged_get(location, part, have, headers, shown_url=meta.url, size=meta.size)
    part.replace(target)
    return target


def _ranged_get(
    url: str,
    part: pathlib.Path,
    have: int,
    headers: dict[str, str],
    *,
    shown_url: str,
    size: int | None,
) -> None:
    """Append ``url``'s bytes from ``have`` on to ``part``, continuing with a range after a
    transfer that broke off (up to ``_ATTEMPTS`` times while each attempt makes progress); a
    server that ignores the range sends the whole file, which then replaces the part."""
    for attempt in range(_ATTEMPTS):
        request_headers = dict(headers)
        if have:
            request_headers["Range"] = f"bytes={have}-"
        request = urllib.request.Request(url, headers=request_headers)
        start = have
        try:
            with urllib.request.urlopen(request, timeout=60) as r:  # noqa: S310 - the Hub's URL
                if have and r.status != 206:
                    have = 0
                with open(part, "ab" if have else "wb") as dst:
                    while True:
                        try:
                            block = r.read(_BLOCK)
                        except http.client.IncompleteRead as cut:
                            dst.write(cut.partial)
                            have += len(cut.partial)
                            raise
                        if not block:
                            break
                        dst.write(block)
                        have += len(block)
            if size is None or have >= size:
                return
            raise http.client.IncompleteRead(b"", size - have)
        except (OSError, ValueError, http.client.HTTPException) as err:
            retry = have > start and attempt + 1 < _ATTEMPTS
            if not retry or isinstance(err, urllib.error.HTTPError):
                raise FetchError(
                    f"{shown_url}: download failed ({_reason(err)}); rerun to resume"
                ) from None


def _forget(local: str) -> None:
    """Drop a bad download, so a rerun fetches it again instead of finding the same bytes."""
    with contextlib.suppress(OSError):
        pathlib.Path(local).unlink()


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# ---------------------------------------------------------------------------- Maia-1
def maia_url(rating: int, base_url: str = MAIA_BASE_URL) -> str:
    return f"{base_url.rstrip('/')}/maia-{rating}.pb.gz"


def fetch_maia(
    output: str | os.PathLike,
    *,
    ratings: Sequence[int] = tuple(MAIA_FILES),
    base_url: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The Maia-1 nets in ``output`` (``maia-XXXX.pb.gz``), each checked against its pinned size
    and sha256; a partial ``.part`` file from an interrupted run is continued, not restarted.

    ``base_url``: where the files are (default ``$ALLIE_JAX_MAIA_URL`` or the pinned repository
    commit); ``file://`` and ``http(s)://`` URLs. Returns ``{"files": [...], "resumed": {name:
    bytes already there}, "fetched": [names downloaded now]}``.
    """
    log = log or (lambda _msg: None)
    base = base_url or os.environ.get("ALLIE_JAX_MAIA_URL") or MAIA_BASE_URL
    out = pathlib.Path(os.path.expanduser(os.fspath(output)))
    out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(ratings) - set(MAIA_FILES))
    if unknown:
        raise FetchError(f"no Maia-1 net for rating(s) {unknown}; there are {sorted(MAIA_FILES)}")
    files, resumed, fetched = [], {}, []
    for rating in ratings:
        size, digest = MAIA_FILES[rating]
        name = f"maia-{rating}.pb.gz"
        target = out / name
        files.append(str(target))
        if target.is_file() and target.stat().st_size == size and sha256_of(target) == digest:
            continue
        url = maia_url(rating, base)
        part = out / (name + ".part")
        have = part.stat().st_size if part.is_file() else 0
        if have > size:  # not a prefix of this file
            part.unlink()
            have = 0
        if have:
            resumed[name] = have
        log(f"downloading {url}" + (f" (resuming at {have:,} bytes)" if have else ""))
        if have < size:
            _download_resuming(url, part, have, size)
        got = sha256_of(part)
        if part.stat().st_size != size or got != digest:
            got_size = part.stat().st_size
            part.unlink()  # a corrupt prefix must not be resumed again
            raise FetchError(
                f"{url}: got {got_size} bytes with sha256 {got}; expected {size} bytes, sha256 "
                f"{digest}"
            )
        part.replace(target)
        fetched.append(name)
    return {"files": files, "resumed": resumed, "fetched": fetched}


def _download_resuming(url: str, part: pathlib.Path, have: int, size: int) -> None:
    """Append bytes ``have..`` of ``url`` to ``part`` (HTTP range; seek for ``file://``)."""
    scheme = urllib.parse.urlparse(url).scheme
    try:
        if scheme == "file":
            src_path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
            with open(src_path, "rb") as src, open(part, "ab") as dst:
                src.seek(have)
                shutil.copyfileobj(src, dst, _CHUNK)
            return
        if scheme not in ("http", "https"):
            raise FetchError(f"{url}: only http(s):// and file:// URLs are supported")
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        with urllib.request.urlopen(request, timeout=60) as r:  # noqa: S310 - a pinned/user URL
            if have and r.status != 206:  # the server ignored the range: start again
                have = 0
            with open(part, "ab" if have else "wb") as dst:
                shutil.copyfileobj(r, dst, _CHUNK)
    except FetchError:
        raise
    except (OSError, urllib.error.URLError, ValueError) as err:
        raise FetchError(f"{url}: download failed ({_reason(err)}); rerun to resume") from None
