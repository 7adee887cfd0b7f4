"""The per-system seam of the evaluator: what a system is asked, what it answers, how it is named.

A *system* is anything that predicts the human's move at a position: the Allie policy, a search
preset, Maia, a board transformer. The evaluator hands it a ``Positions`` (a chunk of games and the
(game, ply) pairs to score) and gets back ``Scores``: one row per position with the fields the
per-position records keep (``allie_jax.eval.records``). Everything the report says about a system
is computed from those rows, so a new system needs only a ``score`` method and a registry entry.

Names on ``--systems`` resolve through the registry: an exact name first, else the longest
registered prefix (``maia`` serves ``maia-1500``). ``BUILTIN`` maps names to ``"module:factory"``
strings imported on first use, so a system's dependencies load only when it is asked for; tests and
plug-ins may also call ``register``. A factory is called as ``factory(name, context)``.

Usage::

    from allie_jax.eval.systems import SystemContext, make_systems
    systems = make_systems(["policy", "adaptive"], SystemContext(model=model))
    scores = systems[0].score(positions)  # Scores with one row per (game, ply) asked
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from allie_jax import vocab
from allie_jax.eval.positions import GamePositions
from allie_jax.game import Game

TOP_K = 5  # moves kept per position in the records

# ------------------------------------------------------------------------------------------------
# What a system is asked


@dataclasses.dataclass
class Positions:
    """Positions to score: ``(game[p], ply[p])`` for p < P, over the games of one chunk.

    Ply i is the board before move i; ply ``num_moves`` is the final board (no human move).
    ``gps[g]`` carries the rules facts of ``games[g]`` (legal moves, the human's move ids).
    """

    games: Sequence[Game]
    gps: Sequence[GamePositions]
    game: np.ndarray  # int64 [P] index into games
    ply: np.ndarray  # int64 [P]
    seed: int = 0  # for stochastic systems; combine with ``key()`` so rows stay reproducible

    def __len__(self) -> int:
        return int(self.game.size)

    def human_move(self) -> np.ndarray:
        """int32 [P]: the human's move id at each position (−1 at a final board)."""
        out = np.full(len(self), -1, np.int32)
        for p, (g, i) in enumerate(zip(self.game, self.ply, strict=True)):
            if i < self.gps[g].num_moves:
                out[p] = self.gps[g].move_ids[i]
        return out

    def prefix(self, p: int) -> Game:
        """Position p as a game in progress (moves before the ply, no result): what a player sees."""
        game = self.games[int(self.game[p])]
        ply = int(self.ply[p])
        cut = lambda xs: None if xs is None else list(xs[:ply])  # noqa: E731
        return dataclasses.replace(
            game,
            moves=list(game.moves[:ply]),
            result=None,
            termination="Unterminated",
            think_times=cut(game.think_times),
            clocks=cut(game.clocks),
        )

    def legal_ids(self, p: int) -> np.ndarray:
        return self.gps[int(self.game[p])].legal_ids[int(self.ply[p])]


# ------------------------------------------------------------------------------------------------
# What a system answers


@dataclasses.dataclass
class Scores:
    """One row per asked position. Fields a system does not produce stay at their empty value
    (NaN, −1, False); rows with ``scored`` False (e.g. beyond a model's context) are written as
    nulls. Probabilities are the system's own: the full softmax for a model policy (so its legal
    top-k may sum below 1), the final search policy for a search."""

    scored: np.ndarray  # bool [P]
    top_moves: np.ndarray  # int32 [P, k] legal move ids, most probable first, −1 padding
    top_probs: np.ndarray  # float32 [P, k]
    p_human: np.ndarray  # float32 [P] probability of the human's move (NaN at a final board)
    think_time: np.ndarray  # float32 [P] predicted seconds for the move
    value: np.ndarray  # float32 [P] expected outcome, White's view, in [−1, 1]
    top_legal: np.ndarray  # bool [P] the most probable move *token* is a legal move
    invalid_mass: np.ndarray  # float32 [P] probability on illegal move tokens
    num_sims: np.ndarray  # int32 [P] simulations run (0 without search)
    resign: np.ndarray  # bool [P] the system would resign here

    @classmethod
    def empty(cls, num: int, k: int = TOP_K) -> Scores:
        nan = np.full(num, np.nan, np.float32)
        return cls(
            scored=np.zeros(num, bool),
            top_moves=np.full((num, k), -1, np.int32),
            top_probs=np.zeros((num, k), np.float32),
            p_human=nan.copy(),
            think_time=nan.copy(),
            value=nan.copy(),
            top_legal=np.zeros(num, bool),
            invalid_mass=nan.copy(),
            num_sims=np.zeros(num, np.int32),
            resign=np.zeros(num, bool),
        )

    def __len__(self) -> int:
        return int(self.scored.size)

    def scatter(self, rows: np.ndarray, total: int, k: int | None = None) -> Scores:
        """These rows placed at ``rows`` of ``total`` (the others unscored)."""
        out = Scores.empty(total, k or self.top_moves.shape[1])
        for f in dataclasses.fields(self):
            src, dst = getattr(self, f.name), getattr(out, f.name)
            if src.ndim == 2:
                w = min(src.shape[1], dst.shape[1])
                dst[rows, :w] = src[:, :w]
            else:
                dst[rows] = src
        return out

    @property
    def top1(self) -> np.ndarray:
        """int32 [P]: the system's move (−1 where none): what move matching compares."""
        return self.top_moves[:, 0]

    def set_from_distribution(
        self, p: int, probs: np.ndarray, legal: np.ndarray, human: int, *, all_tokens: bool
    ) -> None:
        """Fill row p from a probability vector over the 1,968 moves (or the full vocabulary).

        ``all_tokens``: ``probs`` is the model's whole distribution, so legality flags are
        measured; otherwise it already lives on legal moves (a search policy) and they hold.
        """
        mask = np.zeros((1, vocab.NUM_MOVES), bool)
        mask[0, legal] = True
        self.set_rows(
            np.array([p]), np.asarray(probs)[None], mask, np.array([human]), all_tokens=all_tokens
        )

    def set_rows(
        self,
        rows: np.ndarray,
        probs: np.ndarray,
        legal: np.ndarray,
        human: np.ndarray,
        *,
        all_tokens: bool,
    ) -> None:
        """``set_from_distribution`` for many rows at once: ``probs`` [R, ≥1968], ``legal`` bool
        [R, 1968], ``human`` [R] (−1: no human move). Ties rank the lower move id first."""
        moves = np.asarray(probs)[:, : vocab.NUM_MOVES].astype(np.float64)
        k = self.top_moves.shape[1]
        r = np.arange(len(rows))
        masked = np.where(legal, moves, -1.0)
        order = np.argsort(-masked, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(masked, order, axis=1)
        has = top >= 0
        self.top_moves[rows] = np.where(has, order, -1)
        self.top_probs[rows] = np.where(has, top, 0.0)
        self.p_human[rows] = np.where(human >= 0, moves[r, np.maximum(human, 0)], np.nan)
        any_legal = legal.any(axis=1)
        if all_tokens:
            self.top_legal[rows] = legal[r, moves.argmax(axis=1)] & any_legal
            self.invalid_mass[rows] = np.where(legal, 0.0, moves).sum(axis=1)
        else:
            self.top_legal[rows] = any_legal
            self.invalid_mass[rows] = 0.0
        self.scored[rows] = True


@runtime_checkable
class System(Protocol):
    """A move predictor under evaluation.

    ``subsample``: True for expensive systems (search) that score only the protocol's search
    positions (``--search_positions``); False for systems that score every position.
    ``info``: JSON-able facts the report shows next to the system (e.g. ``{"elo": 2500}``).
    ``on_batch``: called with the number of positions each scored batch held (the evaluator's
    progress bar sets it on subsample systems); None: nobody listens.
    """

    name: str
    subsample: bool
    info: Mapping[str, Any]
    on_batch: Callable[[int], None] | None

    def score(self, positions: Positions) -> Scores: ...


# ------------------------------------------------------------------------------------------------
# Built-in systems


class PolicySystem:
    """The Allie policy (``policy``), or ``greedy`` (both header Elos at ``greedy_elo``): one causal
    pass per game gives every position at once (``allie_jax.eval.scoring``)."""

    subsample = False

    def __init__(
        self,
        model,
        *,
        name: str = "policy",
        elo_override: int | None = None,
        batch_size: int = 16,
        resign_value: float = -0.9,
        top_k: int = TOP_K,
    ):
        from allie_jax.eval.scoring import CausalScorer

        self.name = name
        self.elo_override = elo_override
        self.resign_value = resign_value
        self.top_k = top_k
        self.info = {} if elo_override is None else {"elo": elo_override}
        self.scorer = CausalScorer(model, batch_size=batch_size)
        self.on_batch: Callable[[int], None] | None = None

    def score(self, positions: Positions) -> Scores:
        from allie_jax.eval import metrics

        out = Scores.empty(len(positions), self.top_k)
        human = positions.human_move()
        by_game: dict[int, list[int]] = {}
        for p, g in enumerate(positions.game):
            by_game.setdefault(int(g), []).append(p)
        games = [positions.games[g] for g in by_game]
        keys = list(by_game)
        for j, res in self.scorer.score(
            games, elo_override=self.elo_override, on_batch=self.on_batch
        ):
            g = keys[j]
            gp = positions.gps[g]
            rows = np.array(by_game[g])
            plies = positions.ply[rows]
            inside = plies < len(res.value_white)  # the rest lies beyond the model's context
            rows, plies = rows[inside], plies[inside]
            logp = res.log_probs[plies]
            legal = gp.legal_mask()[plies]
            out.set_rows(rows, np.exp(logp), legal, human[rows], all_tokens=True)
            value = res.value_white[plies]
            out.value[rows] = value
            out.think_time[rows] = res.time_s[plies]
            v_mover = np.where(gp.white_to_move[plies], value, -value)
            best_legal = np.where(legal, logp[:, : vocab.NUM_MOVES], -np.inf).max(axis=1)
            out.resign[rows] = legal.any(axis=1) & metrics.resign_decisions(
                logp[:, vocab.TERMINATION], best_legal, v_mover, value_threshold=self.resign_value
            )
        return out


def position_key(seed: int, game_id: str, ply: int) -> int:
    """A 31-bit number fixed by (seed, game id, ply): what a sampling system's random key is
    folded from, so its answer at a position does not depend on the chunk or shard it ran in."""
    import hashlib

    text = f"{seed}:{game_id}:{ply}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(), "little") >> 1


def game_batches(positions: Positions, size: int, *, per_game: bool) -> list[list[int]]:
    """Rows of ``positions`` in search batches of at most ``size``, in (game id, ply) order.

    ``per_game``: a batch never mixes games, so its content (and the key folded from its first
    row) is fixed by the game and the plies asked there, whatever else the chunk holds; a
    sampling search needs that to answer the same under any sharding."""
    order = sorted(
        range(len(positions)),
        key=lambda p: (positions.games[int(positions.game[p])].game_id, int(positions.ply[p])),
    )
    if not per_game:
        return [order[i : i + size] for i in range(0, len(order), size)]
    batches: list[list[int]] = []
    current: list[int] = []
    for p in order:
        if current and (len(current) == size or positions.game[current[0]] != positions.game[p]):
            batches.append(current)
            current = []
        current.append(p)
    if current:
        batches.append(current)
    return batches


class SearchSystem:
    """A ``Searcher`` preset (``search``, ``adaptive``, ``gumbel``, ... every ``SearchConfig`` mode
    that builds a tree): the final search policy at each asked position.

    Deterministic searches (pUCT with π̄) batch positions across games. Sampling searches (the
    Gumbel modes, whose root noise is drawn per row of a batch) batch each game's positions on
    their own, with a key folded from (seed, game id, first ply of the batch): the noise then
    depends on the game and ply, not on the chunk or the sharding. The searcher's KV cache is
    cleared per call, so a chunk's numbers do not depend on what was scored before it."""

    subsample = True

    def __init__(
        self,
        model,
        mode: str,
        *,
        config=None,
        batch_size: int = 64,
        seed: int = 0,
        top_k: int = TOP_K,
    ):
        from allie_jax.search import SearchConfig, Searcher

        self.name = mode
        self.config = config if config is not None else SearchConfig.preset(mode)
        self.searcher = Searcher(model, self.config)
        self.batch_size = batch_size
        self.seed = seed
        self.top_k = top_k
        self.sampling = self.config.mode.startswith("gumbel") and self.config.gumbel_noise > 0
        changed = {
            f.name: getattr(self.config, f.name)
            for f in dataclasses.fields(self.config)
            if f.name != "mode"
            and getattr(self.config, f.name) != getattr(SearchConfig.preset(mode), f.name)
        }
        self.info: dict[str, Any] = {"search_options": changed} if changed else {}
        self.on_batch: Callable[[int], None] | None = None

    def score(self, positions: Positions) -> Scores:
        import jax

        out = Scores.empty(len(positions), self.top_k)
        human = positions.human_move()
        self.searcher.forget()
        base = jax.random.key(self.seed + 1)
        size = self.batch_size
        for idx in game_batches(positions, size, per_game=self.sampling):
            first = idx[0]
            game_id = positions.games[int(positions.game[first])].game_id
            key = jax.random.fold_in(
                base, position_key(self.seed, game_id, int(positions.ply[first]))
            )
            batch = [positions.prefix(p) for p in idx]
            n = len(batch)
            if not self.sampling and n < size and len(positions) > size:
                batch += [batch[-1]] * (size - n)  # one batch shape: no second compilation
            res = self.searcher.run(batch, key)
            for b, p in enumerate(idx):
                legal = positions.legal_ids(p)
                out.set_from_distribution(p, res.policy[b], legal, int(human[p]), all_tokens=False)
                out.value[p] = res.value_white[b]
                out.think_time[p] = res.think_time_s[b]
                out.num_sims[p] = res.num_sims[b]
                out.resign[p] = res.resign[b]
            if self.on_batch is not None:
                self.on_batch(n)
        return out


class StockfishSystem:
    """Stockfish as an oracle (``--stockfish PATH``): its WDL expectation at fixed nodes as the
    value (White's view, in [−1, 1]) and its best move as the top move, on its own seeded
    subsample of positions."""

    subsample = True
    name = "stockfish"

    def __init__(self, path: str, *, nodes: int = 20_000):
        self.path = path
        self.nodes = nodes
        self.info = {"nodes": nodes}
        self.on_batch: Callable[[int], None] | None = None

    def score(self, positions: Positions) -> Scores:
        import chess
        import chess.engine

        out = Scores.empty(len(positions), 1)
        human = positions.human_move()
        with chess.engine.SimpleEngine.popen_uci(self.path) as engine:
            for p in range(len(positions)):
                board = chess.Board()
                for uci in positions.games[int(positions.game[p])].moves[: int(positions.ply[p])]:
                    board.push_uci(uci)
                info = engine.analyse(board, chess.engine.Limit(nodes=self.nodes))
                out.value[p] = 2.0 * info["score"].white().wdl(model="sf").expectation() - 1.0
                if info.get("pv"):
                    out.top_moves[p, 0] = vocab.MOVE_TO_ID[info["pv"][0].uci()]
                    out.top_probs[p, 0] = 1.0
                out.p_human[p] = float(out.top_moves[p, 0] == human[p]) if human[p] >= 0 else np.nan
                out.top_legal[p] = True
                out.invalid_mass[p] = 0.0
                out.scored[p] = True
                if self.on_batch is not None:
                    self.on_batch(1)
        return out


# ------------------------------------------------------------------------------------------------
# The registry


@dataclasses.dataclass
class SystemContext:
    """What a factory may use: the Allie model (loaded on first use), the evaluation config, and
    free-form ``options`` from ``--system_options key=value,...`` (e.g. a Maia weights dir)."""

    model: Any = None
    config: Any = None  # EvalConfig
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    load_model: Callable[[], Any] | None = None

    def allie(self):
        """The Allie model, loading it on first use (systems that do not need it never pay)."""
        if self.model is None:
            if self.load_model is None:
                raise ValueError("this system needs an Allie checkpoint (--checkpoint)")
            self.model = self.load_model()
        return self.model

    def get(self, name: str, default: Any) -> Any:
        return getattr(self.config, name, default) if self.config is not None else default


def _policy(name: str, ctx: SystemContext) -> System:
    return PolicySystem(
        ctx.allie(),
        name=name,
        batch_size=ctx.get("batch_size", 16),
        resign_value=ctx.get("resign_value", -0.9),
        top_k=ctx.get("top_k", TOP_K),
    )


def _greedy(name: str, ctx: SystemContext) -> System:
    from allie_jax.search.config import SearchConfig

    return PolicySystem(
        ctx.allie(),
        name=name,
        elo_override=SearchConfig().greedy_elo,
        batch_size=ctx.get("batch_size", 16),
        resign_value=ctx.get("resign_value", -0.9),
        top_k=ctx.get("top_k", TOP_K),
    )


def search_config(mode: str, options: Mapping[str, str]):
    """``SearchConfig.preset(mode)`` with every ``--system_options`` key that names a
    ``SearchConfig`` field applied (``search.config.from_options``: ``lambda`` is
    ``anchor_lambda``); other keys belong to other factories and are ignored here."""
    from allie_jax.search.config import from_options

    return from_options(mode, options)


def _search(name: str, ctx: SystemContext) -> System:
    return SearchSystem(
        ctx.allie(),
        name,
        config=search_config(name, ctx.options),
        batch_size=ctx.get("search_batch_size", 64),
        seed=ctx.get("seed", 0),
        top_k=ctx.get("top_k", TOP_K),
    )


Factory = Callable[[str, SystemContext], System]


# name or prefix -> factory, or "module:function" imported on first use (add yours here): the
# Maia family and the board family; every ``SearchConfig`` mode joins on first use (``_modes``).
BUILTIN: dict[str, Factory | str] = {
    "policy": _policy,
    "greedy": _greedy,
    # maia (Maia*), maia-1500, maia+search, maia-1900+gumbel, ...; board, board+search, ...
    "maia": "allie_jax.baselines.eval_systems:make_maia",
    "board": "allie_jax.eval.board_system:make_board",
}
_REGISTRY: dict[str, Factory | str] = dict(BUILTIN)
_MODES: list[str] = []


def _modes() -> dict[str, Factory | str]:
    """The registry with every ``SearchConfig`` mode in it (read from its ``MODES``, so a new mode
    is a system name at once). Done on first use, not at import: importing the search package
    starts JAX's backend, which must wait for ``jax.distributed.initialize``."""
    if not _MODES:
        from allie_jax.search.config import MODES

        for mode in MODES:
            _REGISTRY.setdefault(mode, {"policy": _policy, "greedy": _greedy}.get(mode, _search))
        _MODES.extend(MODES)
    return _REGISTRY


def register(name: str, factory: Factory | str) -> None:
    """Make ``name`` (and names starting with it) resolve to ``factory``."""
    _REGISTRY[name] = factory


def registered() -> list[str]:
    return sorted(_modes())


def resolve(name: str) -> Factory:
    """The factory serving ``name``: an exact entry, else the longest registered prefix."""
    registry = _modes()
    entry = registry.get(name)
    if entry is None:
        prefixes = [p for p in registry if name.startswith(p)]
        if not prefixes:
            raise ValueError(f"unknown system {name!r}: known systems are {registered()}")
        entry = _REGISTRY[max(prefixes, key=len)]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry


def search_suffixes(family: str = "maia") -> tuple[str, ...]:
    """What may follow ``maia+`` / ``maia-R+`` / ``board+``: the search modes the family plays
    (``allie_jax.modes``: neither has a think-time head, so no adaptive mode), and for Maia
    ``visits`` (its visit-count policy)."""
    from allie_jax.modes import SEARCH_MODES, modes_for

    modes = tuple(m for m in modes_for(think_time=False) if m in SEARCH_MODES)
    return (*modes, "visits") if family == "maia" else modes


def _known(name: str) -> bool:
    if name in _modes():
        return True
    base, plus, suffix = name.partition("+")
    if plus:  # a family with a search: maia+MODE, maia-1500+MODE, board+MODE
        family = "maia" if base == "maia" or base.startswith("maia-") else base
        if family in ("maia", "board") and suffix in search_suffixes(family):
            return base in ("maia", "board") or base[5:].isdigit()
    if base.startswith("maia-") and not plus:
        return base[5:].isdigit()
    # plug-ins registered as a prefix (tests, extensions)
    builtin = set(BUILTIN) | set(_MODES)
    return any(name.startswith(p) for p in _REGISTRY if p not in builtin)


def check_names(names: Sequence[str]) -> None:
    """Raise ValueError naming the first unknown system (without importing any).

    Known names: every ``SearchConfig`` mode (``policy``, ``search``, ``gumbel``, ...), ``maia``,
    ``maia-RATING``, ``board``, and ``maia+M`` / ``maia-RATING+M`` / ``board+M`` for every search
    mode ``M`` (``search_suffixes``), plus names registered with ``register``."""
    if not names:
        raise ValueError("no system to evaluate (--systems is empty)")
    for name in names:
        if not _known(name):
            raise ValueError(
                f"unknown system {name!r}: known systems are {registered()}, maia-RATING, and "
                f"maia+M / maia-RATING+M for M in {list(search_suffixes('maia'))}, board+M for M "
                f"in {list(search_suffixes('board'))}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"systems {list(names)} name one system twice")


def make_systems(names: Sequence[str], context: SystemContext) -> list[System]:
    check_names(names)
    return [resolve(n)(n, context) for n in names]
