"""The paper's optimiser: AdamW with warmup + cosine, global-norm clipping, and the released
trainer's weight decay: Linear (Conv1D in GPT-2) weights only.

The decay rule goes by parameter *names*, not by rank: embeddings (``wte``, ``wpe``, the Elo
control tables) and the ``[heads, head_dim]`` attention biases are matrices too, but the released
PyTorch trainer (GPT-2's ``configure_optimizers`` recipe) never decays them. Names also keep the
rule the same for the unrolled (``blocks.{i}.attn.query``) and the scanned (``layers.attn.query``
with a leading layer axis) layouts, whose ranks differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import ml_collections
import optax

# Weights of the Linear layers: the attention projections and the MLP of every block.
LINEAR_KERNELS = frozenset({"query", "key", "value", "out", "fc", "proj"})
# Module names under which those kernels live (a name such as ``value`` is also a head's name).
LINEAR_MODULES = frozenset({"attn", "mlp"})
HEAD_SUFFIX = "_head"  # value_head, time_head (board family: policy/rights/choice heads too)


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warmup to the peak, then cosine down to ``min_learning_rate``."""
    decay_steps = int(train.decay_steps or train.steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=float(train.learning_rate),
        warmup_steps=int(train.warmup_steps),
        decay_steps=max(decay_steps, int(train.warmup_steps) + 1),
        end_value=float(train.min_learning_rate),
    )


def parameter_names(path: Sequence) -> tuple[str, ...]:
    """The module/parameter names of a pytree path (``DictKey``s), without the Variable's own
    ``.value`` attribute or list indices."""
    return tuple(str(entry.key) for entry in path if isinstance(entry, jax.tree_util.DictKey))


def is_decayed(names: Sequence[str]) -> bool:
    """True for a Linear weight (attention/MLP kernels, the heads' kernels), False for biases,
    LayerNorm, token/position embeddings and the control (Elo) embeddings."""
    names = [n for n in names if not n.isdigit()]
    if not names:
        return False
    name = names[-1]
    if name.endswith(HEAD_SUFFIX):
        return True
    return name in LINEAR_KERNELS and len(names) >= 2 and names[-2] in LINEAR_MODULES


def decay_mask(params):
    """Same tree as ``params``: True where weight decay applies (``is_decayed`` by name)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: is_decayed(parameter_names(path)), params
    )


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(float(train.grad_clip)),
        optax.adamw(
            learning_rate=learning_rate_schedule(train),
            b1=float(train.b1),
            b2=float(train.b2),
            weight_decay=float(train.weight_decay),
            mask=decay_mask,
        ),
    )
