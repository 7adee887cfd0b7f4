"""A switch that holds for one thread within a ``with`` block (nested blocks restore it)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class ThreadFlag:
    """``with flag.raised(): ...`` makes ``flag.on`` true in this thread until the block ends.

    For modes a caller sets around code it does not own the call chain of (e.g. ``aot``'s
    compile-only warm-up, ``transformer.shapes_only``): other threads, such as a search running
    beside a background warm-up, keep their own value.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def on(self) -> bool:
        return getattr(self._local, "on", False)

    @contextlib.contextmanager
    def raised(self) -> Iterator[None]:
        before = self.on
        self._local.on = True
        try:
            yield
        finally:
            self._local.on = before
