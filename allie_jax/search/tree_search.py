"""Batched MCTS with a different number of simulations per game in one jitted loop.

The loop is mctx's ``search`` (simulate → expand → backward on an ``mctx.Tree``) with three
changes, each a no-op for a game where it does not apply, so a game with budget b ends with
exactly the tree stock ``mctx.search(num_simulations=b)`` builds (tested):

1. Per-game budgets: the loop runs max(budget) simulations; simulation ``sim`` writes nothing for
   a game whose budget is ≤ sim (its writes go to an out-of-range index with ``mode="drop"`` and
   its backup is empty). No tree copy per step. The expand function is told how many leading
   rows are still active (``num_active``), so it may skip the model for the idle tail.
2. Terminal nodes are not expanded: a simulation that reaches one (``frozen``) backs its exact
   value up again instead of evaluating a child, like the released Python MCTS did.
3. Depth cap P (``max_path``): a node at depth P is frozen like a terminal one: revisits back up
   its value, so every evaluation sees its full path (≤ P − 1 path tokens + the new one) and
   the per-node key/value buffers stay a fixed [P] slice. With ≤ 200 simulations a path of 32
   plies is essentially never reached.

Node values follow mctx's two-player convention: ``node_values`` from the view of the player
to move at the node, every edge with reward 0 and discount −1, so Q(s, a) = −V(child) (the
tree stores that reward and discount once per node, shape [B, N, 1], see ``init_tree``).
New nodes are numbered by simulation (node ``sim + 1``), so a revisit leaves its slot unused.

The expand function receives the parent's payload store and the node indices of the parent's
path from the root (depth 1 .. depth(parent)), so a model evaluator can gather the keys/values
of the path and run ONE new token per simulation. The same path gives the backup (``backup``):
mctx's ``backward`` arithmetic as one scatter per statistic instead of a loop over depth.

Several leaves per step (``leaf_batch`` K > 1): one game's leaf evaluation at batch 1 reads every
weight of the model for one token, so a step selects K leaves of each game and evaluates them in
ONE call of the expand function (B·K rows, row r belonging to game r // K: the rows of a game are
adjacent; the payload store stays [B, N, ...]), then backs them up one after the other.
Simulation ``sim`` is leaf ``sim % K`` of step ``sim // K`` and still creates node ``sim + 1``,
so the tree needs the same ``budget + 1`` slots. The rules:

- Pending leaves (``virtual_loss``, one of ``VIRTUAL_LOSSES``): the K selections of a step run
  one after another on a copy of the statistics carrying the earlier leaves of the step, so
  later ones see them; the copy is dropped before the real backups. Node values (the FPU
  reduction's V(parent)) are never touched. Two rules for what a pending leaf changes ("visit"
  is the default: its K-leaf trees choose the one-leaf search's moves more often, because the
  virtual loss also lowers Q and so spreads a step's leaves over branches a one-leaf search
  would not visit yet):

  * ``"loss"`` (AlphaGo Zero's virtual loss, early lc0): every edge on its path, the unexpanded
    edge itself included, counts one more visit that LOST for the player choosing it,
    Q(s, a) ← (Q·N(s, a) − 1) / (N(s, a) + 1), and every node it chose at counts one more
    visit N(s). Both Q and the exploration term push later selections elsewhere.
  * ``"visit"`` (lc0's in-flight visits, "virtual visits": lc0's ``Node::n_in_flight_``, read
    through ``GetNStarted() = N + N_in_flight``; its selection scores an edge
    Q + c·sqrt(N(s))·P(s, a) / (1 + N(s, a) + N_in_flight(s, a)) with Q the real mean, or the
    FPU value while N(s, a) = 0, so a pending visit changes only the exploration term; lc0's
    sqrt reads the parent's real visits, here N(s) counts the pending ones as the "loss" rule
    does, so the two rules differ only in Q): every edge on the path and
    the unexpanded edge count one more visit in N(s, a), every choosing node one more in N(s),
    and Q is left alone: a visited edge keeps its mean value, and an edge without a real visit
    keeps the first-play value the selection gave it (the FPU value: V(parent) − fpu, or
    ``fpu``; the mixed value for the KL and Gumbel selections), pinned in the copy when its first
    pending visit arrives because the copy then counts it as visited. So
    score = Q(s, a) + (log((N(s) + n(s) + c_base + 1) / c_base) + c) · sqrt(N(s) + n(s))
    · P(s, a) / (1 + N(s, a) + n(s, a)), n the step's pending visits: only U spreads the leaves,
    and a pending branch whose value is good is not made to look lost.

- Collisions: a selection that ends on the same unexpanded edge as an earlier one of the same
  step does not create a second node: it counts as a second visit of the node the first one
  created and backs that node's value up again (as a revisit of a terminal node does), so every
  game still gets exactly ``budget`` visits at the root. Its model row is evaluated and dropped.
- Frozen (terminal or depth-capped) nodes are revisited as with K = 1.

With K = 1 the step is the one-leaf step above, unchanged (the parity tests cover it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx

from allie_jax import compat
from allie_jax.search.config import VIRTUAL_LOSSES
from allie_jax.search.selection import RAW_ROOT_LOGITS, completed_q, make_puct_selection
from allie_jax.search.selection import log_prior as selection_log_prior

Tree = mctx.Tree


class NodeEval(NamedTuple):
    """A batch of evaluated nodes: masked prior logits [B, A], value [B] (mover's view),
    terminal [B] (exact value, never expanded) and a payload pytree [B, ...] kept per node."""

    prior_logits: chex.Array
    value: chex.Array
    terminal: chex.Array
    payload: Any


# expand_fn(payloads [B, N, ...], parent [R], path_nodes [R, P], path_len [R], action [R],
#           num_active []): rows >= num_active are idle this step (whatever they return is dropped).
# R = B, or B·K with ``leaf_batch`` K: row r then belongs to game r // K (payloads stay [B, ...])
ExpandFn = Callable[[Any, chex.Array, chex.Array, chex.Array, chex.Array, chex.Array], NodeEval]


# select_fn(rng_key, tree, node_index, depth) -> action, on one game's (unbatched) tree
SelectFn = Callable[[Any, Tree, chex.Array, chex.Array], chex.Array]


class SearchParams(NamedTuple):
    c_base: float
    fpu_mode: str
    fpu: float
    max_path: int
    leaf_batch: int = 1  # K: leaves per game per step (the module docstring)
    virtual_loss: str = "visit"  # K > 1: one of VIRTUAL_LOSSES (the module docstring)


def init_tree(
    root: NodeEval,
    c_puct: chex.Array,
    num_nodes: int,
    extra_data: dict | None = None,
    *,
    log_prior: bool = False,
) -> Tree:
    """A tree with ``num_nodes`` slots and its root filled in (root visit count 1, as mctx).

    ``extra_data`` ([B, ...] arrays) joins ``c_puct`` in ``tree.extra_data`` for the selector.
    ``log_prior``: every node's ``children_prior_logits`` are stored as log-priors
    (``selection.log_prior``: the same softmax up to rounding, so pUCT reads a prior as one
    ``exp``); the root's logits as given are kept in ``extra_data[selection.RAW_ROOT_LOGITS]``,
    whose presence tells the selection and ``run_simulations`` which kind of tree this is.
    """
    batch = root.value.shape[0]
    prior_logits = root.prior_logits
    extra = {"c_puct": jnp.asarray(c_puct, jnp.float32), **(extra_data or {})}
    if log_prior:
        extra[RAW_ROOT_LOGITS] = prior_logits
        prior_logits = selection_log_prior(prior_logits)
    embeddings = {
        "payload": root.payload,
        "depth": jnp.zeros((batch,), jnp.int32),
        "frozen": jnp.asarray(root.terminal, bool),
    }
    tree = compat.mctx_search_module().instantiate_tree_from_root(
        mctx.RootFnOutput(prior_logits=prior_logits, value=root.value, embedding=embeddings),
        num_nodes - 1,
        root_invalid_actions=jnp.zeros_like(prior_logits),
        extra_data=extra,
    )
    # Every edge has reward 0 and discount −1: stored once per node ([B, N, 1], broadcast over
    # actions by mctx's ``qvalues``) instead of two [B, N, A] arrays, a third of the tree's
    # memory that each move allocated, filled and never read differently.
    edge = (batch, num_nodes, 1)
    dtype = tree.children_values.dtype
    return tree.replace(
        children_rewards=jnp.zeros(edge, dtype), children_discounts=jnp.full(edge, -1.0, dtype)
    )


def _path_nodes(parents: chex.Array, depth: chex.Array, node: chex.Array, max_path: int):
    """Node indices at depths 1..depth(node) on the way to ``node`` (unbatched), padded."""
    d = depth[node]

    def body(i, carry):
        idx, path = carry
        slot = jnp.where(i < d, d - 1 - i, max_path)  # out of range: dropped
        path = path.at[slot].set(idx, mode="drop")
        idx = jnp.where(idx > 0, parents[jnp.maximum(idx, 0)], 0)
        return idx, path

    _, path = jax.lax.fori_loop(0, max_path, body, (node, jnp.zeros((max_path,), jnp.int32)))
    return path, d


class _SimState(NamedTuple):
    node: chex.Array
    action: chex.Array
    next_node: chex.Array
    revisit: chex.Array
    continuing: chex.Array


def _simulate(tree: Tree, select_fn, frozen: chex.Array):
    """Descend from the root (unbatched tree) to an unexpanded edge or a frozen node."""

    def body(state: _SimState) -> _SimState:
        node = state.next_node
        action = select_fn(None, tree, node, 0)
        child = tree.children_index[node, action]
        is_frozen = frozen[node]
        expanded = child != Tree.UNVISITED
        return _SimState(
            node=node,
            action=action,
            next_node=jnp.where(expanded, child, node),
            revisit=is_frozen,
            continuing=expanded & ~is_frozen,
        )

    init = _SimState(
        node=jnp.int32(Tree.ROOT_INDEX),
        action=jnp.int32(0),
        next_node=jnp.int32(Tree.ROOT_INDEX),
        revisit=jnp.array(False),
        continuing=jnp.array(True),
    )
    end = jax.lax.while_loop(lambda s: s.continuing, body, init)
    return end.node, end.action, end.revisit


def backup(
    tree: Tree,
    path: chex.Array,
    path_len: chex.Array,
    expanded: chex.Array,
    active: chex.Array,
    new_node: chex.Array,
    leaf_value: chex.Array,
    num_nodes: int,
) -> Tree:
    """mctx's ``backward`` (reward 0, discount −1) as one scatter per statistic, not a loop.

    mctx walks from the leaf to the root in a vmapped ``while_loop`` whose carry is the whole
    tree; batching that loop selects between the old and the new tree at every step, i.e. it
    rewrites the [B, N, A] child statistics once per depth level of every simulation, which
    made a step's cost grow with the tree size. The path from the root is already known
    (``path``: nodes at depths 1..path_len of the selected node), so every ancestor's update is
    computed at once with mctx's exact arithmetic: ancestor j of a leaf at depth D gets
    (V·n + (−1)^(D−j)·v) / (n + 1), and its edge towards the leaf the child's new value.
    """
    batch, p = path.shape
    brange = jnp.arange(batch)[:, None]
    # chain[:, j]: the node at depth j on the way to the leaf (0 = root); the new node at d + 1
    chain = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), path], axis=1)
    chain = chain.at[brange[:, 0], jnp.where(expanded, path_len + 1, p + 1)].set(
        new_node, mode="drop"
    )
    leaf_depth = jnp.where(active, path_len + expanded.astype(jnp.int32), 0)[:, None]
    j = jnp.arange(p + 1)[None, :]
    ancestor = j < leaf_depth
    count = tree.node_visits[brange, chain]
    odd = (leaf_depth - j) % 2 == 1
    contribution = jnp.where(odd, -leaf_value[:, None], leaf_value[:, None])
    new_values = (tree.node_values[brange, chain] * count + contribution) / (count + 1.0)
    # value each ancestor's edge towards the leaf takes: its child's updated value
    child_values = jnp.concatenate([new_values[:, 1:], new_values[:, :1]], axis=1)
    child_values = jnp.where(j + 1 == leaf_depth, leaf_value[:, None], child_values)
    child = jnp.concatenate([chain[:, 1:], chain[:, :1]], axis=1)
    action = tree.action_from_parent[brange, child]
    slot = jnp.where(ancestor, chain, num_nodes)  # out of range: dropped
    return tree.replace(
        node_values=tree.node_values.at[brange, slot].set(new_values, mode="drop"),
        node_visits=tree.node_visits.at[brange, slot].add(1, mode="drop"),
        children_values=tree.children_values.at[brange, slot, action].set(
            child_values, mode="drop"
        ),
        children_visits=tree.children_visits.at[brange, slot, action].add(1, mode="drop"),
    )


def search(
    root: NodeEval,
    expand_fn: ExpandFn,
    budgets: chex.Array,
    c_puct: chex.Array,
    *,
    num_nodes: int,
    params: SearchParams,
    select_fn: SelectFn | None = None,
    extra_data: dict | None = None,
    leaf_batch: int | None = None,
) -> Tree:
    """Run ``budgets[b]`` simulations for game b (≤ num_nodes − 1), all in one loop.

    ``num_nodes`` is static (tree storage); the loop bound max(budgets) is dynamic, so
    different budgets do not recompile. ``select_fn`` (an mctx action-selection function on the
    unbatched tree, called at every node with depth 0) defaults to Allie's pUCT; it reads
    per-game data from ``tree.extra_data`` (``c_puct`` plus ``extra_data``). ``leaf_batch``:
    leaves per game per step (see the module docstring; None: ``params.leaf_batch``).
    """
    tree = init_tree(root, c_puct, num_nodes, extra_data, log_prior=select_fn is None)
    stop = jnp.max(jnp.minimum(jnp.asarray(budgets, jnp.int32), num_nodes - 1))
    return run_simulations(
        tree,
        expand_fn,
        budgets,
        0,
        stop,
        num_nodes=num_nodes,
        params=params,
        select_fn=select_fn,
        leaf_batch=leaf_batch,
    )


def run_simulations(
    tree: Tree,
    expand_fn: ExpandFn,
    budgets: chex.Array,
    start: chex.Array | int,
    stop: chex.Array | int,
    *,
    num_nodes: int,
    params: SearchParams,
    select_fn: SelectFn | None = None,
    leaf_batch: int | None = None,
) -> Tree:
    """Simulations ``start .. stop − 1`` on a tree from ``init_tree`` (or an earlier call).

    ``search`` is one call over 0 .. max(budgets); a caller with a clock runs the same loop in
    chunks (the tree carries everything between them, ``extra_data`` included), so it can stop
    at a deadline with the tree it has: simulation ``sim`` does exactly the same either way.
    With ``leaf_batch`` K > 1 a step runs simulations K·s .. K·s + K − 1 (those inside
    [start, stop)), so chunks whose bounds are multiples of K build the same tree as one call.
    ``leaf_batch`` None: ``params.leaf_batch``.
    """
    if leaf_batch is None:
        leaf_batch = params.leaf_batch
    if leaf_batch < 1:
        raise ValueError(f"leaf_batch={leaf_batch} must be at least 1")
    if params.virtual_loss not in VIRTUAL_LOSSES:
        raise ValueError(
            f"virtual_loss={params.virtual_loss!r}: expected one of {list(VIRTUAL_LOSSES)}"
        )
    # the first-play value the selection gives an unvisited edge (the "visit" rule keeps it)
    first_play = (params.fpu_mode, params.fpu) if select_fn is None else ("mixed", 0.0)
    batch = tree.node_values.shape[0]
    brange = jnp.arange(batch)
    budgets = jnp.minimum(jnp.asarray(budgets, jnp.int32), num_nodes - 1)
    if select_fn is None:
        select_fn = make_puct_selection(
            c_base=params.c_base, fpu_mode=params.fpu_mode, fpu=params.fpu
        )
    simulate = jax.vmap(_simulate, in_axes=(0, None, 0))
    log_prior = RAW_ROOT_LOGITS in tree.extra_data  # static: see ``init_tree``
    paths = jax.vmap(_path_nodes, in_axes=(0, 0, 0, None))

    def body(sim, tree: Tree) -> Tree:
        active = sim < budgets
        emb = tree.embeddings
        node, action, revisit = simulate(tree, select_fn, emb["frozen"])
        path, path_len = paths(tree.parents, emb["depth"], node, params.max_path)
        # rows past the last active one are idle: the expand may skip them (their writes drop)
        num_active = jnp.max(jnp.where(active, brange + 1, 0))
        ev = expand_fn(emb["payload"], node, path, path_len, action, num_active)

        expand = active & ~revisit
        new = jnp.full((batch,), sim + 1, jnp.int32)
        out = jnp.int32(num_nodes)  # out-of-range slot: writes are dropped
        write = jnp.where(expand, new, out)
        parent_w = jnp.where(expand, node, out)
        child_depth = emb["depth"][brange, node] + 1

        def put(x, v, *idx):
            return x.at[(brange, *idx)].set(v, mode="drop")

        embeddings = {
            "payload": jax.tree.map(lambda s, v: put(s, v, write), emb["payload"], ev.payload),
            "depth": put(emb["depth"], child_depth, write),
            "frozen": put(emb["frozen"], ev.terminal | (child_depth >= params.max_path), write),
        }
        value = ev.value.astype(tree.node_values.dtype)
        prior_logits = selection_log_prior(ev.prior_logits) if log_prior else ev.prior_logits
        visits = put(tree.node_visits, 1, write)
        # A revisit of a frozen node counts one more visit of an unchanged value.
        bump = jnp.where(active & revisit, node, out)
        visits = visits.at[brange, bump].add(1, mode="drop")
        tree = tree.replace(
            children_prior_logits=put(tree.children_prior_logits, prior_logits, write),
            raw_values=put(tree.raw_values, value, write),
            node_values=put(tree.node_values, value, write),
            node_visits=visits,
            embeddings=embeddings,
            children_index=put(tree.children_index, new, parent_w, action),
            parents=put(tree.parents, node, write),
            action_from_parent=put(tree.action_from_parent, action, write),
        )
        leaf_value = jnp.where(revisit, tree.node_values[brange, node], value)
        return backup(tree, path, path_len, expand, active, new, leaf_value, num_nodes)

    if leaf_batch == 1:
        return jax.lax.fori_loop(start, stop, body, tree)
    step = _leaf_batch_step(
        expand_fn,
        budgets,
        start,
        stop,
        num_nodes,
        params,
        select_fn,
        log_prior,
        leaf_batch,
        first_play,
    )
    k = leaf_batch
    return jax.lax.fori_loop(start // k, (stop + k - 1) // k, step, tree)


def _pending_edges(
    tree: Tree,
    path: chex.Array,
    path_len: chex.Array,
    action: chex.Array,
    revisit: chex.Array,
    active: chex.Array,
    num_nodes: int,
) -> tuple[chex.Array, chex.Array, chex.Array]:
    """The edges a pending leaf passes, as (node slot [B, P + 1], action [B, P + 1], brange).

    Edges at depths 0 .. path_len − 1 lead along ``path``; the selected edge at depth path_len
    follows unless the leaf is a ``revisit`` of a frozen node. Slots of other depths and of
    inactive games are out of range (their writes drop).
    """
    batch, p = path.shape
    brange = jnp.arange(batch)[:, None]
    chain = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), path], axis=1)  # depth j node
    after = jnp.concatenate([chain[:, 1:], chain[:, :1]], axis=1)  # the node at depth j + 1
    j = jnp.arange(p + 1)[None, :]
    depth = path_len[:, None]
    act = jnp.where(j < depth, tree.action_from_parent[brange, after], action[:, None])
    valid = active[:, None] & ((j < depth) | ((j == depth) & ~revisit[:, None]))
    return jnp.where(valid, chain, num_nodes), act, brange


def virtual_loss(
    tree: Tree,
    path: chex.Array,
    path_len: chex.Array,
    node: chex.Array,
    action: chex.Array,
    revisit: chex.Array,
    active: chex.Array,
    num_nodes: int,
) -> Tree:
    """One pending leaf per game as a lost visit on every edge of its path (batched tree).

    Edges at depths 0 .. path_len − 1 lead along ``path`` to ``node``; the selected edge
    (``node``, ``action``) follows unless the leaf is a ``revisit`` of a frozen node. Each gets
    N(s, a) + 1 and a child value moved towards +1 (a win for the child's mover, so
    Q(s, a) = −V(child) moves towards −1 for the chooser); each choosing node gets N(s) + 1.
    """
    del node  # the path's last node: ``path`` already names it
    slot, act, brange = _pending_edges(tree, path, path_len, action, revisit, active, num_nodes)
    chain = jnp.minimum(slot, num_nodes - 1)  # dropped slots read any node: never written
    n = tree.children_visits[brange, chain, act].astype(tree.children_values.dtype)
    lost = (tree.children_values[brange, chain, act] * n + 1.0) / (n + 1.0)
    return tree.replace(
        node_visits=tree.node_visits.at[brange, slot].add(1, mode="drop"),
        children_visits=tree.children_visits.at[brange, slot, act].add(1, mode="drop"),
        children_values=tree.children_values.at[brange, slot, act].set(lost, mode="drop"),
    )


def virtual_visit(
    tree: Tree,
    path: chex.Array,
    path_len: chex.Array,
    node: chex.Array,
    action: chex.Array,
    revisit: chex.Array,
    active: chex.Array,
    num_nodes: int,
    *,
    fpu_mode: str,
    fpu: float,
) -> Tree:
    """One pending leaf per game as an in-flight visit (lc0's rule; batched tree).

    The same edges and nodes as ``virtual_loss`` count one more visit (N(s, a) + 1, N(s) + 1),
    but no value changes: a visited edge keeps its mean. The selected edge, if nothing has
    visited it yet (no real visit, no earlier pending one), gets the child value that keeps
    Q(s, a) = −V(child) at the first-play value the selection gave it
    (``selection.completed_q`` with ``fpu_mode`` / ``fpu``), since from now on the statistics
    count it as visited and would read its stored value instead.
    """
    slot, act, brange = _pending_edges(tree, path, path_len, action, revisit, active, num_nodes)
    b = brange[:, 0]
    first_q = jax.vmap(
        lambda t, s, a: completed_q(t, s, fpu_mode=fpu_mode, fpu=fpu)[a], in_axes=(0, 0, 0)
    )(tree, node, action)
    unseen = active & ~revisit & (tree.children_visits[b, node, action] == 0)
    pin = jnp.where(unseen, node, num_nodes)  # out of range: dropped
    return tree.replace(
        node_visits=tree.node_visits.at[brange, slot].add(1, mode="drop"),
        children_visits=tree.children_visits.at[brange, slot, act].add(1, mode="drop"),
        children_values=tree.children_values.at[b, pin, action].set(
            -first_q.astype(tree.children_values.dtype), mode="drop"
        ),
    )


def _leaf_batch_step(
    expand_fn: ExpandFn,
    budgets: chex.Array,
    start: chex.Array | int,
    stop: chex.Array | int,
    num_nodes: int,
    params: SearchParams,
    select_fn: SelectFn,
    log_prior: bool,
    k: int,
    first_play: tuple[str, float],
):
    """The loop body of ``run_simulations`` for K > 1 leaves per game (module docstring).

    ``first_play``: the (fpu_mode, fpu) completion the selection gives unvisited edges, which
    the ``"visit"`` rule keeps as a pending edge's Q.
    """
    batch = budgets.shape[0]
    brange = jnp.arange(batch)
    rows = jnp.arange(batch * k)
    leaves = jnp.arange(k)
    simulate = jax.vmap(_simulate, in_axes=(0, None, 0))
    paths = jax.vmap(_path_nodes, in_axes=(0, 0, 0, None))
    out = jnp.int32(num_nodes)  # out-of-range slot: writes are dropped
    if params.virtual_loss == "visit":
        pend = functools.partial(virtual_visit, fpu_mode=first_play[0], fpu=first_play[1])
    else:
        pend = virtual_loss

    def step(s, tree: Tree) -> Tree:
        sims = s * k + leaves  # [K]: simulation index of each leaf
        active = (sims < budgets[:, None]) & (sims >= start) & (sims < stop)  # [B, K]
        emb = tree.embeddings

        def pick(j, carry):
            # selection on the tree plus the pending losses of the leaves picked before j; only
            # the three statistics change, so only they are carried (not the payload store)
            node_visits, children_visits, children_values, picked = carry
            virtual = tree.replace(
                node_visits=node_visits,
                children_visits=children_visits,
                children_values=children_values,
            )
            node, action, revisit = simulate(virtual, select_fn, emb["frozen"])
            path, path_len = paths(tree.parents, emb["depth"], node, params.max_path)
            virtual = pend(virtual, path, path_len, node, action, revisit, active[:, j], num_nodes)
            picked = jax.tree.map(
                lambda acc, x: acc.at[:, j].set(x), picked, (node, action, revisit, path, path_len)
            )
            return virtual.node_visits, virtual.children_visits, virtual.children_values, picked

        picked = (
            jnp.zeros((batch, k), jnp.int32),
            jnp.zeros((batch, k), jnp.int32),
            jnp.zeros((batch, k), bool),
            jnp.zeros((batch, k, params.max_path), jnp.int32),
            jnp.zeros((batch, k), jnp.int32),
        )
        carry = (tree.node_visits, tree.children_visits, tree.children_values, picked)
        node, action, revisit, path, path_len = jax.lax.fori_loop(0, k, pick, carry)[3]

        # ONE evaluation of all B·K leaves: row r is leaf r % K of game r // K
        flat_active = active.reshape(-1)
        num_active = jnp.max(jnp.where(flat_active, rows + 1, 0))
        ev = expand_fn(
            emb["payload"],
            node.reshape(-1),
            path.reshape(batch * k, -1),
            path_len.reshape(-1),
            action.reshape(-1),
            num_active,
        )
        ev = jax.tree.map(lambda x: x.reshape((batch, k) + x.shape[1:]), ev)

        expand = active & ~revisit
        # leaf j collides with an earlier leaf j' < j of its game on the same unexpanded edge
        same = (
            (node[:, :, None] == node[:, None, :])
            & (action[:, :, None] == action[:, None, :])
            & expand[:, None, :]
            & (leaves[:, None] > leaves[None, :])
        )
        collide = expand & same.any(-1)
        fresh = expand & ~collide
        owner = jnp.argmax(same, axis=-1)  # the first earlier leaf on that edge
        new = jnp.broadcast_to(sims + 1, (batch, k)).astype(jnp.int32)
        write = jnp.where(fresh, new, out)
        parent_w = jnp.where(fresh, node, out)
        b2 = brange[:, None]
        child_depth = emb["depth"][b2, node] + 1

        def put(x, v, *idx):
            return x.at[(b2, *idx)].set(v, mode="drop")

        embeddings = {
            "payload": jax.tree.map(lambda st, v: put(st, v, write), emb["payload"], ev.payload),
            "depth": put(emb["depth"], child_depth, write),
            "frozen": put(emb["frozen"], ev.terminal | (child_depth >= params.max_path), write),
        }
        value = ev.value.astype(tree.node_values.dtype)
        prior_logits = selection_log_prior(ev.prior_logits) if log_prior else ev.prior_logits
        tree = tree.replace(
            children_prior_logits=put(tree.children_prior_logits, prior_logits, write),
            raw_values=put(tree.raw_values, value, write),
            node_values=put(tree.node_values, value, write),
            node_visits=put(tree.node_visits, 1, write),
            embeddings=embeddings,
            children_index=put(tree.children_index, new, parent_w, action),
            parents=put(tree.parents, node, write),
            action_from_parent=put(tree.action_from_parent, action, write),
        )
        # the node each leaf backs up: its new node, the one its collision created, or the
        # frozen node it revisits
        owner_node = jnp.take_along_axis(new, owner, axis=1)
        owner_value = jnp.take_along_axis(value, owner, axis=1)
        leaf_node = jnp.where(fresh, new, jnp.where(collide, owner_node, node))
        leaf_value = jnp.where(collide, owner_value, value)
        grows = fresh | collide  # the leaf sits one below the path's end

        def back(j, tree: Tree) -> Tree:
            # a collision or a revisit counts one more visit of a node already holding its value
            bump = jnp.where(active[:, j] & ~fresh[:, j], leaf_node[:, j], out)
            tree = tree.replace(node_visits=tree.node_visits.at[brange, bump].add(1, mode="drop"))
            v = jnp.where(revisit[:, j], tree.node_values[brange, node[:, j]], leaf_value[:, j])
            return backup(
                tree,
                path[:, j],
                path_len[:, j],
                grows[:, j],
                active[:, j],
                leaf_node[:, j],
                v,
                num_nodes,
            )

        return jax.lax.fori_loop(0, k, back, tree)

    return step
