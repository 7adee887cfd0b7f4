"""JAX's persistent compilation cache in a user cache directory, so a second launch starts fast.

An engine compiles every shape it can meet before its first move (``Allie.warmup``); that costs
a minute or more on a CPU. With the cache on, a later process with the same model config, JAX
version and machine loads the compiled programs from disk instead. Every program is cached
(no minimum compile time or size), because the engine's many small ones add up too.

JAX's cache still traces and lowers each function before the lookup, so the engine's own
programs (``allie_jax.aot.jit``: the search, the rules, the forward) are also kept as whole
serialized executables in ``DIR/executables`` (``allie_jax.aot``), which a later process loads
without tracing. Call this before importing the model and chess code (``allie_jax.engine`` is
light to import): the chess rules' module-level tables run JAX at import time, and
pgx's (loaded when a trace first needs the rules) too; both hit the cache.
"""

from __future__ import annotations

import os

from etils import epath

ENV_VAR = "ALLIE_JAX_CACHE_DIR"


def default_cache_dir() -> epath.Path:
    """``$ALLIE_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/allie_jax/jax``, else ``~/.cache/...``."""
    if os.environ.get(ENV_VAR):
        return epath.Path(os.environ[ENV_VAR])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return epath.Path(base) / "allie_jax" / "jax"


def enable_compilation_cache(
    path: str | os.PathLike | None = None, *, executables: bool = True
) -> epath.Path:
    """Turn JAX's persistent compilation cache on at ``path`` (default ``default_cache_dir()``),
    and with ``executables`` the store of whole executables in ``path/executables``.

    Call before the first compilation. Returns the directory used; raises ``OSError`` naming it
    when it cannot be created.
    """
    import jax

    cache = epath.Path(path) if path is not None else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"compilation cache directory {str(cache)!r}: {exc}") from exc
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if executables:
        from allie_jax import aot

        try:
            aot.enable_store(os.fspath(cache / "executables"))
        except OSError as exc:
            raise OSError(f"compilation cache directory {str(cache)!r}: {exc}") from exc
    return cache
