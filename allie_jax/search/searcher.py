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
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from allie_jax import aot, chess_jax, vocab
from allie_jax.game import Game, denormalize_think_time, encode_game
from allie_jax.model.kv_cache import KVCache
from allie_jax.search import budget as budget_lib
from allie_jax.search import decision, evaluator, gumbel, pibar, selection, tree_search
from allie_jax.search.config import ADAPTIVE_MODES, SearchConfig

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
    # float32 [B]: the KL weight λ the final policy is optimal for (π̄'s λ_N; Gumbel's
    # (q_max − q_min) / ((c_visit + max N) · c_scale)); NaN where no simulation ran
    effective_lambda: np.ndarray | None = None


_next_pow2 = decision.next_pow2
_bucket = decision.bucket
ENGINE_SHORT_WIDTH = (
    128  # fixed_shapes: games up to ~120 plies use this cache width, longer the model's
)
CHUNK_S = 0.025  # a chunked search checks its clock and ``stop`` about this often


def row_buckets(batch: int, mode: str) -> tuple[int, ...]:
    """Batch sizes the model evaluation is compiled for: (B, B/2, ..., B/16) for ``adaptive``.

    A batch runs max(budget) simulation steps; with rows sorted by budget the games still
    searching at step s are a prefix, and the model runs on the smallest size covering them, so
    a mixed-budget batch computes at most ~2x its real simulations (plus the B/16 floor) instead
    of B · max(budget). Other modes (equal budgets) compile the batch size only, which keeps
    one compiled search per (batch, tree size) whatever the budgets.
    """
    if batch == 1 or mode not in ADAPTIVE_MODES:
        return (batch,)
    return tuple(batch >> i for i in range(5) if batch >> i >= 1)


def tree_size(max_budget: int, max_sims: int) -> int:
    """Node slots for a batch: next power of two of the largest budget (≤ max_sims), plus the root."""
    if max_budget <= 0:
        return 1
    return min(_next_pow2(max_budget), max(max_sims, max_budget)) + 1


# ----------------------------------------------------------------------------- jitted pieces
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


@functools.partial(aot.jit, static_argnames=("rules",))
def _replay(move_ids, lengths, rules):
    state = chess_jax.replay(move_ids, lengths, rules)
    legal = chess_jax.legal_mask(state)
    done, _ = chess_jax.outcome(state, legal)
    return state, legal, done


@functools.partial(aot.jit, static_argnames=("config",))
def _decide_unsearched(
    root_state, legal, root_out, argmax_rows, rng, anchor_logits, *, config: SearchConfig
):
    """Every row at budget 0 (``policy``, ``greedy``, an all-zero adaptive batch): no tree.

    With an anchor, the move is drawn from the tempered anchor instead of the prior.
    """
    value_stm = evaluator.mover_value(root_out.value, chess_jax.white_to_move(root_state))
    res = decision.policy_step(root_out.policy_logits, legal, value_stm, argmax_rows, rng, config)
    if anchor_logits is not None:
        res["policy"] = decision.legal_prior(anchor_logits, legal, config.temperature)
        res["move_id"] = decision.draw_moves(res["policy"], legal, argmax_rows, rng)
    res["visits"] = jnp.zeros(legal.shape, jnp.int32)
    res["search_value"] = value_stm
    res["effective_lambda"] = jnp.full(value_stm.shape, jnp.nan, jnp.float32)
    return res


def _take(x, index, sorted_rows, axis=0):
    return jnp.take(x, index, axis=axis) if sorted_rows else x


def _sorted_cache(cache: KVCache, order, sorted_rows: bool) -> KVCache:
    return KVCache(
        _take(cache.k, order, sorted_rows, 1),
        _take(cache.v, order, sorted_rows, 1),
        _take(cache.length, order, sorted_rows),
    )


def _start(
    model,
    root_state,
    root_out,
    budgets,
    c_puct,
    order,
    num_nodes,
    sorted_rows,
    rng,
    halving_table,
    gumbel_params: gumbel.GumbelParams | None,
):
    """Rows sorted by budget (if ``sorted_rows``), the root evaluated, the tree initialised.

    The root cache is not an input (``root_eval`` needs only its dtype), so this compiles once
    per tree size, whatever the cache width. Gumbel modes (``gumbel_params``) also draw each
    game's noise (in the callers' row order, so it does not depend on the sort) and gather its
    sequential-halving row; both ride in ``tree.extra_data``.
    """
    state_s, out_s, budgets_s, c_puct_s = jax.tree.map(
        lambda x: _take(x, order, sorted_rows), (root_state, root_out, budgets, c_puct)
    )
    root = evaluator.root_eval(model, state_s, out_s, model.init_cache(budgets.shape[0], 1))
    extra = None
    if gumbel_params is not None:
        keys = jax.random.split(jax.random.fold_in(rng, _NOISE_STREAM), budgets.shape[0])
        noise = gumbel.gumbel_noise(
            _take(keys, order, sorted_rows), root.prior_logits.shape[-1], gumbel_params.noise_scale
        )
        extra = gumbel.root_extra_data(root, budgets_s, noise, halving_table, gumbel_params)
    # pUCT trees keep log-priors (one exp per visit instead of a softmax); Gumbel's keep logits
    tree = tree_search.init_tree(root, c_puct_s, num_nodes, extra, log_prior=gumbel_params is None)
    return tree, budgets_s, c_puct_s


_NOISE_STREAM = 0x6B  # the Gumbel noise's key: fold_in(rng, this); the move is drawn with rng


def _finish(
    tree,
    budgets_s,
    c_puct_s,
    order,
    root_out,
    argmax_rows,
    rng,
    anchor_logits,
    config,
    sorted_rows,
):
    """The final policy from the searched tree, back in the callers' row order, and the move.

    ``budgets_s``: the simulations each (sorted) row actually ran; a row with 0 plays from the
    tempered prior (or anchor) as in ``policy``. ``anchor_logits`` (None: the model's prior) is
    the policy the final one is regularised towards: π̄'s KL term, Gumbel's softmax(anchor + σ).
    """
    prior_logits = tree.extra_data.get(selection.RAW_ROOT_LOGITS, tree.children_prior_logits[:, 0])
    legal = selection.legal_from_logits(prior_logits)
    prior = decision.legal_prior(prior_logits, legal)
    anchor = prior_logits
    if anchor_logits is not None:
        anchor = _take(anchor_logits.astype(jnp.float32), order, sorted_rows)
        anchor = selection.mask_logits(anchor, legal)
    tempered = decision.legal_prior(anchor, legal, config.temperature)
    visits = tree.children_visits[:, 0]
    if config.gumbel:
        improved = gumbel.improve(tree, tree.extra_data["gumbel"], gumbel_params(config), anchor)
        searched, lam = improved.policy, improved.effective_lambda
    else:
        anchor_prior = decision.legal_prior(anchor, legal)
        q = jax.vmap(
            lambda t, i: selection.completed_q(t, i, fpu_mode=config.fpu_mode, fpu=config.fpu),
            in_axes=(0, None),
        )(tree, 0)
        lam = pibar.kl_lambda(c_puct_s, visits.sum(-1), legal.sum(-1), sqrt=config.lambda_sqrt)
        if config.final_policy == "pibar":
            searched = pibar.pibar(q, anchor_prior, legal, lam, iterations=config.pibar_iterations)
        else:
            searched = pibar.visit_policy(visits, anchor_prior)
    lam = jnp.where(budgets_s > 0, lam, jnp.nan).astype(jnp.float32)
    policy = jnp.where((budgets_s > 0)[:, None], searched, tempered)
    search_value = tree.node_values[:, 0]
    root_value = tree.raw_values[:, 0]
    # back to the callers' row order before sampling, so a row's move does not depend on how
    # the batch was sorted
    inverse = jnp.argsort(order)
    legal, prior, policy, visits, search_value, root_value, lam = jax.tree.map(
        lambda x: _take(x, inverse, sorted_rows),
        (legal, prior, policy, visits, search_value, root_value, lam),
    )
    return {
        "move_id": decision.draw_moves(policy, legal, argmax_rows, rng),
        "policy": policy,
        "prior": prior,
        "visits": visits.astype(jnp.int32),
        "resign": decision.resign_flags(root_out.policy_logits, legal, root_value, config),
        "search_value": search_value,
        "effective_lambda": lam,
    }


def gumbel_params(config: SearchConfig) -> gumbel.GumbelParams | None:
    """The Gumbel knobs of a ``gumbel*`` config (static, hashable), None for other modes."""
    if not config.gumbel:
        return None
    return gumbel.GumbelParams(
        c_visit=float(config.gumbel_c_visit),
        c_scale=float(config.gumbel_c_scale),
        max_considered=int(config.gumbel_considered),
        noise_scale=float(config.gumbel_noise),
    )


def _select_fn(params: gumbel.GumbelParams | None):
    return None if params is None else gumbel.make_gumbel_selection(params)


_STATIC = ("graphdef", "num_nodes", "config", "tree_params", "row_buckets")


@functools.partial(aot.jit, static_argnames=_STATIC)
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
    anchor_logits,
    halving_table,
    *,
    num_nodes: int,
    config: SearchConfig,
    tree_params: tree_search.SearchParams,
    row_buckets: tuple[int, ...],
):
    """The whole search of a batch in one call: ``_start``, every simulation, ``_finish``."""
    model = nnx.merge(graphdef, params)
    sorted_rows = len(row_buckets) > 1  # rows by budget, descending: the active rows are a prefix
    gp = gumbel_params(config)
    tree, budgets_s, c_puct_s = _start(
        model,
        root_state,
        root_out,
        budgets,
        c_puct,
        order,
        num_nodes,
        sorted_rows,
        rng,
        halving_table,
        gp,
    )
    expand = evaluator.make_model_expand(
        model, _sorted_cache(cache, order, sorted_rows), row_buckets
    )
    stop = jnp.max(jnp.minimum(budgets_s, num_nodes - 1))
    tree = tree_search.run_simulations(
        tree,
        expand,
        budgets_s,
        0,
        stop,
        num_nodes=num_nodes,
        params=tree_params,
        select_fn=_select_fn(gp),
    )
    return _finish(
        tree,
        budgets_s,
        c_puct_s,
        order,
        root_out,
        argmax_rows,
        rng,
        anchor_logits,
        config,
        sorted_rows,
    )


# The same search in pieces, for a caller with a clock: start, chunks of simulations, finish.
@functools.partial(
    aot.jit, static_argnames=("graphdef", "num_nodes", "sorted_rows", "gumbel_params")
)
def _search_start(
    graphdef,
    params,
    root_state,
    root_out,
    budgets,
    c_puct,
    order,
    rng,
    halving_table,
    *,
    num_nodes,
    sorted_rows,
    gumbel_params,
):
    model = nnx.merge(graphdef, params)
    return _start(
        model,
        root_state,
        root_out,
        budgets,
        c_puct,
        order,
        num_nodes,
        sorted_rows,
        rng,
        halving_table,
        gumbel_params,
    )


@functools.partial(
    aot.jit,
    static_argnames=("graphdef", "num_nodes", "tree_params", "row_buckets", "gumbel_params"),
    donate_argnames=("tree",),
)
def _search_chunk(
    graphdef,
    params,
    cache,
    order,
    tree,
    budgets_s,
    start,
    stop,
    *,
    num_nodes: int,
    tree_params: tree_search.SearchParams,
    row_buckets: tuple[int, ...],
    gumbel_params: gumbel.GumbelParams | None = None,
):
    model = nnx.merge(graphdef, params)
    cache_s = _sorted_cache(cache, order, len(row_buckets) > 1)
    expand = evaluator.make_model_expand(model, cache_s, row_buckets)
    return tree_search.run_simulations(
        tree,
        expand,
        budgets_s,
        start,
        stop,
        num_nodes=num_nodes,
        params=tree_params,
        select_fn=_select_fn(gumbel_params),
    )


@functools.partial(aot.jit, static_argnames=("config", "sorted_rows"))
def _search_finish(
    tree,
    budgets_s,
    c_puct_s,
    order,
    root_out,
    argmax_rows,
    rng,
    anchor_logits,
    *,
    config: SearchConfig,
    sorted_rows: bool,
):
    return _finish(
        tree,
        budgets_s,
        c_puct_s,
        order,
        root_out,
        argmax_rows,
        rng,
        anchor_logits,
        config,
        sorted_rows,
    )


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

    ``fixed_shapes`` (the UCI engine's setting) trades a little work for a closed set of shapes,
    so ``warmup`` can compile all of them before the first move: the tree always has
    ``max_sims + 1`` slots (instead of the next power of two of the batch's largest budget) and
    a prefill runs 8 new tokens or the whole cache width. Without it (matches, benchmarks) the
    shapes follow the batch more tightly.
    """

    def __init__(
        self,
        model: Any,
        config: SearchConfig | None = None,
        *,
        cache_games: int = 1024,
        fixed_shapes: bool = False,
    ):
        self.model = model
        self.config = config or SearchConfig()
        self.graphdef, self.params = nnx.split(model)
        self.cache_games = cache_games
        self.fixed_shapes = fixed_shapes
        self._rows: collections.OrderedDict[Any, _CachedRow] = collections.OrderedDict()
        self.stats = collections.Counter()  # prefill_tokens, simulations, ...

    def forget(self) -> None:
        self._rows.clear()

    # -- helpers -----------------------------------------------------------------------------
    def _tokens(self, game: Game) -> np.ndarray:
        return encode_game(decision.conditioned_game(self.config, game), partial=True).tokens

    @staticmethod
    def _key(game: Game) -> Any:
        return game.game_id or id(game)

    def _widths(self) -> tuple[int, ...]:
        """Cache / replay widths: the fine buckets, or two for ``fixed_shapes`` (each width
        compiles the whole search again; a wider cache costs a little attention per simulation)."""
        max_len = self.model.config.max_len
        if self.fixed_shapes:
            return tuple(sorted({min(ENGINE_SHORT_WIDTH, max_len), max_len}))
        return LENGTH_BUCKETS

    def _prefill_width(self, num_new: int, width: int) -> int:
        if self.fixed_shapes:
            return PREFILL_BUCKETS[0] if num_new <= PREFILL_BUCKETS[0] else width
        return _bucket(num_new, PREFILL_BUCKETS)

    def _tree_size(self, max_budget: int) -> int:
        if self.fixed_shapes:
            return 1 if max_budget <= 0 else self.config.max_sims + 1
        return tree_size(max_budget, self.config.max_sims)

    def _prefill(self, keys, token_rows):
        cfg = self.model.config
        b = len(token_rows)
        lengths = np.array([len(t) for t in token_rows])
        width = _bucket(int(lengths.max()), self._widths())
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
        # committed to one device whichever branch built it: jit's cache tells committed and
        # uncommitted inputs apart, and warm-up must compile what a move will run
        device = jax.devices()[0]
        cache = KVCache(
            jax.device_put(cache.k, device),
            jax.device_put(cache.v, device),
            jax.device_put(jnp.asarray(usable, jnp.int32), device),
        )
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

    def _replay(self, move_lists: Sequence[np.ndarray]):
        b = len(move_lists)
        width = _bucket(max(1, max(len(m) for m in move_lists)), self._widths())
        move_ids = np.zeros((b, width), np.int32)
        for i, m in enumerate(move_lists):
            move_ids[i, : len(m)] = m
        lengths = np.array([len(m) for m in move_lists], np.int32)
        return _replay(jnp.asarray(move_ids), jnp.asarray(lengths), self.config.rules)

    # -- the API -----------------------------------------------------------------------------
    def run(
        self,
        games: Sequence[Game],
        rng: Any,
        *,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        budgets: np.ndarray | Sequence[int] | None = None,
        anchor_logits: np.ndarray | None = None,
        progress: Callable[[int, list[str]], None] | None = None,
    ) -> SearchOutput:
        """Choose a move for every game (each must have a legal move: no finished games).

        ``deadline`` (a ``time.monotonic()`` instant) and ``should_stop`` (polled between
        chunks) make the search run in chunks of simulations and stop early with the tree it
        has; ``num_sims`` then reports the simulations each game actually got. ``budgets``
        replaces the preset's budget rule (UCI ``go nodes``), clipped to ``[0, max_sims]``.
        ``progress(simulations, moves)`` is called after every chunk with each game's most
        visited root move so far (a caller that must answer at once has a searched move).

        ``anchor_logits`` (float [len(games), 1968], logits or log-probabilities, −inf allowed;
        illegal moves are masked here) replaces the model's prior as the policy the final one
        is regularised towards: π̄'s KL term, Gumbel's softmax(anchor + σ(q)), and the budget-0
        rows (e.g. a human model such as Maia, for piKL-style play). The tree itself keeps the
        model's prior and values.
        """
        if len(games) == 0:
            raise ValueError("games is empty")
        cfg = self.config
        n = len(games)
        b = _next_pow2(n)
        anchor = _anchor_rows(anchor_logits, n, b)
        token_rows = [self._tokens(g) for g in games]
        heads = [len(t) - len(g.moves) for t, g in zip(token_rows, games, strict=True)]
        keys: list[Any] = [self._key(g) for g in games]
        pad = b - n
        token_rows += [token_rows[0]] * pad
        keys += [None] * pad
        root_out, cache = self._prefill(keys, token_rows)

        move_lists = [t[h:] for t, h in zip(token_rows, heads + [heads[0]] * pad, strict=True)]
        state, legal, done = self._replay(move_lists)
        finished = np.flatnonzero(np.asarray(done)[:n])
        if len(finished):
            raise ValueError(f"games {finished.tolist()} are already over: nothing to search")

        root_time = np.asarray(root_out.time, np.float64)
        think = np.clip(denormalize_think_time(root_time), 0.0, cfg.max_think_time)
        if budgets is None:
            sims = budget_lib.simulation_budgets(cfg, think)
        else:
            sims = np.zeros(b, np.int32)
            sims[:n] = np.clip(np.asarray(budgets, np.int64)[:n], 0, cfg.max_sims)
        sims[n:] = 0
        argmax_rows = decision.argmax_rows(cfg, games, b)
        res, ran = self._decide(
            cache,
            state,
            legal,
            root_out,
            sims,
            argmax_rows,
            decision.as_jax_key(rng),
            deadline=deadline,
            should_stop=should_stop,
            anchor=anchor,
            progress=progress,
        )
        self.stats["simulations"] += int(ran[:n].sum())
        self.stats["positions"] += n
        move_id = np.asarray(res["move_id"][:n], np.int32)
        return SearchOutput(
            move=[vocab.decode_move(int(m)) for m in move_id],
            move_id=move_id,
            policy=np.asarray(res["policy"][:n], np.float32),
            prior=np.asarray(res["prior"][:n], np.float32),
            visit_counts=np.asarray(res["visits"][:n], np.int32),
            num_sims=ran[:n].astype(np.int32),
            value_white=np.asarray(root_out.value[:n], np.float32),
            think_time_s=think[:n].astype(np.float32),
            resign=np.asarray(res["resign"][:n], bool),
            search_value=np.asarray(res["search_value"][:n], np.float32),
            effective_lambda=np.asarray(res["effective_lambda"][:n], np.float32),
        )

    def _decide(
        self,
        cache: KVCache,
        state,
        legal,
        root_out,
        budgets: np.ndarray,
        argmax_rows: np.ndarray,
        key: jax.Array,
        *,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        anchor: jax.Array | None = None,
        progress: Callable[[int, list[str]], None] | None = None,
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The move of every row from its root: budget 0 → the policy, else the search.

        Returns the results (numpy) and the simulations each row ran.
        """
        cfg = self.config
        b = len(budgets)
        nodes = self._tree_size(int(budgets.max()))
        if nodes == 1:
            res = _decide_unsearched(
                state, legal, root_out, jnp.asarray(argmax_rows), key, anchor, config=cfg
            )
            return jax.device_get(res), np.zeros(b, np.int32)
        budgets = np.minimum(budgets, nodes - 1).astype(np.int32)
        c_puct = budget_lib.scaled_c_puct(cfg, budgets)
        buckets = row_buckets(b, cfg.mode)
        order = np.argsort(-budgets, kind="stable").astype(np.int32)
        params = tree_search.SearchParams(cfg.c_base, cfg.fpu_mode, float(cfg.fpu), cfg.max_path)
        gp = gumbel_params(cfg)
        table = _halving_table(cfg) if gp is not None else None
        if deadline is None and should_stop is None:
            res = _search(
                self.graphdef,
                self.params,
                cache,
                state,
                root_out,
                jnp.asarray(budgets),
                jnp.asarray(c_puct),
                jnp.asarray(argmax_rows),
                key,
                jnp.asarray(order),
                anchor,
                table,
                num_nodes=nodes,
                config=cfg,
                tree_params=params,
                row_buckets=buckets,
            )
            return jax.device_get(res), budgets
        sorted_rows = len(buckets) > 1
        tree, budgets_s, c_puct_s = _search_start(
            self.graphdef,
            self.params,
            state,
            root_out,
            jnp.asarray(budgets),
            jnp.asarray(c_puct),
            jnp.asarray(order),
            key,
            table,
            num_nodes=nodes,
            sorted_rows=sorted_rows,
            gumbel_params=gp,
        )
        tree_ref = [tree]
        ran = self._run_chunks(
            cache,
            jnp.asarray(order),
            tree_ref,
            budgets_s,
            int(budgets.max()),
            nodes,
            params,
            buckets,
            deadline,
            should_stop,
            progress,
        )
        ran_s = jnp.minimum(budgets_s, ran)
        res = _search_finish(
            tree_ref[0],
            ran_s,
            c_puct_s,
            jnp.asarray(order),
            root_out,
            jnp.asarray(argmax_rows),
            key,
            anchor,
            config=cfg,
            sorted_rows=sorted_rows,
        )
        return jax.device_get(res), np.minimum(budgets, ran).astype(np.int32)

    def _run_chunks(
        self,
        cache,
        order,
        tree_ref,
        budgets_s,
        total,
        nodes,
        params,
        buckets,
        deadline,
        should_stop,
        progress=None,
    ) -> int:
        """Run simulations 0..total − 1 in chunks of about ``CHUNK_S`` seconds, stopping early
        when ``should_stop()`` says so or the next chunk would end past ``deadline``.

        ``tree_ref[0]`` holds the tree (each chunk consumes its input); returns how many
        simulation steps ran.
        """
        done, chunk = 0, 1
        while done < total:
            now = time.monotonic()
            if should_stop is not None and should_stop():
                break
            if deadline is not None and now >= deadline:
                break
            n = min(chunk, total - done)
            t0 = time.monotonic()
            tree = _search_chunk(
                self.graphdef,
                self.params,
                cache,
                order,
                tree_ref[0],
                budgets_s,
                jnp.int32(done),
                jnp.int32(done + n),
                num_nodes=nodes,
                tree_params=params,
                row_buckets=buckets,
                gumbel_params=gumbel_params(self.config),
            )
            tree_ref[0] = jax.block_until_ready(tree)
            done += n
            if progress is not None:  # each row's most visited root move, in the callers' order
                visits = np.asarray(tree.children_visits[:, 0])
                best = np.empty(len(visits), np.int64)
                best[np.asarray(order)] = visits.argmax(-1)
                progress(done, [vocab.decode_move(int(m)) for m in best])
            rate = n / max(time.monotonic() - t0, 1e-4)  # simulation steps per second
            chunk = max(1, int(rate * CHUNK_S))
            if deadline is not None:
                left = deadline - time.monotonic()
                chunk = min(chunk, int(rate * left * 0.8))
                if chunk < 1:
                    break
        return done

    # -- compiling before the first move -------------------------------------------------------
    def warmup(self, batch_size: int = 1, *, chunked: bool = True) -> int:
        """Compile every shape a batch of ``batch_size`` games can meet; returns calls made.

        Meant for ``fixed_shapes`` (the set is then closed): for each cache width up to the
        model's context, the prefill (8 new tokens and a cold full width), the replay, the
        budget-0 decision, and, for searching presets, the search (chunked pieces when
        ``chunked``, else the one-call ``_search``). Runs on synthetic inputs; nothing is cached
        for any game afterwards.
        """
        cfg = self.config
        b = _next_pow2(batch_size)
        widths = [w for w in self._widths() if w <= self.model.config.max_len]
        before = self.stats.copy()
        key = decision.as_jax_key(0)
        argmax = np.zeros(b, bool)
        calls = 0
        searching = budget_lib.simulation_budgets(cfg, np.full(1, cfg.max_think_time))[0] > 0
        for w in widths:
            rows = [np.zeros(w, np.int32)] * b
            keys = [("__warmup__", i) for i in range(b)]
            self._prefill(keys, rows)  # cold: the whole width
            root_out, cache = self._prefill(keys, rows)  # warm: ≤ 8 new tokens
            if w < widths[-1]:  # a game growing into the next width copies its cached row
                self._prefill([("__warmup__", -1)], [np.zeros(w, np.int32)])
                self._prefill([("__warmup__", -1)], [np.zeros(w + 1, np.int32)])
            zeros = jnp.zeros((b, w), jnp.int32)  # every row at the start: a legal position
            state, legal, _ = _replay(zeros, jnp.zeros((b,), jnp.int32), cfg.rules)
            calls += 3
            if w == widths[0]:
                self._decide(cache, state, legal, root_out, np.zeros(b, np.int32), argmax, key)
                calls += 1
            if searching:
                sims = np.ones(b, np.int32)
                stop = (lambda: False) if chunked else None
                self._decide(cache, state, legal, root_out, sims, argmax, key, should_stop=stop)
                calls += 1
        for k in [k for k in self._rows if isinstance(k, tuple) and k[:1] == ("__warmup__",)]:
            del self._rows[k]
        self.stats = before
        return calls


def _anchor_rows(anchor_logits: Any, n: int, b: int) -> jax.Array | None:
    """The caller's anchor as float32 [b, 1968] (padding rows uniform), checked."""
    if anchor_logits is None:
        return None
    anchor = np.asarray(anchor_logits, np.float32)
    if anchor.ndim != 2 or anchor.shape[0] != n or anchor.shape[1] < vocab.NUM_MOVES:
        raise ValueError(
            f"anchor_logits has shape {anchor.shape}: expected ({n}, {vocab.NUM_MOVES}), "
            "one row of move logits per game"
        )
    anchor = anchor[:, : vocab.NUM_MOVES]
    if np.isnan(anchor).any() or np.isposinf(anchor).any():
        raise ValueError("anchor_logits holds NaN or +inf: expected finite logits (or -inf)")
    anchor = np.where(np.isneginf(anchor), selection.ILLEGAL_LOGIT, anchor)
    return jnp.asarray(np.concatenate([anchor, np.zeros((b - n, anchor.shape[1]), np.float32)]))


@functools.lru_cache(maxsize=4)
def _halving_table_for(max_considered: int, max_sims: int) -> jax.Array:
    return jnp.asarray(gumbel.considered_visits_table(max_considered, max_sims))


def _halving_table(config: SearchConfig) -> jax.Array:
    """Sequential halving's rows for every budget up to ``max_sims`` (built once per shape)."""
    return _halving_table_for(config.gumbel_considered, config.max_sims)
