"""A deterministic toy game that our tree search and stock mctx can both play.

The state is a uint32 hash; prior logits and value are hashes of it, and some moves are illegal at
every node (prior logit ``ILLEGAL_LOGIT``). One definition serves the pUCT parity tests
(test_search) and the Gumbel parity tests (test_gumbel), so both compare against the same game.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import mctx

from allie_jax.search import selection, tree_search


def mix(x, y):
    """A cheap uint32 hash step (multiply-xorshift)."""
    x = (x ^ (y * jnp.uint32(0x9E3779B1))) * jnp.uint32(0x85EBCA6B)
    return x ^ (x >> 13)


@dataclasses.dataclass(frozen=True)
class ToyGame:
    """``num_actions`` moves; logits uniform in [offset, offset + scale); 1 in ``legal_one_in`` illegal."""

    num_actions: int
    scale: float
    offset: float = 0.0
    legal_one_in: int = 5

    def eval(self, h, legal_one_in: int | None = None):
        """Masked prior logits [B, A] and value [B] of the states ``h`` [B]."""
        acts = jnp.arange(self.num_actions, dtype=jnp.uint32)
        r = mix(h[:, None], acts[None] + 11)
        logits = (r >> 8).astype(jnp.float32) / 2**24 * self.scale + self.offset
        legal = (r % (legal_one_in or self.legal_one_in)) != 0
        legal = legal.at[:, 0].set(True)
        value = (mix(h, jnp.uint32(99)) >> 8).astype(jnp.float32) / 2**24 * 2 - 1
        return selection.mask_logits(logits, legal), value

    def expand(self, payloads, parent, path_nodes, path_len, action, num_active):
        """Our tree search's expand hook (payload = the node's state hash)."""
        rows = jnp.arange(parent.shape[0])
        h = mix(payloads[rows, parent], action.astype(jnp.uint32) + 1)
        logits, value = self.eval(h)
        return tree_search.NodeEval(logits, value, jnp.zeros_like(value, bool), h)

    def recurrent(self, params, rng, action, embedding):
        """Stock mctx's recurrent_fn for the same game (two-player: discount -1)."""
        h = mix(embedding, action.astype(jnp.uint32) + 1)
        logits, value = self.eval(h)
        out = mctx.RecurrentFnOutput(
            reward=jnp.zeros_like(value),
            discount=-jnp.ones_like(value),
            prior_logits=logits,
            value=value,
        )
        return out, h

    def root(self, batch: int):
        """Root hashes, logits and values for ``batch`` games."""
        h = jnp.arange(batch, dtype=jnp.uint32) * 7 + 3
        logits, value = self.eval(h)
        return h, logits, value
