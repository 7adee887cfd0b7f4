"""User-given paths: every one goes through ``etils.epath`` so ``gs://`` works where its backend is
installed; this module holds the one rule that tells a local path from an object store."""

from __future__ import annotations

from etils import epath


def is_remote(path: epath.PathLike) -> bool:
    """True for object-store URIs (gs://, s3://, ...): no append, no ``absolute()``."""
    return "://" in str(path)


def absolute(path: epath.PathLike) -> epath.Path:
    """``path`` as an epath, made absolute when local (Orbax wants absolute local paths)."""
    path = epath.Path(path)
    return path if is_remote(path) else path.absolute()
