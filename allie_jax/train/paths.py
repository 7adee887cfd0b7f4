"""Training's user paths (``--workdir``): through ``etils.epath``, with the data package's rule
for telling a local path from an object store (``allie_jax.data.paths``)."""

from __future__ import annotations

from etils import epath

from allie_jax.data.paths import as_path, is_remote

__all__ = ["absolute", "is_remote"]


def absolute(path: epath.PathLike) -> epath.Path:
    """``path`` as an epath, made absolute when local (Orbax wants absolute local paths)."""
    path = as_path(path)
    return path if is_remote(path) else path.absolute()
