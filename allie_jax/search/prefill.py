"""The decoder's roots: each game's prefix through the model's KV cache, reused move after move.

Each game's root prefix ``encode_game(game, partial=True).tokens`` goes through ``model.extend``
on top of what was already cached for that game (an LRU of per-game KV rows, keyed by
``game.game_id`` or the object, verified token by token), so a game played move after move only
runs the plies added since its last search. The prefix's last outputs are the roots' outputs, and
the cache is the leaves' context (``evaluator.DecoderLeaves``).

Prefix lengths are padded to buckets (``LENGTH_BUCKETS`` for the cache, finer
``PREFILL_BUCKETS`` for the tokens computed), or, with ``fixed_shapes``, to two cache widths and
two prefill widths, so a long match compiles each function only a handful of times.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import aot, vocab
from allie_jax.game import Game, encode_game
from allie_jax.model.kv_cache import KVCache
from allie_jax.search import decision
from allie_jax.search.config import SearchConfig
from allie_jax.search.evaluator import DecoderLeaves

LENGTH_BUCKETS = (8, 16, 32, 64, 128, 256, 512)
# Tokens run through the model by one prefill: finer than the cache widths, because the prefill
# computes every padded token (a cold 35-token root padded to 64 doubled its cost, a third of
# a 124M model's move at batch 32), while a new width only recompiles the cheap prefill, not the
# search (whose shapes follow the cache width).
PREFILL_BUCKETS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512)
ENGINE_SHORT_WIDTH = (
    128  # fixed_shapes: games up to ~120 plies use this cache width, longer the model's
)


@functools.partial(aot.jit, static_argnames=("graphdef",))
def _prefill(graphdef, params, tokens, cache: KVCache, num_new):
    model = nnx.merge(graphdef, params)
    out, cache = model.extend(tokens, cache, num_new, last_only=True)
    return jax.tree.map(lambda x: x[:, 0], out), cache


@aot.jit
def _split_rows(k, v):
    """Each row's keys/values ([L, M, H, D]) as its own array, all in one call: slicing the
    rows one by one dispatched 2·B small ops per move (~0.7 ms each on CPU: about 45 ms of a
    32-game move with the small model)."""
    return tuple(k[:, i] for i in range(k.shape[1])), tuple(v[:, i] for i in range(v.shape[1]))


@dataclasses.dataclass
class _CachedRow:
    tokens: np.ndarray
    k: jax.Array  # [L, M, H, D]
    v: jax.Array


@dataclasses.dataclass
class _Prepared:
    keys: list[Any]
    token_rows: list[np.ndarray]


class DecoderRoots:
    """``leaves.Roots`` of the Allie decoder (see the module docstring).

    ``cache_games`` bounds how many games' KV rows are kept between calls (least recently used
    dropped first); ``forget()`` clears them.
    """

    leaves = DecoderLeaves()

    def __init__(
        self,
        model: Any,
        config: SearchConfig,
        *,
        cache_games: int = 1024,
        fixed_shapes: bool = False,
    ):
        self.model = model
        self.config = config
        self.graphdef, self.params = nnx.split(model)
        self.cache_games = cache_games
        self.fixed_shapes = fixed_shapes
        self._rows: collections.OrderedDict[Any, _CachedRow] = collections.OrderedDict()
        self.stats = collections.Counter()  # prefill_tokens, simulations, ...
        # ``warm`` compiles these cache widths only (None: all): a caller may compile the
        # widths long games need later, off the clock (``Allie.warmup``)
        self.warm_widths: tuple[int, ...] | None = None

    def forget(self) -> None:
        self._rows.clear()

    def _tokens(self, game: Game) -> np.ndarray:
        return encode_game(decision.conditioned_game(self.config, game), partial=True).tokens

    @staticmethod
    def _key(game: Game) -> Any:
        return game.game_id or id(game)

    def replay_widths(self) -> tuple[int, ...]:
        """Cache / replay widths: the fine buckets, or two for ``fixed_shapes`` (each width
        compiles the whole search again; a wider cache costs a little attention per simulation)."""
        max_len = self.model.config.max_len
        if self.fixed_shapes:
            return tuple(sorted({min(ENGINE_SHORT_WIDTH, max_len), max_len}))
        return LENGTH_BUCKETS

    def _prefill_width(self, num_new: int, width: int) -> int:
        if self.fixed_shapes:
            return PREFILL_BUCKETS[0] if num_new <= PREFILL_BUCKETS[0] else width
        return decision.bucket(num_new, PREFILL_BUCKETS)

    def prepare(self, games: Sequence[Game], batch: int) -> tuple[list[np.ndarray], _Prepared]:
        token_rows = [self._tokens(g) for g in games]
        heads = [len(t) - len(g.moves) for t, g in zip(token_rows, games, strict=True)]
        keys: list[Any] = [self._key(g) for g in games]
        pad = batch - len(games)
        token_rows += [token_rows[0]] * pad
        heads += [heads[0]] * pad
        keys += [None] * pad
        moves = [t[h:] for t, h in zip(token_rows, heads, strict=True)]
        return moves, _Prepared(keys, token_rows)

    def evaluate(self, prepared: _Prepared, state: Any, legal: Any) -> tuple[Any, KVCache]:
        del state, legal  # the decoder reads the tokens
        return self.prefill(prepared.keys, prepared.token_rows)

    def prefill(self, keys, token_rows) -> tuple[Any, KVCache]:
        """The prefixes' last outputs and their cache, reusing each game's cached rows."""
        cfg = self.model.config
        b = len(token_rows)
        lengths = np.array([len(t) for t in token_rows])
        width = decision.bucket(int(lengths.max()), self.replay_widths())
        if width > cfg.max_len:
            raise ValueError(
                f"a game prefix has {int(lengths.max())} tokens; the model takes at most {cfg.max_len}"
            )
        usable = np.zeros(b, np.int64)
        cached: list[_CachedRow | None] = []
        for i, (key, toks) in enumerate(zip(keys, token_rows, strict=True)):
            row = self._rows.get(key) if key is not None else None
            if row is not None:
                n = min(len(row.tokens), len(toks) - 1, width)
                same = np.flatnonzero(row.tokens[:n] != toks[:n])
                usable[i] = same[0] if len(same) else n
            if key is None:  # batch padding: its outputs are discarded, so skip its prefix
                usable[i] = len(toks) - 1
            cached.append(row if row is not None and usable[i] > 0 else None)
        cache = self._host_cache(b, width, cached, usable)
        num_new = lengths - usable
        s = self._prefill_width(int(num_new.max()), width)
        new = np.full((b, s), vocab.PAD, np.int32)
        for i, toks in enumerate(token_rows):
            new[i, : num_new[i]] = toks[usable[i] :]
        out, cache = _prefill(
            self.graphdef, self.params, jnp.asarray(new), cache, jnp.asarray(num_new, jnp.int32)
        )
        real = np.array([k is not None for k in keys])
        self.stats["prefill_tokens"] += int(num_new[real].sum())
        row_k, row_v = _split_rows(cache.k, cache.v) if real.any() else ((), ())
        for i, (key, toks) in enumerate(zip(keys, token_rows, strict=True)):
            if key is None:
                continue
            self._rows[key] = _CachedRow(toks, row_k[i], row_v[i])
            self._rows.move_to_end(key)
        while len(self._rows) > self.cache_games:
            self._rows.popitem(last=False)
        return out, cache

    def _host_cache(
        self, b: int, width: int, cached: list[_CachedRow | None], usable: np.ndarray
    ) -> KVCache:
        """The prefill's input cache: zeros, each cached row's reusable prefix copied in.

        Built in host memory and placed once per array: zeros from the allocator cost nothing,
        where eager ``jnp.zeros`` and ``.at[].set`` compile one small program per shape in every
        new process (seconds of a warm start) and again per move for each new width. Committed to
        one device whichever rows were cached: jit's cache tells committed and uncommitted inputs
        apart, and warm-up must compile what a move will run.
        """
        cfg = self.model.config
        shape = (cfg.num_layers, b, width, cfg.num_heads, cfg.head_dim)
        k = np.zeros(shape, jnp.dtype(cfg.compute_dtype))
        v = np.zeros(shape, jnp.dtype(cfg.compute_dtype))
        for i, row in enumerate(cached):
            if row is not None:
                m = min(row.k.shape[1], width)
                k[:, i, :m] = np.asarray(row.k)[:, :m]
                v[:, i, :m] = np.asarray(row.v)[:, :m]
        device = jax.devices()[0]
        return KVCache(
            jax.device_put(k, device),
            jax.device_put(v, device),
            jax.device_put(usable.astype(np.int32), device),
        )

    def warm(self, batch: int, replay) -> Iterator[tuple[int, Any, Any, Any, Any]]:
        """For each cache width up to the context (only those in ``warm_widths`` when it is
        set): the prefill (8 new tokens and a cold full width, and the copy of a row growing
        into it from the width below), then the replayed roots."""
        widths = [w for w in self.replay_widths() if w <= self.model.config.max_len]
        chosen = [w for w in widths if self.warm_widths is None or w in self.warm_widths]
        before = self.stats.copy()
        for w in chosen:
            rows = [np.zeros(w, np.int32)] * batch
            keys = [("__warmup__", i) for i in range(batch)]
            self.prefill(keys, rows)  # cold: the whole width
            root_out, cache = self.prefill(keys, rows)  # warm: ≤ 8 new tokens
            below = widths.index(w) - 1
            if below >= 0:  # a game growing into this width copies its cached row
                self.prefill([("__warmup__", -1)], [np.zeros(widths[below], np.int32)])
                self.prefill([("__warmup__", -1)], [np.zeros(widths[below] + 1, np.int32)])
            state, legal = replay(w)
            yield w, state, legal, root_out, cache
        for k in [k for k in self._rows if isinstance(k, tuple) and k[:1] == ("__warmup__",)]:
            del self._rows[k]
        self.stats.clear()
        self.stats.update(before)
