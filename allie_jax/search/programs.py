"""The search of a batch of roots as one jitted program over *abstract* inputs.

``Searcher.run`` calls three jitted functions per move: the prefill, the replay, and
``steps.search`` (the root evaluation, every simulation step, the final policy). The last is
the one that runs the model once per simulation, so it is the program an accelerator check
compiles. Its inputs here are the shapes the Searcher gives it, read with ``jax.eval_shape`` from
the same prefill and replay functions, so a change to their outputs reaches this program too.

Shapes follow the UCI engine's ``fixed_shapes``: a tree of ``max_sims + 1`` slots, and a root
cache ``ENGINE_SHORT_WIDTH`` (128) tokens wide (games up to about 120 plies).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax.model import AllieModel, ModelConfig
from allie_jax.search import budget, finish, prefill, searcher, steps, tree_search
from allie_jax.search.config import SearchConfig
from allie_jax.search.evaluator import DecoderLeaves


@dataclasses.dataclass
class SearchProgram:
    """``jitted.lower(*args, **static)`` is the search of ``batch`` roots."""

    jitted: Any
    args: tuple
    static: dict[str, Any]
    batch: int
    width: int


def _placed(tree: Any, sharding) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def search_program(
    model_config: ModelConfig,
    config: SearchConfig,
    batch: int,
    sharding,
    width: int = prefill.ENGINE_SHORT_WIDTH,
) -> SearchProgram:
    """The search of ``batch`` roots (a power of two) with every input placed on ``sharding``."""
    if batch < 1 or batch & (batch - 1):
        raise ValueError(
            f"search batch {batch}: expected a power of two (the Searcher pads to one)"
        )
    width = min(width, model_config.max_len)
    abstract = nnx.eval_shape(lambda: AllieModel(model_config, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)

    def root_prefill(params, tokens, num_new):
        model = nnx.merge(graphdef, params)
        cache = model.init_cache(batch, width)
        return prefill._prefill.jitted(graphdef, params, tokens, cache, num_new)

    tokens = jax.ShapeDtypeStruct((batch, prefill.PREFILL_BUCKETS[0]), jnp.int32)
    rows = jax.ShapeDtypeStruct((batch,), jnp.int32)
    root_out, cache = jax.eval_shape(root_prefill, params, tokens, rows)
    moves = jax.ShapeDtypeStruct((batch, width), jnp.int32)
    state, legal, _ = jax.eval_shape(
        lambda m, n: searcher._replay.jitted(m, n, config.rules), moves, rows
    )
    budgets = np.full(batch, config.max_sims, np.int32)
    gumbel = finish.gumbel_params(config)
    table = finish.halving_table(config) if gumbel is not None else None
    host_plan = (budgets, budget.scaled_c_puct(config, budgets), np.arange(batch, dtype=np.int32))
    roots = steps.RootBatch(
        *_placed((state, legal), sharding),
        *_placed((root_out, cache), sharding),
    )
    plan = steps.RowPlan(
        *_placed(host_plan, sharding), None if table is None else _placed(table, sharding)
    )
    move = steps.MoveInputs(
        *_placed((np.zeros(batch, bool), jax.eval_shape(lambda: jax.random.key(0))), sharding),
        None,  # anchor logits: the model's own prior
    )
    args = (graphdef, _placed(params, sharding), roots, plan, move)
    static = dict(
        spec=steps.TreeSpec(
            leaves=DecoderLeaves(),
            num_nodes=config.max_sims + 1,
            tree_params=tree_search.SearchParams(
                config.c_base, config.fpu_mode, float(config.fpu), config.max_path
            ),
            row_buckets=searcher.row_buckets(batch, config.mode),
            gumbel=gumbel,
            kl=finish.kl_params(config),
        ),
        config=config,
    )
    return SearchProgram(steps.search.jitted, args, static, batch, width)
