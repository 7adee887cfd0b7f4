"""What every ``launch`` command does first, so the console shows the command and not its libraries.

``setup(command)``, the first call in each command's ``main``: every INFO record of the libraries
(Orbax, absl, JAX — including JAX's "Unable to initialize backend 'tpu'" on a host without one)
goes to the run's log file, and the console handlers keep warnings and errors. The log file is
``<dir>/logs/<command>.log`` where ``dir`` is the command's output or work directory (the flag
named by ``log_dir_flag``, when it is a local path), else ``$ALLIE_JAX_HOME/logs`` (default
``~/.cache/allie_jax/logs``). ``fail(command, message)`` is the one-line error exit.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from typing import NoReturn

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d] %(message)s"
_state: dict[str, object] = {}


def default_log_dir() -> pathlib.Path:
    root = os.environ.get("ALLIE_JAX_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "allie_jax"
    )
    return pathlib.Path(root) / "logs"


def _flag_dir(log_dir_flag: str | None) -> pathlib.Path | None:
    """The local directory a parsed flag names (None: unset, remote, or no such flag)."""
    if not log_dir_flag:
        return None
    from absl import flags

    try:
        value = getattr(flags.FLAGS, log_dir_flag)
    except (AttributeError, flags.UnparsedFlagAccessError):
        return None
    if not value or "://" in str(value):
        return None
    return pathlib.Path(os.path.expanduser(str(value))) / "logs"


def setup(command: str, log_dir_flag: str | None = None) -> pathlib.Path | None:
    """Library INFO logs to ``<dir>/logs/<command>.log``; the console keeps WARNING and above.

    Returns the log file (None where no file could be opened: then INFO records are dropped,
    never printed). Safe to call twice (tests run several commands in one process).
    """
    name = command.rsplit(".", 1)[-1]
    root = logging.getLogger()
    for handler in root.handlers:  # absl's console handler, or Python's default stream handler
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.WARNING))
    old = _state.pop("handler", None)
    if isinstance(old, logging.Handler):
        root.removeHandler(old)
        old.close()
    path = None
    for directory in (_flag_dir(log_dir_flag), default_log_dir()):
        if directory is None:
            continue
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(directory / f"{name}.log")
        except OSError:
            continue
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        _state["handler"] = handler
        path = directory / f"{name}.log"
        break
    root.setLevel(logging.INFO)
    logging.getLogger("absl").setLevel(logging.INFO)
    _quiet_background_errors()
    return path


def _quiet_background_errors() -> None:
    """Errors raised in library threads or finalizers (Orbax's async checkpoint loop after a
    failed restore: "Event loop is closed") go to the log file; the command's own error line
    says what went wrong."""
    import threading

    quiet = logging.getLogger("allie_jax.background")
    quiet.propagate = False
    quiet.handlers[:] = [h for h in [_state.get("handler")] if isinstance(h, logging.Handler)]

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        exc = (args.exc_type, args.exc_value, args.exc_traceback)
        quiet.error("in thread %s", getattr(args.thread, "name", "?"), exc_info=exc)

    def unraisable_hook(args) -> None:
        exc = (args.exc_type, args.exc_value, args.exc_traceback)
        quiet.error("unraisable in %r: %s", args.object, args.err_msg, exc_info=exc)

    threading.excepthook = thread_hook
    sys.unraisablehook = unraisable_hook


def log_file() -> pathlib.Path | None:
    """The file ``setup`` routes library logs to (None before ``setup``)."""
    handler = _state.get("handler")
    return pathlib.Path(handler.baseFilename) if isinstance(handler, logging.FileHandler) else None


def fail(command: str, message: str, code: int = 1, *, exit_now: bool = False) -> NoReturn:
    """One line on stderr, ``<command>: error: <message>``, and exit ``code``.

    ``exit_now``: leave with ``os._exit`` after flushing, skipping interpreter finalization, where
    library threads may still be running (Orbax's async checkpoint loop prints "Event loop is
    closed" tracebacks when a restore failed half-way).
    """
    line = " ".join(str(message).split())
    print(f"{command}: error: {line}", file=sys.stderr, flush=True)
    if exit_now:
        sys.stdout.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)
