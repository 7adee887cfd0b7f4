"""``allie-uci`` / ``python -m launch.uci --checkpoint DIR``: Allie as a UCI engine on stdin/stdout."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="allie-uci", description=__doc__)
    parser.add_argument(
        "--checkpoint",
        default=os.environ.get("ALLIE_CHECKPOINT"),
        help="model directory (config.json + params) or training workdir; env ALLIE_CHECKPOINT; "
        "or maia:DIR[:preset[:elo]] to play Maia from the user's lc0 nets (GPL, never bundled)",
    )
    parser.add_argument(
        "--compile-cache",
        default=None,
        help="JAX persistent compilation cache directory (default: $ALLIE_JAX_CACHE_DIR or "
        "~/.cache/allie_jax/jax); 'none' turns it off",
    )
    args = parser.parse_args(argv)
    from allie_jax.data.paths import as_path, is_remote

    if not args.checkpoint:
        parser.error("--checkpoint DIR is required (or set ALLIE_CHECKPOINT)")
    maia = args.checkpoint.startswith("maia:")
    if maia:
        from allie_jax.baselines.maia_player import parse_maia_spec

        try:
            maia_dir = parse_maia_spec(args.checkpoint).maia_dir
        except ValueError as exc:
            parser.error(str(exc))
        if not os.path.isdir(maia_dir):
            parser.error(f"--checkpoint {args.checkpoint!r}: Maia directory {maia_dir!r} not found")
    elif not as_path(args.checkpoint).exists():  # local or gs:// (etils.epath)
        parser.error(f"--checkpoint {args.checkpoint!r} does not exist")
    elif as_path(args.checkpoint).is_file():  # e.g. the released best.pt: say how to convert it
        from allie_jax.model.checkpoint import file_instead_of_directory

        path = as_path(args.checkpoint)
        parser.error(file_instead_of_directory(path if is_remote(path) else path.absolute()))

    # stdout carries the protocol only: route library chatter (absl, JAX) to stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from allie_jax.host_memory import keep_freed_host_memory

    keep_freed_host_memory()  # before JAX starts: XLA's temporaries stop faulting in each call
    # the cache first: importing the engine runs JAX (pgx's chess tables), which it serves too
    from allie_jax.engine.compile_cache import enable_compilation_cache

    if (args.compile_cache or "").lower() != "none":
        try:
            enable_compilation_cache(args.compile_cache)
        except OSError as exc:  # the engine still works, it only compiles again next time
            print(f"warning: {exc}; compiling without a persistent cache", file=sys.stderr)

    from allie_jax.engine.api import Allie
    from allie_jax.engine.uci import run_uci

    if maia:
        from allie_jax.baselines.maia_uci import load_maia_uci

        return run_uci(lambda: load_maia_uci(args.checkpoint))
    return run_uci(lambda: Allie.load(args.checkpoint))


def run() -> None:
    """Console-script entry point (``allie-uci``).

    The engine leaves with ``os._exit`` once its output is flushed, skipping interpreter
    finalization: with a gs:// checkpoint, tearing down TensorStore's Cloud Storage threads there
    aborted the process (``terminate called ... exception not rethrown``, status -6) after its
    last ``bestmove``, every time. The engine has nothing else to write at that point.
    """
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the GUI closed the pipe: nothing left to tell it
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
