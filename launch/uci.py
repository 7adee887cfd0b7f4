"""``allie-uci`` / ``python -m launch.uci --checkpoint DIR``: Allie as a UCI engine on stdin/stdout."""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from allie_jax import cli

    cli.setup("launch.uci")  # library INFO logs to a file: stdout is the UCI protocol
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
    parser.add_argument(
        "--fen_model",
        "--fen-model",
        default=None,
        help="a board-reading model for positions given as a FEN whose history cannot be "
        "found: maia:DIR[:elo] (Maia's policy) or board:RUN (a board-family checkpoint)",
    )
    parser.add_argument(
        "--defer_long_shapes",
        "--defer-long-shapes",
        action="store_true",
        help="answer readyok once the shapes of games up to ~120 plies are compiled and compile "
        "longer games' in the background (a GUI that waits under a minute for readyok); that "
        "compile competes with the first game's moves for the CPU, so it is off by default (a "
        "warm launch, whose programs load from --compile-cache, defers their loading always)",
    )
    args = parser.parse_args(argv)
    # Only light checks here: the engine must answer `uci` within a second, so JAX, the model
    # code and the checkpoint load after it (in the handler's loader thread).
    if not args.checkpoint:
        parser.error("--checkpoint DIR is required (or set ALLIE_CHECKPOINT)")
    maia = args.checkpoint.startswith("maia:")
    if maia:
        from allie_jax.baselines.maia_uci import spec_error

        problem = spec_error(args.checkpoint)
        if problem:
            parser.error(f"--checkpoint {problem}")
    else:
        _check_checkpoint(parser, "--checkpoint", args.checkpoint)
    fen_spec = _fen_model_spec(parser, args.fen_model) if args.fen_model else None

    # stdout carries the protocol only: route library chatter (absl, JAX) to stderr
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from allie_jax.host_memory import keep_freed_host_memory

    keep_freed_host_memory()  # before JAX starts: XLA's temporaries stop faulting in each call
    from allie_jax.engine.uci import run_uci

    def load():
        # the cache first: importing the engine runs JAX (the chess rules' tables), which it serves
        from allie_jax.engine.compile_cache import enable_compilation_cache

        if (args.compile_cache or "").lower() != "none":
            try:
                enable_compilation_cache(args.compile_cache)
            except OSError as exc:  # the engine still works, it only compiles again next time
                print(f"warning: {exc}; compiling without a persistent cache", file=sys.stderr)
            else:
                from allie_jax import aot

                # the last launches' executables load in threads while the engine's modules
                # import and the weights are read (Allie.load asks again: nothing restarts)
                aot.preload(args.checkpoint)
        if maia:
            from allie_jax.baselines.maia_uci import load_maia_uci

            return load_maia_uci(args.checkpoint)
        from allie_jax.model.checkpoint import load_model

        # the weights are read while the engine's modules (the chess rules, the search) import
        weights = concurrent.futures.ThreadPoolExecutor(1, "allie-weights")
        model = weights.submit(load_model, args.checkpoint)
        weights.shutdown(wait=False)
        from allie_jax.engine import api
        from allie_jax.engine.api import Allie

        # --defer_long_shapes: readyok once short games' shapes are compiled, long games' in the
        # background (off by default: that compile competes with the first game's moves)
        allie = Allie.load(
            args.checkpoint,
            model=model.result(),
            defer_long_shapes=args.defer_long_shapes,
            leaf_batch=api.PLAY_LEAF_BATCH,
        )
        if fen_spec is not None:
            allie.fen_model = _load_fen_model(fen_spec)
        return allie

    return run_uci(load)


def _check_checkpoint(parser: argparse.ArgumentParser, flag: str, checkpoint: str) -> None:
    """One line and exit 2 for a checkpoint that is missing or a file (local paths without
    importing anything heavy; gs:// through etils.epath)."""
    if "://" in checkpoint:
        from allie_jax.data.paths import as_path

        path = as_path(checkpoint)
        if not path.exists():
            parser.error(f"{flag} {checkpoint!r} does not exist")
        if path.is_file():
            from allie_jax.model.checkpoint import file_instead_of_directory

            parser.error(file_instead_of_directory(path))
        return
    if not os.path.exists(checkpoint):
        parser.error(f"{flag} {checkpoint!r} does not exist")
    if os.path.isfile(checkpoint):  # e.g. the released best.pt: say how to convert it
        import pathlib

        from allie_jax.model.checkpoint import file_instead_of_directory

        parser.error(file_instead_of_directory(pathlib.Path(checkpoint).absolute()))


def _fen_model_spec(parser: argparse.ArgumentParser, spec: str) -> tuple[str, str]:
    """``maia:DIR[:elo]`` -> ("maia", "maia:DIR:policy:ELO"); ``board:RUN`` -> ("board", RUN)."""
    kind, _, rest = spec.partition(":")
    if kind == "maia" and rest:
        directory, _, elo = rest.partition(":")
        full = f"maia:{directory}:policy" + (f":{elo}" if elo else "")
        from allie_jax.baselines.maia_uci import spec_error

        problem = spec_error(full)
        if problem:
            parser.error(f"--fen_model {spec!r}: {problem}")
        return "maia", full
    if kind == "board" and rest:
        _check_checkpoint(parser, "--fen_model", rest)
        return "board", rest
    parser.error(f"--fen_model {spec!r}: expected maia:DIR[:ELO] or board:RUN")
    raise AssertionError  # parser.error exits


def _load_fen_model(spec: tuple[str, str]):
    kind, where = spec
    if kind == "maia":
        from allie_jax.baselines.maia_uci import load_maia_uci

        return load_maia_uci(where)
    from allie_jax.engine.api import Allie

    board = Allie.load(where)
    if not board.reads_boards:
        raise ValueError(f"--fen_model board:{where}: not a board-family checkpoint")
    return board


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
