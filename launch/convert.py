"""Convert weights into an allie-jax model directory (config.json + Orbax params).

    python -m launch.convert --format gpt2 --input gpt2-medium/model.safetensors \
        --output ckpt/init --size allie_medium
    python -m launch.convert --format allie --input best.pt --output ckpt/allie \
        --safetensors ckpt/allie.safetensors
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from allie_jax import cli
from allie_jax.convert import ConversionError, convert_gpt2, convert_released_allie
from allie_jax.data import paths
from allie_jax.model.checkpoint import CONFIG_FILE, PARAMS_DIR, export_safetensors, save_model
from allie_jax.model.config import ModelConfig

FLAGS = flags.FLAGS
flags.DEFINE_enum("format", None, ["gpt2", "allie"], "Source format.")
flags.DEFINE_string(
    "input", None, "GPT-2 model.safetensors (or its directory), or best.pt; local or gs://..."
)
flags.DEFINE_string("output", None, "Model directory to write (local or gs://...).")
flags.DEFINE_string("size", None, "Named size (gpt2: default allie_medium; allie: inferred).")
flags.DEFINE_string("safetensors", None, "Also export the parameters to this .safetensors file.")
flags.DEFINE_bool("reinit_embeddings", True, "gpt2: re-initialise wte from its mean/std.")
flags.DEFINE_integer("seed", 0, "gpt2: seed of the re-initialised embeddings and heads.")
flags.DEFINE_bool(
    "allow_unsafe_pickle",
    False,
    "allie: if torch's safe loader refuses the .pt file, unpickle it fully. Unpickling can run "
    "arbitrary code from the file: only for files you trust.",
)
flags.mark_flags_as_required(["format", "input", "output"])


COMMAND = "launch.convert"


def main(argv: list[str]) -> None:
    del argv
    cli.setup(COMMAND)
    try:
        if FLAGS.format == "gpt2":
            config = ModelConfig.named(FLAGS.size or "allie_medium")
            model = convert_gpt2(
                FLAGS.input, config, reinit_embeddings=FLAGS.reinit_embeddings, seed=FLAGS.seed
            )
        else:
            model = convert_released_allie(
                FLAGS.input, size=FLAGS.size, allow_unsafe_pickle=FLAGS.allow_unsafe_pickle
            )
    except (ConversionError, OSError, ValueError) as err:  # one line: no flag help
        cli.fail(COMMAND, str(err))
    # Local or remote (gs://...) outputs through etils.epath: written in a local staging folder,
    # then published whole (renamed, or uploaded), so a failed run leaves the output as it was.
    try:
        with paths.staged_output(FLAGS.output, [CONFIG_FILE, PARAMS_DIR]) as stage:
            save_model(model, stage)
    except OSError as err:
        cli.fail(COMMAND, f"cannot write {FLAGS.output}: {err}")
    print(f"wrote {FLAGS.output} ({model.config.num_layers} layers × {model.config.embed_dim})")
    sys.stdout.flush()
    if FLAGS.safetensors:
        target = paths.as_path(FLAGS.safetensors)
        with paths.staged_output(target.parent, [target.name]) as stage:
            export_safetensors(model, os.path.join(stage, target.name))
        print(f"wrote {FLAGS.safetensors}")


if __name__ == "__main__":
    app.run(main)
