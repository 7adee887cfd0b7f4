"""Keep freed host memory in the process, so XLA on CPU stops paying page faults every call.

XLA's CPU runtime allocates each call's temporaries (a search's [B, N, 1968] tree statistics, the
prefill's activations) with ``malloc`` and frees them at the end of the call. glibc serves such
large blocks with fresh ``mmap`` pages (or from per-thread arenas it trims) and hands them back
to the kernel on ``free``, so the next call faults every page in again and the kernel zeroes it,
on every move of a batched search. With one arena, no ``mmap`` for large blocks and no
trimming, the same pages are reused from call to call: no faults per move. The fault counts,
and what it saves in time on one machine, are in ``bench/RESULTS.md``.

The price: the process keeps its peak heap (it never returns freed memory to the OS; glibc's
heap can grow by a few calls' worth of temporaries before its free blocks fit every call) and
all threads share one malloc arena. That suits the processes that run the same programs again and
again (the UCI engine, matches, evaluation, the browser server), which call this first; training
does not. ``ALLIE_JAX_HOST_MALLOC=system`` turns it off.

It must run before JAX starts its CPU backend (before the first computation: importing the chess
rules' tables counts): threads that already own an arena keep it. Later calls change nothing and
return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from allie_jax import compat

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = 2**31 - 1

ENV = "ALLIE_JAX_HOST_MALLOC"
_applied = False


def _backend_started() -> bool:
    """True once JAX has created a backend (its thread pools then own their arenas)."""
    return compat.jax_backends_started()


def keep_freed_host_memory() -> bool:
    """Configure glibc malloc as described above; True when it took effect in this call.

    A no-op (False) off glibc, when ``ALLIE_JAX_HOST_MALLOC=system``, when already applied, or
    when JAX's backend is already running (too late to move its threads to one arena).
    """
    global _applied
    if (
        _applied
        or os.environ.get(ENV, "").lower() == "system"
        or not sys.platform.startswith("linux")
    ):
        return False
    if _backend_started():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER_TRIM))
    )
    _applied = ok
    return ok
