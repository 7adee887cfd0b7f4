"""The one rule that turns a final policy into a move, and the one resignation rule.

Every preset ends here: the Searcher's budget-0 rows (``policy``, ``greedy``, an adaptive budget
of 0), its searched rows, and the engine's fallback for positions the Searcher cannot take (a
FEN start, a game longer than the context, a claimable draw). Keeping the rule in one place is
what stops the paths drifting: the move rule (``SearchConfig.move_rule``: sample, argmax, or the
released rating-based switch), the temperature of budget-0 moves, and resignation.

The functions are written with ``jax.numpy`` and run inside the Searcher's jit; ``policy_step``
is also jitted on its own for the fallback path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import aot, vocab
from allie_jax.game import Game
from allie_jax.search.config import SearchConfig


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (≥ 1): batch sizes are padded to these."""
    return 1 << max(0, (int(n) - 1).bit_length())


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The first of ``buckets`` (ascending) that holds n; beyond the last, the next power of two."""
    for b in buckets:
        if n <= b:
            return b
    return next_pow2(n)


def as_jax_key(rng: Any) -> jax.Array:
    """Accept an int seed, a numpy Generator, None (seed 0) or a jax key."""
    if rng is None:
        rng = 0
    if isinstance(rng, np.random.Generator):
        return jax.random.key(int(rng.integers(2**31 - 1)))
    if isinstance(rng, int | np.integer):
        return jax.random.key(int(rng))
    return rng


def conditioned_game(config: SearchConfig, game: Game) -> Game:
    """The game as the model reads it under ``config``: ``greedy`` sets both Elos to greedy_elo."""
    if config.mode == "greedy":
        return dataclasses.replace(game, white_elo=config.greedy_elo, black_elo=config.greedy_elo)
    return game


def argmax_rows(
    config: SearchConfig, games: Sequence[Game], batch: int | None = None
) -> np.ndarray:
    """bool [batch]: which rows take the argmax of their final policy instead of sampling.

    ``move_rule`` "argmax" (greedy's default) → all; "sample" → none; "rating-based" (the
    released code's switch) → rows whose mover is rated ≥ ``rating_based_elo`` (greedy: its
    greedy_elo) after the first 8 plies. Padding rows beyond ``len(games)`` sample.
    """
    batch = len(games) if batch is None else batch
    rows = np.zeros(batch, bool)
    rule = config.move_rule
    if rule == "argmax":
        rows[: len(games)] = True
    elif rule == "rating-based":
        for i, g in enumerate(games):
            elo = g.white_elo if len(g.moves) % 2 == 0 else g.black_elo
            if config.mode == "greedy":
                elo = config.greedy_elo
            rows[i] = (elo or 0) >= config.rating_based_elo and len(g.moves) > 8
    return rows


def draw_moves(policy: jax.Array, legal: jax.Array, argmax: jax.Array, rng: jax.Array) -> jax.Array:
    """int32 [B]: each row's move from its final policy [B, A] (argmax rows take the mode)."""
    logp = jnp.log(jnp.maximum(policy, 1e-38))
    sampled = jax.random.categorical(rng, jnp.where(legal & (policy > 0), logp, -jnp.inf))
    best = jnp.argmax(jnp.where(legal, policy, -1.0), -1)
    return jnp.where(argmax, best, sampled).astype(jnp.int32)


def resign_flags(
    policy_logits: jax.Array, legal: jax.Array, value_stm: jax.Array, config: SearchConfig
) -> jax.Array:
    """bool [B]: the paper's rule, the termination token's logit beats every legal move's AND
    the side to move's value is below ``resign_value`` (and ``config.resign`` allows it).

    ``policy_logits`` are the raw [B, ≥1993] logits (move ids first, then special tokens).
    """
    moves = jnp.where(legal, policy_logits[:, : vocab.NUM_MOVES], -jnp.inf)
    beats = policy_logits[:, vocab.TERMINATION] > moves.max(-1)
    return beats & (value_stm < config.resign_value) & config.resign


def legal_prior(logits: jax.Array, legal: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Softmax over the legal moves only (zeros elsewhere), at a temperature."""
    x = jnp.where(legal, logits[:, : vocab.NUM_MOVES].astype(jnp.float32) / temperature, -jnp.inf)
    return jnp.where(legal, jax.nn.softmax(x, axis=-1), 0.0)


def policy_step(
    policy_logits: jax.Array,
    legal: jax.Array,
    value_stm: jax.Array,
    argmax: jax.Array,
    rng: jax.Array,
    config: SearchConfig,
) -> dict[str, jax.Array]:
    """A budget-0 decision: the move from the tempered legal prior, and the resignation flag."""
    prior = legal_prior(policy_logits, legal)
    tempered = legal_prior(policy_logits, legal, config.temperature)
    return {
        "move_id": draw_moves(tempered, legal, argmax, rng),
        "policy": tempered,
        "prior": prior,
        "resign": resign_flags(policy_logits, legal, value_stm, config),
    }


@functools.partial(aot.jit, static_argnames=("config",))
def policy_step_jit(policy_logits, legal, value_stm, argmax, rng, *, config: SearchConfig):
    """``policy_step`` compiled on its own (the fallback path's entry)."""
    return policy_step(policy_logits, legal, value_stm, argmax, rng, config)
