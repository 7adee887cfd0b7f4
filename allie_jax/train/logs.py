"""Library logs to a file in the workdir, so the console shows the run and not Orbax's internals.

Orbax logs ~25 INFO lines per save and JAX/absl add their own; through a progress bar that is
unreadable. While training, every INFO record goes to ``WORKDIR/logs/train.log`` (process i > 0:
``train.process<i>.log``) and the console handlers only pass warnings and errors. A workdir on a
remote filesystem (``gs://``) cannot be appended to line by line: the log then goes to a local
temporary directory, and the start-up lines say where.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import tempfile
from collections.abc import Iterator

import jax
from etils import epath

from allie_jax.train.paths import is_remote


def log_file_for(workdir: epath.Path, name: str = "train") -> pathlib.Path:
    """Where this process's log goes (local: under the workdir; remote: a local temp dir)."""
    process = jax.process_index()
    name = f"{name}.log" if process == 0 else f"{name}.process{process}.log"
    if not is_remote(workdir):
        return pathlib.Path(workdir) / "logs" / name
    return pathlib.Path(tempfile.mkdtemp(prefix="allie_train_logs_")) / name


@contextlib.contextmanager
def library_logs_to_file(workdir: epath.Path, name: str = "train") -> Iterator[pathlib.Path]:
    """Route INFO and above to the log file; console handlers keep WARNING and above.

    ``name`` names the file (``logs/<name>.log``): the demo's evaluation uses ``"evaluate"``.
    """
    path = log_file_for(workdir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setLevel(logging.INFO)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d] %(message)s")
    )
    root = logging.getLogger()
    absl_logger = logging.getLogger("absl")
    consoles = [(h, h.level) for h in root.handlers]
    saved_levels = (root.level, absl_logger.level)
    for h, level in consoles:
        h.setLevel(max(level, logging.WARNING))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    absl_logger.setLevel(logging.INFO)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for h, level in consoles:
            h.setLevel(level)
        root.setLevel(saved_levels[0])
        absl_logger.setLevel(saved_levels[1])
