"""``Searcher``: Allie's four presets for a batch of games, in two jitted calls per move.

1. Prefill: each game's root prefix ``encode_game(game, partial=True).tokens`` goes through
   ``model.extend`` on top of what the Searcher already cached for that game (an LRU of per-game
   KV rows, keyed by ``game.game_id`` or the object, verified token by token), so a game played
   move after move only runs the plies added since its last search.
2. Search: replay the games inside jit (chess_jax), set each game's budget from the time head,
   run ``tree_search.search`` with the model evaluator (one token per simulation), and turn the
   root statistics into the final policy, the move, and the resignation flag.

Batches are padded to powers of two and prefix lengths to buckets, and the tree size to a power
of two of the largest budget, so a long match compiles each function only a handful of times.

Mixed budgets (``adaptive``): the batch runs max(budget) simulation steps. Inside the search the
rows are sorted by budget (descending; results come back in the callers' order, and each row's
move is drawn after un-sorting, so it does not depend on the sort), so the games still searching
at a step are a prefix and the model runs on the smallest of (B, B/2, ..., B/16) rows covering
them (``row_buckets``). A batch of 32 games with budgets 41..132 thus costs about its real
simulations instead of 32 × 132.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import chess_jax, vocab
from allie_jax.game import Game, denormalize_think_time, encode_game
from allie_jax.model.kv_cache import KVCache
from allie_jax.search import budget as budget_lib
from allie_jax.search import evaluator, pibar, selection, tree_search
from allie_jax.search.config import SearchConfig

LENGTH_BUCKETS = (8, 16, 32, 64, 128, 256, 512)
# Tokens run through the model by one prefill: finer than the cache widths, because the prefill
# computes every padded token (a cold 35-token root padded to 64 doubled its cost, a third of
# a 124M model's move at batch 32), while a new width only recompiles the cheap prefill, not the
# search (whose shapes follow the cache width).
PREFILL_BUCKETS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512)


@dataclasses.dataclass
class SearchOutput:
    """Per-game results (numpy, batch first). ``value_white`` is the value head at the root."""

    move: list[str]
    move_id: np.ndarray  # int32 [B]
    policy: np.ndarray  # float32 [B, 1968]: the final policy the move was drawn from
    prior: np.ndarray  # float32 [B, 1968]: the model's policy over legal moves (T = 1)
    visit_counts: np.ndarray  # int32 [B, 1968]: root visits (0 without search)
    num_sims: np.ndarray  # int32 [B]
    value_white: np.ndarray  # float32 [B]
    think_time_s: np.ndarray  # float32 [B]: predicted, clipped to [0, max_think_time]
    resign: np.ndarray  # bool [B]
    search_value: np.ndarray  # float32 [B]: the root's searched value, side to move's view


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _bucket(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return _next_pow2(n)


def _as_key(rng: Any) -> jax.Array:
    if isinstance(rng, np.random.Generator):
        return jax.random.key(int(rng.integers(2**31)))
    if isinstance(rng, int | np.integer):
        return jax.random.key(int(rng))
    return rng


def row_buckets(batch: int, mode: str) -> tuple[int, ...]:
    """Batch sizes the model evaluation is compiled for: (B, B/2, ..., B/16) for ``adaptive``.

    A batch runs max(budget) simulation steps; with rows sorted by budget the games still
    searching at step s are a prefix, and the model runs on the smallest size covering them, so
    a mixed-budget batch computes at most ~2x its real simulations (plus the B/16 floor) instead
    of B · max(budget). Other modes (equal budgets) compile the batch size only, which keeps
    one compiled search per (batch, tree size) whatever the budgets.
    """
    if batch == 1 or mode != "adaptive":
        return (batch,)
    return tuple(batch >> i for i in range(5) if batch >> i >= 1)


def tree_size(max_budget: int, max_sims: int) -> int:
    """Node slots for a batch: next power of two of the largest budget (≤ max_sims), plus the root."""
    if max_budget <= 0:
        return 1
    return min(_next_pow2(max_budget), max(max_sims, max_budget)) + 1


# ----------------------------------------------------------------------------- jitted pieces
@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill(graphdef, params, tokens, cache: KVCache, num_new):
    model = nnx.merge(graphdef, params)
    out, cache = model.extend(tokens, cache, num_new)
    last = jnp.maximum(num_new - 1, 0)[:, None]

    def pick(x):
        return jnp.take_along_axis(x, last.reshape(last.shape + (1,) * (x.ndim - 2)), axis=1)[:, 0]

    return jax.tree.map(pick, out), cache


@functools.partial(jax.jit, static_argnames=("rules",))
def _replay(move_ids, lengths, rules):
    state = chess_jax.replay(move_ids, lengths, rules)
    legal = chess_jax.legal_mask(state)
    done, _ = chess_jax.outcome(state, legal)
    return state, legal, done


@functools.partial(
    jax.jit, static_argnames=("graphdef", "num_nodes", "config", "tree_params", "row_buckets")
)
def _search(
    graphdef,
    params,
    cache: KVCache,
    root_state,
    root_out,
    budgets,
    c_puct,
    argmax_rows,
    rng,
    order,
    *,
    num_nodes: int,
    config: SearchConfig,
    tree_params: tree_search.SearchParams,
    row_buckets: tuple[int, ...],
):
    model = nnx.merge(graphdef, params)
    sorted_rows = len(row_buckets) > 1  # rows by budget, descending: the active rows are a prefix

    def take(x, index, axis=0):
        return jnp.take(x, index, axis=axis) if sorted_rows else x

    cache_s = KVCache(take(cache.k, order, 1), take(cache.v, order, 1), take(cache.length, order))
    state_s, out_s = jax.tree.map(lambda x: take(x, order), (root_state, root_out))
    budgets_s, c_puct_s = take(budgets, order), take(c_puct, order)
    root = evaluator.root_eval(model, state_s, out_s, cache_s)
    legal = selection.legal_from_logits(root.prior_logits)
    prior = jax.nn.softmax(root.prior_logits, axis=-1)
    prior = jnp.where(legal, prior, 0.0)
    tempered = jnp.where(legal, jax.nn.softmax(root.prior_logits / config.temperature, -1), 0.0)
    if num_nodes > 1:
        expand = evaluator.make_model_expand(model, cache_s, row_buckets)
        tree = tree_search.search(
            root, expand, budgets_s, c_puct_s, num_nodes=num_nodes, params=tree_params
        )
        visits = tree.children_visits[:, 0]
        q = jax.vmap(
            lambda t, i: selection.completed_q(t, i, fpu_mode=config.fpu_mode, fpu=config.fpu),
            in_axes=(0, None),
        )(tree, 0)
        lam = pibar.kl_lambda(c_puct_s, visits.sum(-1), legal.sum(-1), sqrt=config.lambda_sqrt)
        if config.final_policy == "pibar":
            searched = pibar.pibar(q, prior, legal, lam, iterations=config.pibar_iterations)
        else:
            searched = pibar.visit_policy(visits, prior)
        policy = jnp.where((budgets_s > 0)[:, None], searched, tempered)
        search_value = tree.node_values[:, 0]
    else:
        visits = jnp.zeros(prior.shape, jnp.int32)
        policy = tempered
        search_value = root.value
    # back to the callers' row order before sampling, so a row's move does not depend on how
    # the batch was sorted
    inverse = jnp.argsort(order)
    legal, prior, policy, visits, search_value, root_value = jax.tree.map(
        lambda x: take(x, inverse), (legal, prior, policy, visits, search_value, root.value)
    )
    logp = jnp.log(jnp.maximum(policy, 1e-38))
    sampled = jax.random.categorical(rng, jnp.where(legal & (policy > 0), logp, -jnp.inf))
    move = jnp.where(argmax_rows, jnp.argmax(jnp.where(legal, policy, -1.0), -1), sampled)
    move_logits = jnp.where(legal, root_out.policy_logits[:, : vocab.NUM_MOVES], -jnp.inf)
    resign_logit = root_out.policy_logits[:, vocab.TERMINATION] > move_logits.max(-1)
    resign = resign_logit & (root_value < config.resign_value) & config.resign
    return {
        "move_id": move.astype(jnp.int32),
        "policy": policy,
        "prior": prior,
        "visits": visits.astype(jnp.int32),
        "resign": resign,
        "search_value": search_value,
    }


# ----------------------------------------------------------------------------- the Searcher
@dataclasses.dataclass
class _CachedRow:
    tokens: np.ndarray
    k: jax.Array  # [L, M, H, D]
    v: jax.Array


class Searcher:
    """Runs a ``SearchConfig`` preset on batches of games with one model.

    ``cache_games`` bounds how many games' KV rows are kept between calls (least recently used
    dropped first); ``forget()`` clears them.
    """

    def __init__(self, model: Any, config: SearchConfig | None = None, *, cache_games: int = 1024):
        self.model = model
        self.config = config or SearchConfig()
        self.graphdef, self.params = nnx.split(model)
        self.cache_games = cache_games
        self._rows: collections.OrderedDict[Any, _CachedRow] = collections.OrderedDict()
        self.stats = collections.Counter()  # prefill_tokens, simulations, ...

    def forget(self) -> None:
        self._rows.clear()

    # -- helpers -----------------------------------------------------------------------------
    def _tokens(self, game: Game) -> np.ndarray:
        if self.config.mode == "greedy":
            game = dataclasses.replace(
                game, white_elo=self.config.greedy_elo, black_elo=self.config.greedy_elo
            )
        return encode_game(game, partial=True).tokens

    @staticmethod
    def _key(game: Game) -> Any:
        return game.game_id or id(game)

    def _prefill(self, keys, token_rows):
        cfg = self.model.config
        b = len(token_rows)
        lengths = np.array([len(t) for t in token_rows])
        width = _bucket(int(lengths.max()), LENGTH_BUCKETS)
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
        cache = self.model.init_cache(b, width)
        if any(r is not None for r in cached):
            k, v = cache.k, cache.v
            for i, row in enumerate(cached):
                if row is None:
                    continue
                m = min(row.k.shape[1], width)
                k = k.at[:, i, :m].set(row.k[:, :m])
                v = v.at[:, i, :m].set(row.v[:, :m])
            cache = KVCache(k, v, cache.length)
        cache = KVCache(cache.k, cache.v, jnp.asarray(usable, jnp.int32))
        num_new = lengths - usable
        s = _bucket(int(num_new.max()), PREFILL_BUCKETS)
        new = np.full((b, s), vocab.PAD, np.int32)
        for i, toks in enumerate(token_rows):
            new[i, : num_new[i]] = toks[usable[i] :]
        out, cache = _prefill(
            self.graphdef, self.params, jnp.asarray(new), cache, jnp.asarray(num_new, jnp.int32)
        )
        real = np.array([k is not None for k in keys])
        self.stats["prefill_tokens"] += int(num_new[real].sum())
        for i, (key, toks) in enumerate(zip(keys, token_rows, strict=True)):
            if key is None:
                continue
            self._rows[key] = _CachedRow(toks, cache.k[:, i], cache.v[:, i])
            self._rows.move_to_end(key)
        while len(self._rows) > self.cache_games:
            self._rows.popitem(last=False)
        return out, cache

    # -- the API -----------------------------------------------------------------------------
    def run(self, games: Sequence[Game], rng: Any) -> SearchOutput:
        """Choose a move for every game (each must have a legal move: no finished games)."""
        if len(games) == 0:
            raise ValueError("games is empty")
        cfg = self.config
        n = len(games)
        b = _next_pow2(n)
        token_rows = [self._tokens(g) for g in games]
        heads = [len(t) - len(g.moves) for t, g in zip(token_rows, games, strict=True)]
        keys: list[Any] = [self._key(g) for g in games]
        pad = b - n
        token_rows += [token_rows[0]] * pad
        keys += [None] * pad
        root_out, cache = self._prefill(keys, token_rows)

        move_lists = [t[h:] for t, h in zip(token_rows, heads + [heads[0]] * pad, strict=True)]
        width = _bucket(max(1, max(len(m) for m in move_lists)), LENGTH_BUCKETS)
        move_ids = np.zeros((b, width), np.int32)
        for i, m in enumerate(move_lists):
            move_ids[i, : len(m)] = m
        lengths = np.array([len(m) for m in move_lists], np.int32)
        state, _, done = _replay(jnp.asarray(move_ids), jnp.asarray(lengths), cfg.rules)
        finished = np.flatnonzero(np.asarray(done)[:n])
        if len(finished):
            raise ValueError(f"games {finished.tolist()} are already over: nothing to search")

        think = np.clip(
            np.asarray(denormalize_think_time(root_out.time), np.float64), 0.0, cfg.max_think_time
        )
        budgets = budget_lib.simulation_budgets(cfg, think)
        budgets[n:] = 0
        c_puct = budget_lib.scaled_c_puct(cfg, budgets)
        argmax_rows = np.full(b, cfg.move_rule == "argmax")
        if cfg.move_rule == "rating-based":
            argmax_rows[:] = False
            for i, g in enumerate(games):
                white = len(g.moves) % 2 == 0
                elo = g.white_elo if white else g.black_elo
                if cfg.mode == "greedy":
                    elo = cfg.greedy_elo
                argmax_rows[i] = (elo or 0) >= cfg.rating_based_elo and len(g.moves) > 8
        nodes = tree_size(int(budgets.max()), cfg.max_sims)
        buckets = row_buckets(b, cfg.mode)
        order = np.argsort(-budgets, kind="stable").astype(np.int32)
        params = tree_search.SearchParams(cfg.c_base, cfg.fpu_mode, float(cfg.fpu), cfg.max_path)
        res = _search(
            self.graphdef,
            self.params,
            cache,
            state,
            root_out,
            jnp.asarray(budgets),
            jnp.asarray(c_puct),
            jnp.asarray(argmax_rows),
            _as_key(rng),
            jnp.asarray(order),
            num_nodes=nodes,
            config=cfg,
            tree_params=params,
            row_buckets=buckets,
        )
        res = jax.device_get(res)
        self.stats["simulations"] += int(budgets[:n].sum())
        self.stats["positions"] += n
        move_id = np.asarray(res["move_id"][:n], np.int32)
        return SearchOutput(
            move=[vocab.decode_move(int(m)) for m in move_id],
            move_id=move_id,
            policy=np.asarray(res["policy"][:n], np.float32),
            prior=np.asarray(res["prior"][:n], np.float32),
            visit_counts=np.asarray(res["visits"][:n], np.int32),
            num_sims=budgets[:n].astype(np.int32),
            value_white=np.asarray(root_out.value[:n], np.float32),
            think_time_s=think[:n].astype(np.float32),
            resign=np.asarray(res["resign"][:n], bool),
            search_value=np.asarray(res["search_value"][:n], np.float32),
        )
