"""Play Allie in your browser: ``python -m launch.play --checkpoint DIR [--port 8000]``.

Serves a local page (board, colour, the engine's Elo and mode, clocks, the engine's predicted
think time and value, arrows for its top moves, takeback, draw offers, rematch, resume after a
reload, optional human pacing, PGN download). ``--checkpoint`` is a model directory or a training
workdir. The ``--warmup`` modes compile before the page is served (``Allie.warmup``: every shape
the mode can meet, as the UCI engine compiles); a game in another mode shows "preparing" while
it compiles, with both clocks stopped, so no compile is ever on Allie's clock.
"""

from __future__ import annotations

import sys

from absl import app, flags

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Model directory or training workdir.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to serve on (0 picks a free one).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0 exposes it).")
_WARMUP = flags.DEFINE_list(
    "warmup",
    ["policy", "adaptive"],
    "Modes compiled before serving; other modes compile when their first game starts "
    "('preparing', clocks stopped).",
)
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache",
    None,
    "JAX persistent compilation cache + executable store directory (default: "
    "$ALLIE_JAX_CACHE_DIR or ~/.cache/allie_jax/jax); 'none' turns it off. A second launch "
    "loads the warm-up's programs instead of compiling them.",
)


def main(argv: list[str]) -> None:
    del argv
    from allie_jax import cli

    cli.setup("launch.play")  # library INFO logs to a file, not the console
    from allie_jax.host_memory import keep_freed_host_memory

    keep_freed_host_memory()  # before JAX starts: XLA's temporaries stop faulting in each call
    # the cache first: importing the engine runs JAX (the chess rules' tables); it serves them
    from allie_jax.engine.compile_cache import enable_compilation_cache

    if (_COMPILE_CACHE.value or "").lower() != "none":
        try:
            enable_compilation_cache(_COMPILE_CACHE.value)
        except OSError as err:  # still serves, it only compiles again next time
            print(f"warning: {err}; compiling without a persistent cache", file=sys.stderr)
    from allie_jax.engine.web import load_app, serve

    print(f"loading {_CHECKPOINT.value} ...", flush=True)
    try:
        play_app = load_app(_CHECKPOINT.value, warmup_modes=tuple(_WARMUP.value))
    except (OSError, ValueError) as err:  # missing / unreadable checkpoint: one line
        print(f"launch.play: error: {err}", file=sys.stderr)
        sys.exit(1)
    try:
        serve(play_app, _HOST.value, _PORT.value)
    except OSError as err:  # port in use, address not available
        print(
            f"launch.play: error: cannot serve on {_HOST.value}:{_PORT.value}: {err}",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    flags.mark_flags_as_required(["checkpoint"])
    app.run(main)
