"""Compiled executables kept across processes, so a restarted engine skips tracing and lowering.

JAX's persistent compilation cache (``engine.compile_cache``) saves XLA's compile step, but a new
process still traces and lowers every jitted function before it can look the program up, and for
the UCI engine's programs (the chess rules and the tree search inside jit) that was most of the
time to ``readyok``. A function declared with ``aot.jit`` behaves as ``jax.jit``; when a store is
enabled (``enable_store``, done by ``engine.compile_cache.enable_compilation_cache``), each call
instead looks up a serialized executable (``jax.experimental.serialize_executable``) by a key made
of the function, its static arguments, the structure, shapes and dtypes of its inputs, and a
fingerprint of everything else that shapes the program: allie_jax's source, the versions of jax,
jaxlib, flax, pgx and numpy, the backend and its devices, XLA flags and JAX's numerics flags.

Safety: the key is checked in full when an entry is read, and an entry that fails to load (another
format, a truncated file, a mismatch) is removed and the function compiles as usual (then writes a
new entry). A call the loaded executable refuses (argument types) falls back to ``jax.jit``.
Entries are written atomically. Only load a store you wrote: like JAX's own cache, deserializing
an executable runs code.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import pathlib
import pickle
import platform
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np

from allie_jax import compat
from allie_jax.thread_flag import ThreadFlag

FORMAT = 2  # 2: the tree definitions pickled apart from the executable
_SUFFIX = ".exe"
MANIFEST_ENTRIES = 64  # executables a launch reads ahead at most (``ExecutableStore.preload``)
KEEP_ENVIRONMENTS = 4  # environment directories kept (most recently used); older ones removed
_PACKAGES = ("jax", "jaxlib", "flax", "pgx", "numpy")
_FLAGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_default_prng_impl",
    "jax_threefry_partitionable",
)
_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
log = logging.getLogger(__name__)


class _Unstorable(Exception):
    """A call whose key cannot be written down stably (e.g. a static argument's repr names an
    object address): it runs through ``jax.jit`` as usual."""


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 over allie_jax's Python source (paths and bytes): any code change, any new key."""
    root = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def host_fingerprint() -> str:
    """The host CPU (model and instruction-set flags): executables hold machine code for it."""
    text = f"{platform.machine()}:{platform.processor()}"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        text += "".join(sorted(set(lines)))
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def environment_fingerprint() -> str:
    """Everything outside the call that shapes a compiled program, as one line of text."""
    versions = []
    for name in _PACKAGES:
        try:
            versions.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name}=?")
    devices = jax.devices()
    backend = devices[0].client
    parts = [
        f"format={FORMAT}",
        f"source={source_fingerprint()}",
        *versions,
        f"backend={backend.platform}:{backend.platform_version}",
        f"devices={len(devices)}x{devices[0].device_kind}",
        f"host={host_fingerprint()}",
        *(f"{flag}={getattr(jax.config, flag, '?')}" for flag in _FLAGS),
        *(f"{env}={os.environ.get(env, '')}" for env in _ENV),
    ]
    return "|".join(parts)


def _leaf_signature(x: Any) -> tuple:
    """What a compiled program fixes about one input (hashable): its abstract value (shape,
    dtype, weak type) and placement."""
    if isinstance(x, jax.Array):
        return (x.aval, x.sharding)
    if isinstance(x, (np.ndarray, np.generic)):
        return (tuple(x.shape), np.dtype(x.dtype), "host")
    if isinstance(x, (bool, int, float, complex)):
        return ((), type(x).__name__, "weak")
    raise _Unstorable(f"input of type {type(x).__name__}")


_MEMO_MIN_LEAVES = 16  # arguments this large (parameters) have their signature memoised
_MEMO_SIZE = 32


_LONG_REPR = 2048  # reprs at least this long (a model's graphdef) are kept by identity
_REPRS: dict[int, tuple[Any, str]] = {}


def _stable_repr(value: Any) -> str:
    """``repr(value)`` for a key; a long one is remembered for the same object (a model's
    graphdef, a static argument of most calls, is slow to print, and every call would print it)."""
    kept = _REPRS.get(id(value))
    if kept is not None and kept[0] is value:
        return kept[1]
    text = repr(value)
    if " at 0x" in text or "object at" in text:
        raise _Unstorable(f"static argument {text[:80]!r} has no stable repr")
    if len(text) >= _LONG_REPR:
        _REPRS[id(value)] = (value, text)  # holds it: the id stays its own
        while len(_REPRS) > _MEMO_SIZE:
            _REPRS.pop(next(iter(_REPRS)))
    return text


@dataclasses.dataclass
class _Entry:
    compiled: Any  # jax.stages.Compiled, or None: run through jax.jit
    key_text: str


class ExecutableStore:
    """Serialized executables in one directory (``<sha256 of the key>.exe``), and the ones
    loaded or compiled by this process in memory.

    ``stats`` counts ``loaded`` (read from disk), ``compiled`` (traced, lowered and compiled
    here, then written), ``unstorable`` and ``fallbacks`` (calls that went through ``jax.jit``)
    and ``bad_entries`` (files removed because they did not load).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = pathlib.Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._memory: dict[tuple, _Entry] = {}
        self._lock = threading.Lock()
        self._environment: str | None = None
        self._directory: pathlib.Path | None = None
        self.stats: collections.Counter = collections.Counter()
        self._memo: dict[int, tuple[Any, tuple]] = {}
        # one writer thread; its pending writes finish before the interpreter exits
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aot-write")
        self._writes: list[concurrent.futures.Future] = []
        # entries this process read or wrote, in order (``save_manifest``), and entries being
        # read ahead by ``preload`` (file name -> future of (key text, executable))
        self._used: dict[str, int] = {}  # name -> tier (``later``)
        self._tier = threading.local()
        self._preloaded: dict[str, concurrent.futures.Future] = {}
        self._readers: dict[int, concurrent.futures.ThreadPoolExecutor] = {}

    def flush(self) -> None:
        """Wait until every entry compiled so far is on disk."""
        while self._writes:
            self._writes.pop(0).result()

    @property
    def environment(self) -> str:
        if self._environment is None:
            self._environment = environment_fingerprint()
        return self._environment

    @property
    def directory(self) -> pathlib.Path:
        """This environment's entries: ``path/<hash of the environment>``. Made on first use,
        when the directories of all but the ``KEEP_ENVIRONMENTS`` most recently used
        environments (old code, old jax) are removed, so the store does not grow forever."""
        if self._directory is None:
            name = hashlib.sha256(self.environment.encode()).hexdigest()[:24]
            directory = self.path / name
            directory.mkdir(parents=True, exist_ok=True)
            os.utime(directory)
            self._directory = directory
            self._prune()
        return self._directory

    def _prune(self) -> None:
        try:
            others = [p for p in self.path.iterdir() if p.is_dir()]
            others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
            for old in others[KEEP_ENVIRONMENTS:]:
                if old != self._directory:
                    shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:  # another process pruning at the same time, a read-only dir
            log.debug("aot: pruning %s: %s", self.path, exc)

    def _argument_signature(self, value: Any) -> tuple:
        """(tree structure, leaf signatures) of one argument. A large argument (a model's
        parameters, passed as the same object call after call) is memoised by identity: were it
        changed in place to other shapes, the loaded executable refuses it and the call falls
        back to ``jax.jit``, so a stale signature costs speed, never a wrong program."""
        memo = self._memo.get(id(value))
        if memo is not None and memo[0] is value:
            return memo[1]
        leaves, treedef = jax.tree.flatten(value)
        signature = (treedef, tuple(_leaf_signature(x) for x in leaves))
        if len(leaves) >= _MEMO_MIN_LEAVES:
            with self._lock:
                self._memo[id(value)] = (value, signature)  # holds it: the id stays its own
                while len(self._memo) > _MEMO_SIZE:
                    self._memo.pop(next(iter(self._memo)))
        return signature

    def call(self, fn: AotFunction, args: tuple, kwargs: dict) -> Any:
        try:
            static, dynamic = fn.split(args, kwargs)
            memory_key = (
                fn.name,
                tuple(sorted(static.items())),
                tuple((k, self._argument_signature(v)) for k, v in dynamic.items()),
            )
        except (_Unstorable, TypeError) as exc:  # unhashable statics, odd inputs: plain jit
            log.debug("aot: %s runs through jax.jit (%s)", fn.name, exc)
            self.stats["unstorable"] += 1
            return fn.jitted(*args, **kwargs)
        entry = self._memory.get(memory_key)
        if entry is None:
            entry = self._entry(fn, static, dynamic, memory_key)
        if entry.compiled is None:
            return fn.jitted(*args, **kwargs)
        if _WARMING.on:
            self.stats["not_run"] += 1
            return _placeholder_outputs(entry.compiled)
        try:
            return entry.compiled(**dynamic)
        except TypeError as exc:  # the executable refuses these inputs: compile as jit would
            log.warning("aot: %s refused its inputs (%s); using jax.jit", fn.name, exc)
            self.stats["fallbacks"] += 1
            with self._lock:
                self._memory[memory_key] = _Entry(None, entry.key_text)
            return fn.jitted(*args, **kwargs)

    def _entry(self, fn: AotFunction, static: dict, dynamic: dict, memory_key: tuple) -> _Entry:
        try:
            key_text = "\n".join(
                [
                    self.environment,
                    fn.name,
                    *(f"{k}={_stable_repr(v)}" for k, v in sorted(static.items())),
                    *(
                        f"{k}: {treedef} {_stable_repr(leaves)}"
                        for k, (treedef, leaves) in memory_key[2]
                    ),
                ]
            )
        except _Unstorable as exc:
            log.debug("aot: %s runs through jax.jit (%s)", fn.name, exc)
            self.stats["unstorable"] += 1
            entry = _Entry(None, "")
        else:
            file = self.directory / (hashlib.sha256(key_text.encode()).hexdigest() + _SUFFIX)
            compiled = self._load(file, key_text)
            if compiled is None:
                lowered = fn.jitted.lower(**static, **dynamic)
                with _fresh_compile() as hits:
                    compiled = lowered.compile()
                self.stats["compiled"] += 1
                if hits:  # JAX's cache answered: that copy cannot be serialized again
                    self.stats["not_stored"] += 1
                else:
                    self._store(file, key_text, compiled)
            entry = _Entry(compiled, key_text)
        with self._lock:
            self._memory[memory_key] = entry
        return entry

    def _load(self, file: pathlib.Path, key_text: str) -> Any:
        ahead = self._preloaded.pop(file.name, None)
        if ahead is None and not file.exists():
            return None
        try:
            stored_key, unfinished = ahead.result() if ahead is not None else _read_entry(file)
            if stored_key != key_text:
                raise ValueError("key or format mismatch")
            compiled = unfinished.finish()
        except Exception as exc:  # any damage: drop the entry, compile again
            log.warning("aot: removing unusable entry %s (%s: %s)", file, type(exc).__name__, exc)
            self.stats["bad_entries"] += 1
            file.unlink(missing_ok=True)
            return None
        self.stats["loaded" if ahead is None else "preloaded"] += 1
        self._mark_used(file.name)
        return compiled

    # -- reading a launch's executables ahead -------------------------------------------------
    @property
    def reading_ahead(self) -> bool:
        """Whether ``preload`` found a record to read ahead (a warm start: what this process
        is about to call was compiled by an earlier launch)."""
        return self.stats["preload_started"] > 0

    def _manifest(self, tag: str) -> pathlib.Path:
        name = hashlib.sha256(tag.encode()).hexdigest()[:24]
        return self.directory / "manifests" / f"{name}.txt"

    def save_manifest(self, tag: str) -> None:
        """Record the entries this process used under ``tag`` (e.g. a checkpoint's path), so the
        next launch with that tag can read them ahead (``preload``). The record is the union with
        the previous one (other options of the same engine), this process's entries first; each
        line is ``name tier``: tier 2 for entries used only under ``later()`` (what a launch
        needs after it is ready), 1 for the rest."""
        path = self._manifest(tag)
        names = dict(self._used)  # this process's: loaded, or written (maybe still pending)
        try:
            if path.exists():
                for name, tier in _parse_manifest(path.read_text()):
                    if name not in names and (self.directory / name).exists():
                        names[name] = tier
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [f"{n} {t}" for n, t in list(names.items())[:MANIFEST_ENTRIES]]
            self._write(path, "\n".join(lines).encode())
        except OSError as exc:  # only the next launch's read-ahead is lost
            log.debug("aot: manifest %s: %s", path, exc)

    def preload(self, tag: str) -> int:
        """Start reading the entries ``tag``'s last launches used, in background threads.

        Deserializing an executable (XLA CPU links its machine code) costs a warm start more
        than anything else and releases the GIL, so it runs beside the imports and the
        checkpoint read that precede the first call; it imports none of the caller's modules
        (``_read_entry``), so it can start as soon as the store is enabled. Tier-1 entries (what
        a launch needs to be ready) are read by up to 4 threads, the largest first (the longest
        jobs first: the last reader to finish is then the one with the least left); tier-2
        entries (used under ``later()``) by one thread at the lowest CPU priority, so they take
        no CPU from getting ready. A call whose entry is still being read waits for it; one whose
        entry was never listed reads it as usual. Entries already started or used are skipped,
        so a second call with the same tag starts nothing. Returns the number of entries
        started."""
        try:
            listed = _parse_manifest(self._manifest(tag).read_text())
        except OSError:
            return 0
        tiers: dict[int, dict[str, int]] = {1: {}, 2: {}}
        for name, tier in listed:
            if name in self._preloaded or name in self._used:
                continue
            try:
                tiers[tier][name] = (self.directory / name).stat().st_size
            except OSError:  # removed since the record was written
                continue
        started = 0
        for tier, sizes in tiers.items():
            pool = self._reader_pool(tier)
            for name in sorted(sizes, key=sizes.get, reverse=True):
                self._preloaded[name] = pool.submit(_read_entry, self.directory / name)
                started += 1
        self.stats["preload_started"] += started
        return started

    def _reader_pool(self, tier: int) -> concurrent.futures.ThreadPoolExecutor:
        pool = self._readers.get(tier)
        if pool is None:
            if tier == 1:
                workers, start = max(1, min(4, os.cpu_count() or 1)), None
            else:
                workers, start = 1, _lowest_priority
            pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix=f"aot-read-{tier}", initializer=start
            )
            self._readers[tier] = pool
        return pool

    @contextlib.contextmanager
    def later(self) -> Iterator[None]:
        """Entries first used within it (this thread) are recorded as tier 2: a later launch
        reads them ahead after the rest, at the lowest priority (``preload``)."""
        before = getattr(self._tier, "value", 1)
        self._tier.value = 2
        try:
            yield
        finally:
            self._tier.value = before

    def _mark_used(self, name: str) -> None:
        tier = getattr(self._tier, "value", 1)
        with self._lock:
            self._used[name] = min(tier, self._used.get(name, tier))

    def _store(self, file: pathlib.Path, key_text: str, compiled: Any) -> None:
        """Serialize now (before the executable first runs: XLA CPU's sort, once run, could no
        longer be serialized: "`LessThan` is not serializable"), write in the writer thread."""
        from jax.experimental import serialize_executable

        try:
            payload, in_tree, out_tree = serialize_executable.serialize(compiled)
            record = {
                "format": FORMAT,
                "key": key_text,
                "executable": payload,
                "trees": pickle.dumps((in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL),
            }
            data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # the executable still serves this process
            log.warning("aot: could not store %s (%s: %s)", file, type(exc).__name__, exc)
            self.stats["write_errors"] += 1
            return
        self._writes.append(self._writer.submit(self._write, file, data))
        self._mark_used(file.name)

    def _write(self, file: pathlib.Path, data: bytes) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, file)  # readers see the whole entry or none
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as exc:  # the executable still serves this process
            log.warning("aot: could not store %s (%s: %s)", file, type(exc).__name__, exc)
            self.stats["write_errors"] += 1


def _parse_manifest(text: str) -> list[tuple[str, int]]:
    """(entry name, tier) per line of a read-ahead record; a line without a tier is tier 1."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].endswith(_SUFFIX):
            out.append((parts[0], 2 if parts[1:2] == ["2"] else 1))
    return out


def _lowest_priority() -> None:
    """Run the calling thread at the lowest CPU priority (Linux: a thread's own nice value)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def _read_entry(file: pathlib.Path) -> tuple[str | None, _Unfinished]:
    """(the entry's key text, its executable loaded but without its tree definitions); raises
    on a damaged or foreign entry. Imports nothing of the caller's: the trees, whose node
    types name its modules, are unpickled by ``_Unfinished.finish`` in the calling thread."""
    with open(file, "rb") as f:
        record = pickle.load(f)  # str and bytes only
    if record.get("format") != FORMAT:
        raise ValueError(f"format {record.get('format')!r}, expected {FORMAT}")
    loaded = compat.load_serialized_executable(record["executable"])
    return record.get("key"), _Unfinished(loaded, record["trees"])


@dataclasses.dataclass
class _Unfinished:
    """A loaded executable (``compat.load_serialized_executable``) and its pickled trees."""

    loaded: tuple[Any, list, bool]
    trees: bytes

    def finish(self) -> Any:
        executable, args_info_flat, no_kwargs = self.loaded
        in_tree, out_tree = pickle.loads(self.trees)
        args_info = in_tree.unflatten(args_info_flat)
        return compat.compiled_from_loaded(executable, args_info, out_tree, no_kwargs)


_WARMING = ThreadFlag()


@contextlib.contextmanager
def compile_only():
    """Within it (this thread), an ``aot.jit`` call under a store compiles or loads its
    executable and returns zeros shaped like its outputs instead of running it.

    For a warm-up: its inputs are synthetic and only the executables it leaves in memory
    matter, so running them (a whole-context pass of a large model takes seconds) is waste.
    Calls that go through plain ``jax.jit`` (no store, an unstorable call) still run.
    """
    with _WARMING.raised():
        yield


def _placeholder_outputs(compiled: Any) -> Any:
    """Zeros with the abstract values and placement of ``compiled``'s outputs (host zeros,
    placed once: no device program per shape)."""

    def zeros(info: jax.ShapeDtypeStruct) -> jax.Array:
        value = np.zeros(info.shape, info.dtype)
        return jax.device_put(value, info.sharding) if info.sharding is not None else value

    return jax.tree.map(zeros, compiled.out_info)


_COMPILE_LOCK = threading.Lock()
_LOCAL = threading.local()


def _note_cache_hit(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits" and getattr(_LOCAL, "hits", None) is not None:
        _LOCAL.hits.append(event)


jax.monitoring.register_event_listener(_note_cache_hit)


@contextlib.contextmanager
def _fresh_compile():
    """One compile that does not read JAX's persistent cache; yields the cache hits seen.

    An executable that JAX's cache deserialized cannot be serialized again (jaxlib 0.10 on CPU:
    the copy fails at run time with "Function ... not found"), so the store compiles its
    entries afresh. The read is bypassed through a private hook (``compiler._cache_read``);
    should a JAX version lack it, the hits are reported and the entry is kept in memory only.
    """
    compiler = compat.jax_compiler_module()

    hits: list[str] = []
    with _COMPILE_LOCK:
        read = getattr(compiler, "_cache_read", None)
        _LOCAL.hits = hits
        if read is not None:
            compiler._cache_read = lambda *args, **kwargs: (None, None)
        try:
            yield hits
        finally:
            _LOCAL.hits = None
            if read is not None:
                compiler._cache_read = read


_STORE: ExecutableStore | None = None


def enable_store(path: str | os.PathLike) -> ExecutableStore:
    """Route every ``aot.jit`` function through a store at ``path`` (process-wide)."""
    global _STORE
    if _STORE is None or _STORE.path != pathlib.Path(path):
        disable_store()
        _STORE = ExecutableStore(path)
    return _STORE


def disable_store() -> None:
    """Back to plain ``jax.jit`` (after the current store's pending writes)."""
    global _STORE
    if _STORE is not None:
        _STORE.flush()
    _STORE = None


def active_store() -> ExecutableStore | None:
    return _STORE


def source_tag(source: str | os.PathLike) -> str:
    """The read-ahead record's name for a model source: an absolute local path, a URL as is."""
    text = os.fspath(source)
    return text if "://" in text else os.path.abspath(text)


def preload(source: str | os.PathLike) -> int:
    """Read ahead the executables the last launches of ``source``'s model used (the active
    store's ``preload``); 0 without a store or a record."""
    store = _STORE
    return 0 if store is None else store.preload(source_tag(source))


class AotFunction:
    """``jax.jit(fun, ...)`` that, with a store enabled, loads and keeps compiled executables."""

    def __init__(
        self,
        fun: Callable,
        *,
        static_argnames: Iterable[str] = (),
        donate_argnames: Iterable[str] = (),
    ) -> None:
        self.static_argnames = tuple(static_argnames)
        self.jitted = jax.jit(
            fun, static_argnames=self.static_argnames, donate_argnames=tuple(donate_argnames)
        )
        self.name = f"{fun.__module__}.{fun.__qualname__}"
        self._signature = inspect.signature(fun)
        kinds = {p.kind for p in self._signature.parameters.values()}
        self._bindable = not kinds & {
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
            inspect.Parameter.POSITIONAL_ONLY,
        }
        functools.update_wrapper(self, fun)

    def split(self, args: tuple, kwargs: dict) -> tuple[dict, dict]:
        """The call's arguments by name: (static ones, the rest)."""
        if not self._bindable:
            raise _Unstorable("signature with *args, **kwargs or positional-only parameters")
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        static = {k: v for k, v in bound.arguments.items() if k in self.static_argnames}
        dynamic = {k: v for k, v in bound.arguments.items() if k not in self.static_argnames}
        return static, dynamic

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        store = _STORE
        if store is None:
            return self.jitted(*args, **kwargs)
        return store.call(self, args, kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.lower(*args, **kwargs)


def jit(
    fun: Callable | None = None,
    *,
    static_argnames: Iterable[str] = (),
    donate_argnames: Iterable[str] = (),
) -> Any:
    """``jax.jit`` whose executables a store can keep across processes (see the module doc).

    Usable as ``@aot.jit`` or ``@functools.partial(aot.jit, static_argnames=...)``. Arguments
    are matched by name (no ``*args``/``**kwargs`` in ``fun``'s signature for the store to apply).
    """
    if fun is None:
        return functools.partial(
            jit, static_argnames=static_argnames, donate_argnames=donate_argnames
        )
    return AotFunction(fun, static_argnames=static_argnames, donate_argnames=donate_argnames)
