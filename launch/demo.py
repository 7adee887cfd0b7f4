"""``make demo``: prepare the bundled games, train the tiny model, evaluate it (CPU, minutes)."""

from __future__ import annotations

from absl import app, flags

from allie_jax import cli

_OUTPUT = flags.DEFINE_string("output", "demo_out", "Where data, checkpoints and reports go.")
_STEPS = flags.DEFINE_integer("steps", None, "Training steps (default: configs/tiny.py).")
_EVAL_GAMES = flags.DEFINE_integer("eval_games", 100, "Games to evaluate on (0 skips).")


def main(argv):
    del argv
    cli.setup("launch.demo", "output")
    from allie_jax.demo import run_demo

    run_demo(_OUTPUT.value, steps=_STEPS.value, eval_games=_EVAL_GAMES.value)


if __name__ == "__main__":
    app.run(main)
