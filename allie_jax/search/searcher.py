"""``Searcher``: a ``SearchConfig`` preset for a batch of games, for every model family.

A move is: the family's roots (``leaves.Roots``: move lists, then the root outputs and the
leaves' context, e.g. the decoder's KV-cached prefill in search/prefill.py), the games replayed
inside jit (chess_jax), each game's budget from the time head (or the preset), then one jitted
search (search/steps.py: ``tree_search`` with the family's leaf evaluation, the final policy, the
move and the resignation flag, search/finish.py).

Batches are padded to powers of two and the tree size to a power of two of the largest budget
(``fixed_shapes``: ``max_sims + 1`` always), so a long match compiles each function only a
handful of times; ``warmup`` compiles them all before the first move.

Mixed budgets (``adaptive``): the batch runs max(budget) simulation steps. Inside the search the
rows are sorted by budget (descending; results come back in the callers' order, and each row's
move is drawn after un-sorting, so it does not depend on the sort), so the games still searching
at a step are a prefix and the model runs on the smallest of (B, B/2, ..., B/16) rows covering
them (``row_buckets``). A batch of 32 games with budgets 41..132 thus costs about its real
simulations instead of 32 × 132.

With a clock (``deadline`` / ``should_stop``) the search runs in chunks of about ``CHUNK_S``
seconds and stops early with the tree it has.
"""

from __future__ import annotations

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
from allie_jax.game import Game, denormalize_think_time
from allie_jax.search import budget as budget_lib
from allie_jax.search import decision, steps, tree_search
from allie_jax.search.config import ADAPTIVE_MODES, SearchConfig
from allie_jax.search.finish import anchor_rows, gumbel_params, halving_table, kl_params
from allie_jax.search.prefill import (
    ENGINE_SHORT_WIDTH,
    LENGTH_BUCKETS,
    PREFILL_BUCKETS,
    DecoderRoots,
)

__all__ = [
    "CHUNK_S",
    "ENGINE_SHORT_WIDTH",
    "LENGTH_BUCKETS",
    "PREFILL_BUCKETS",
    "SearchOutput",
    "Searcher",
    "gumbel_params",
    "row_buckets",
    "tree_size",
]


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


@functools.partial(aot.jit, static_argnames=("rules",))
def _replay(move_ids, lengths, rules):
    state = chess_jax.replay(move_ids, lengths, rules)
    legal = chess_jax.legal_mask(state)
    done, _ = chess_jax.outcome(state, legal)
    return state, legal, done


class Searcher:
    """Runs a ``SearchConfig`` preset on batches of games with one model of any family.

    ``roots`` (``leaves.Roots``) is the family's side: None builds the decoder's
    (``prefill.DecoderRoots``, with ``cache_games`` games' KV rows kept between calls);
    ``engine/board.py`` and ``baselines/maia_search.py`` pass theirs.

    ``fixed_shapes`` (the UCI engine's setting) trades a little work for a closed set of shapes,
    so ``warmup`` can compile all of them before the first move: the tree always has
    ``max_sims + 1`` slots (instead of the next power of two of the batch's largest budget) and
    the decoder's prefill runs 8 new tokens or the whole cache width. Without it (matches,
    benchmarks) the shapes follow the batch more tightly.
    """

    def __init__(
        self,
        model: Any,
        config: SearchConfig | None = None,
        *,
        cache_games: int = 1024,
        fixed_shapes: bool = False,
        roots: Any = None,
    ):
        self.model = model
        self.config = config or SearchConfig()
        self.fixed_shapes = fixed_shapes
        if roots is None:
            roots = DecoderRoots(
                model, self.config, cache_games=cache_games, fixed_shapes=fixed_shapes
            )
        self.roots = roots
        self.graphdef, self.params = nnx.split(model)

    @property
    def stats(self):
        """``prefill_tokens`` (the decoder), ``simulations``, ``positions``: a Counter."""
        return self.roots.stats

    @stats.setter
    def stats(self, value) -> None:
        self.roots.stats = value

    def forget(self) -> None:
        self.roots.forget()

    def _tree_size(self, max_budget: int) -> int:
        if self.fixed_shapes:
            return 1 if max_budget <= 0 else self.config.max_sims + 1
        return tree_size(max_budget, self.config.max_sims)

    def replay(self, move_lists: Sequence[np.ndarray]):
        """The games' move-id lists replayed inside jit: (states, legal masks, game over), padded
        to a width this family's roots compile for (``Roots.replay_widths``)."""
        b = len(move_lists)
        width = _bucket(max(1, max(len(m) for m in move_lists)), self.roots.replay_widths())
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
        rows (e.g. a human model such as Maia, for piKL-style play), and, with
        ``selection="kl"``, the root's KL selection. The tree itself keeps the model's prior
        (every other node's selection) and values.
        """
        if len(games) == 0:
            raise ValueError("games is empty")
        cfg = self.config
        n = len(games)
        b = _next_pow2(n)
        if budgets is not None and len(budgets) != n:
            raise ValueError(f"budgets has {len(budgets)} entries for {n} games")
        anchor = anchor_rows(anchor_logits, n, b)
        move_lists, prepared = self.roots.prepare(games, b)
        state, legal, done = self.replay(move_lists)
        if getattr(self.roots, "claimable_roots", False):  # only a root without a move is over
            done = ~legal.any(-1)
        finished = np.flatnonzero(np.asarray(done)[:n])
        if len(finished):
            raise ValueError(f"games {finished.tolist()} are already over: nothing to search")
        root_out, context = self.roots.evaluate(prepared, state, legal)

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
            context,
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
        context: Any,
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
        roots = steps.RootBatch(state, legal, root_out, context)
        move = steps.MoveInputs(jnp.asarray(argmax_rows), key, anchor)
        nodes = self._tree_size(int(budgets.max()))
        if nodes == 1:
            res = steps.decide_unsearched(roots, move, config=cfg)
            return jax.device_get(res), np.zeros(b, np.int32)
        budgets = np.minimum(budgets, nodes - 1).astype(np.int32)
        spec = self._tree_spec(b, nodes)
        plan = steps.RowPlan(
            budgets=jnp.asarray(budgets),
            c_puct=jnp.asarray(budget_lib.scaled_c_puct(cfg, budgets)),
            order=jnp.asarray(np.argsort(-budgets, kind="stable").astype(np.int32)),
            halving_table=halving_table(cfg) if spec.gumbel is not None else None,
        )
        if deadline is None and should_stop is None:
            res = steps.search(self.graphdef, self.params, roots, plan, move, spec=spec, config=cfg)
            return jax.device_get(res), budgets
        tree, rows = steps.search_start(self.graphdef, self.params, roots, plan, move, spec=spec)
        tree, ran = self._run_chunks(
            context, tree, rows, int(budgets.max()), spec, deadline, should_stop, progress
        )
        rows = rows._replace(budgets=jnp.minimum(rows.budgets, ran))
        res = steps.search_finish(
            tree, rows, root_out, move, config=cfg, sorted_rows=spec.sorted_rows
        )
        return jax.device_get(res), np.minimum(budgets, ran).astype(np.int32)

    def _tree_spec(self, batch: int, nodes: int) -> steps.TreeSpec:
        """The static side of a batch's search: leaves, tree size, knobs, buckets, selection."""
        cfg = self.config
        return steps.TreeSpec(
            leaves=self.roots.leaves,
            num_nodes=nodes,
            tree_params=tree_search.SearchParams(
                cfg.c_base,
                cfg.fpu_mode,
                float(cfg.fpu),
                cfg.max_path,
                cfg.leaf_batch,
                cfg.virtual_loss,
            ),
            # B·K leaf rows per step
            row_buckets=tuple(x * cfg.leaf_batch for x in row_buckets(batch, cfg.mode)),
            gumbel=gumbel_params(cfg),
            kl=kl_params(cfg),
        )

    def _run_chunks(
        self,
        context: Any,
        tree: Any,
        rows: steps.SortedRows,
        total: int,
        spec: steps.TreeSpec,
        deadline: float | None,
        should_stop: Callable[[], bool] | None,
        progress: Callable[[int, list[str]], None] | None = None,
    ) -> tuple[Any, int]:
        """Run simulations 0..total − 1 in chunks of about ``CHUNK_S`` seconds, stopping early
        when ``should_stop()`` says so or the next chunk would end past ``deadline``.

        Each chunk consumes (donates) the tree it is given; returns the last tree and how many
        simulation steps ran.
        """
        k = spec.tree_params.leaf_batch  # chunks end on whole steps of K leaves
        done, chunk = 0, k
        while done < total:
            now = time.monotonic()
            if should_stop is not None and should_stop():
                break
            if deadline is not None and now >= deadline:
                break
            n = min(chunk, total - done)
            t0 = time.monotonic()
            tree = steps.search_chunk(
                self.graphdef,
                self.params,
                context,
                tree,
                rows,
                jnp.int32(done),
                jnp.int32(done + n),
                spec=spec,
            )
            tree = jax.block_until_ready(tree)
            done += n
            if progress is not None:  # each row's most visited root move, in the callers' order
                visits = np.asarray(tree.children_visits[:, 0])
                best = np.empty(len(visits), np.int64)
                best[np.asarray(rows.order)] = visits.argmax(-1)
                progress(done, [vocab.decode_move(int(m)) for m in best])
            rate = n / max(time.monotonic() - t0, 1e-4)  # simulation steps per second
            chunk = max(k, int(rate * CHUNK_S) // k * k)
            if deadline is not None:
                left = deadline - time.monotonic()
                chunk = min(chunk, int(rate * left * 0.8) // k * k)
                if chunk < 1:
                    break
        return tree, done

    # -- compiling before the first move -------------------------------------------------------
    def warmup(self, batch_size: int = 1, *, chunked: bool = True) -> int:
        """Compile every shape a batch of ``batch_size`` games can meet; returns calls made.

        Meant for ``fixed_shapes`` (the set is then closed): for each root shape the family's
        roots meet (``Roots.warm``: the decoder's cache widths and prefills), the replay, the
        budget-0 decision, and, for searching presets, the search (chunked pieces when
        ``chunked``, else the one-call ``steps.search``). Runs on synthetic inputs; nothing is
        kept for any game afterwards.
        """
        cfg = self.config
        b = _next_pow2(batch_size)
        key = decision.as_jax_key(0)
        argmax = np.zeros(b, bool)
        calls = 0
        searching = budget_lib.simulation_budgets(cfg, np.full(1, cfg.max_think_time))[0] > 0

        def replay(width: int):
            zeros = jnp.zeros((b, width), jnp.int32)  # every row at the start: a legal position
            state, legal, _ = _replay(zeros, jnp.zeros((b,), jnp.int32), cfg.rules)
            return state, legal

        first = True
        for _, state, legal, root_out, context in self.roots.warm(b, replay):
            calls += 3
            if first:
                self._decide(context, state, legal, root_out, np.zeros(b, np.int32), argmax, key)
                calls += 1
                first = False
            if searching:
                sims = np.ones(b, np.int32)
                stop = (lambda: False) if chunked else None
                self._decide(context, state, legal, root_out, sims, argmax, key, should_stop=stop)
                calls += 1
        return calls
