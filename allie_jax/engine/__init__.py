"""Playing with Allie: the batched inference API, a UCI engine, and engine-vs-engine matches.

``Allie``, ``Decision`` and ``Prediction`` are imported on first use, so a light submodule
(``allie_jax.engine.compile_cache``) can be imported, and JAX's persistent cache turned on,
before the model and chess code run their import-time JAX work.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Allie", "Decision", "Prediction"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from allie_jax.engine import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
