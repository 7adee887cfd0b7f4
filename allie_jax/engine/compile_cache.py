"""JAX's persistent compilation cache in a user cache directory, so a second launch starts fast.

An engine compiles every shape it can meet before its first move (``Allie.warmup``); that costs
a minute or more on a CPU. With the cache on, a later process with the same model config, JAX
version and machine loads the compiled programs from disk instead. Every program is cached
(no minimum compile time or size), because the engine's many small ones add up too.
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


def enable_compilation_cache(path: str | os.PathLike | None = None) -> epath.Path:
    """Turn JAX's persistent compilation cache on at ``path`` (default ``default_cache_dir()``).

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
    return cache
