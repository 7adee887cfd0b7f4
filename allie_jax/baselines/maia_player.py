"""Maia as a player (engine side): ``maia:DIR[:preset[:elo]]``.

- ``preset``: ``policy`` (Maia's move, no search), ``greedy`` (its most probable move),
  ``search`` (π̄ search, ``maia+search``), ``gumbel`` (``maia+gumbel``); default ``policy``.
  The adaptive presets need a think-time prediction, which Maia does not make.
- ``elo``: which network plays (nearest of the directory's, 1100..1900); ``auto`` or absent: the
  network nearest the opponent's rating when the game has one (Maia* as a player), else 1500.

``play(games, rng)`` answers a batch of games in progress (``allie_jax.game.Game``: moves from the
standard start, both ratings) with ``allie_jax.player.Decision`` rows, grouped so each network
runs once per call, through the package's one search and move rule (``search/decision.py``).
``temperature`` 0 plays the argmax (Maia's own use), T > 0 draws from the final policy (the
policy preset's softmax at temperature T: piKL's strength matches use 1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import chess
import jax
import numpy as np

from allie_jax import vocab
from allie_jax.baselines import lc0_moves
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaSet, load_maia, nearest_rating
from allie_jax.baselines.maia_search import MaiaSearchConfig, maia_searcher
from allie_jax.game import Game
from allie_jax.modes import modes_for
from allie_jax.player import Decision, PlayerBase, Prediction
from allie_jax.search.config import SearchConfig, check_fields
from allie_jax.search.searcher import Searcher, SearchOutput

# preset -> MaiaSearchConfig mode (None: no tree). ``greedy`` is the argmax of Maia's policy (Maia
# reads no ratings, so the decoder's greedy Elo conditioning has nothing to change).
PRESETS = {"policy": None, "greedy": None, "search": "pibar", "gumbel": "gumbel"}


@dataclasses.dataclass(frozen=True)
class MaiaSpec:
    maia_dir: str
    preset: str = "policy"
    elo: int | None = None  # None: nearest the opponent's rating (Maia*)

    @property
    def name(self) -> str:
        return f"maia-{self.elo if self.elo else 'auto'}-{self.preset}"


def parse_maia_spec(spec: str) -> MaiaSpec:
    """``maia:DIR[:preset[:elo]]`` → ``MaiaSpec`` (one clear error for a bad spec)."""
    kind, _, rest = spec.partition(":")
    if kind != "maia" or not rest:
        raise ValueError(f"maia spec {spec!r}: expected maia:DIR[:PRESET[:ELO]]")
    parts = rest.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ValueError(f"maia spec {spec!r}: expected maia:DIR[:PRESET[:ELO]]")
    directory = parts[0]
    preset = parts[1] if len(parts) > 1 and parts[1] else "policy"
    if preset not in PRESETS:
        raise ValueError(f"maia spec {spec!r}: preset {preset!r} not in {sorted(PRESETS)}")
    elo = None
    if len(parts) == 3 and parts[2] not in ("", "auto"):
        if not parts[2].isdigit():
            raise ValueError(f"maia spec {spec!r}: Elo {parts[2]!r} is not a number")
        elo = int(parts[2])
    return MaiaSpec(directory, preset, elo)


class MaiaPlayer:
    """Batched Maia moves for games in progress (see the module docstring).

    Every preset runs the package's one ``Searcher`` with Maia as the model
    (``maia_search.maia_searcher``): ``policy`` at budget 0, ``search`` / ``gumbel`` with
    ``num_simulations``; the move comes from ``search/decision.py``'s rule (temperature 0: the
    argmax, else a draw from the final policy, the budget-0 policy tempered by ``temperature``).
    """

    def __init__(
        self,
        spec: MaiaSpec,
        *,
        num_simulations: int = 32,
        pikl_lambda: float | None = None,
        temperature: float = 0.0,
        batch_size: int = 32,
        overrides: Mapping[str, Any] | None = None,
    ):
        if spec.preset not in PRESETS:
            raise ValueError(f"maia preset {spec.preset!r}: expected one of {sorted(PRESETS)}")
        self.spec = spec
        self.maia = MaiaSet(spec.maia_dir)
        if spec.elo is not None:
            self.maia.predictor(
                nearest_rating(spec.elo, self.maia.ratings)
            )  # fail early on a bad dir
        self.batch_size = batch_size
        mode = PRESETS[spec.preset]
        self.config = (
            MaiaSearchConfig(mode=mode, num_simulations=num_simulations, pikl_lambda=pikl_lambda)
            if mode
            else None
        )
        base = (
            self.config.search_config()
            if self.config is not None
            else SearchConfig(mode=spec.preset, resign=False)
        )
        # a caller's SearchConfig fields (the Player protocol's overrides: c_puct, lambda, ...);
        # Maia's budget is fixed, so a mean_sims alone sets max_sims too
        overrides = dict(overrides or {})
        if "mean_sims" in overrides and "max_sims" not in overrides:
            overrides["max_sims"] = overrides["mean_sims"]
        check_fields(overrides)
        self._base_config = dataclasses.replace(base, **overrides)
        self._searchers: dict[int, Searcher] = {}
        self.temperature = temperature

    @property
    def temperature(self) -> float:
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        """0: the argmax; T > 0: a draw from the final policy (the budget-0 policy at T)."""
        if value < 0:
            raise ValueError(f"temperature={value} must not be negative")
        self._temperature = float(value)
        greedy = self.spec.preset == "greedy"
        self.search_config = dataclasses.replace(
            self._base_config,
            temperature=value if value > 0 else 1.0,
            sampling="sample" if value > 0 and not greedy else "argmax",
        )
        for searcher in self._searchers.values():
            searcher.config = self.search_config

    def rating_for(self, game: Game) -> int:
        if self.spec.elo is not None:
            return nearest_rating(self.spec.elo, self.maia.ratings)
        opponent = game.black_elo if len(game.moves) % 2 == 0 else game.white_elo
        return nearest_rating(opponent or 1500, self.maia.ratings)

    def _searcher(self, rating: int) -> Searcher:
        if rating not in self._searchers:
            net = load_maia(self.maia.files[rating])
            self._searchers[rating] = maia_searcher(net, self.search_config)
        return self._searchers[rating]

    def play(
        self,
        games: Sequence[Game],
        rng: jax.Array,
        *,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Decision]:
        """``deadline`` (``time.monotonic()``) and ``should_stop`` cut the search short as they
        do ``Searcher.run``'s: the move then comes from the simulations run so far."""
        by_net: dict[int, list[int]] = {}
        for i, g in enumerate(games):
            _legal(g)
            by_net.setdefault(self.rating_for(g), []).append(i)
        out: list[Decision | None] = [None] * len(games)
        for rating, rows in sorted(by_net.items()):
            key = jax.random.fold_in(rng, rating)
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                res = self._searcher(rating).run(
                    [games[i] for i in chunk],
                    jax.random.fold_in(key, start),
                    deadline=deadline,
                    should_stop=should_stop,
                )
                for j, i in enumerate(chunk):
                    out[i] = _decision(games[i], res, j, rating)
        return out  # type: ignore[return-value]


def _legal(game: Game) -> np.ndarray:
    board = chess.Board()
    for uci in game.moves:
        board.push_uci(uci)
    ids = np.array([vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves], np.int32)
    if not ids.size:
        raise ValueError(f"maia: game {game.game_id or '?'} is over (no legal move)")
    return ids


def _decision(game: Game, res: SearchOutput, j: int, rating: int) -> Decision:
    """Row ``j`` of a search as a ``Decision`` (values turned to White's view)."""
    ids = np.flatnonzero(res.prior[j] > 0)
    white = len(game.moves) % 2 == 0
    value = float(res.search_value[j])
    sims = int(res.num_sims[j])
    return Decision(
        move=res.move[j],
        think_time_s=0.0,
        value=value if white else -value,
        resigned=bool(res.resign[j]),
        sims=sims,
        policy={
            vocab.MOVES[int(i)]: float(res.policy[j, i]) for i in ids if res.policy[j, i] > 1e-4
        },
        note=f"maia-{rating}",
        effective_lambda=float(res.effective_lambda[j]),
        path="search" if sims > 0 else "prior",
        search_value=value if sims > 0 else math.nan,
        visits={
            vocab.MOVES[int(i)]: int(res.visit_counts[j, i])
            for i in np.flatnonzero(res.visit_counts[j])
        },
    )


def maia_anchor_logits(maia: MaiaSet, games: Sequence[Game], elo: int | None = None) -> np.ndarray:
    """float32 ``[n, 1968]``: Maia's logits over the vocabulary (−1e9 off the legal moves) for the
    position at the end of each game, from the network nearest ``elo`` (None: the mover's rating).

    This is the human anchor for Allie's own search: ``Searcher.run(games, rng,
    anchor_logits=maia_anchor_logits(...))`` keeps Allie's prior in the tree and regularises the
    final policy towards Maia (piKL's prior ≠ anchor).
    """
    from allie_jax.baselines.eval_systems import mover_rating

    out = np.full((len(games), vocab.NUM_MOVES), -1e9, np.float32)
    by_net: dict[int, list[int]] = {}
    for i, g in enumerate(games):
        rating = elo if elo is not None else mover_rating(g, len(g.moves))
        by_net.setdefault(nearest_rating(rating, maia.ratings), []).append(i)
    for rating, rows in by_net.items():
        planes = np.stack([GameEncoder(games[i].moves).encode(len(games[i].moves)) for i in rows])
        pol, _ = maia.predictor(rating)(planes)
        for j, i in enumerate(rows):
            board = chess.Board()
            for uci in games[i].moves:
                board.push_uci(uci)
            for move in board.legal_moves:
                out[i, vocab.MOVE_TO_ID[move.uci()]] = pol[j, lc0_moves.lc0_move_index(board, move)]
    return out


class MaiaEngine(PlayerBase):
    """Maia as a ``player.Player`` for the match runner and the product's Python API.

    Each game is answered by the network nearest the mover's own header rating (the match writes
    the spec's Elo there, or the opponent's when the spec says ``auto``). Maia reads boards and
    loads its networks on first use: ``PlayerBase``'s defaults stand for the FEN history, the
    board model beside it, the warm-up and the fixed shapes.
    """

    modes = modes_for(think_time=False)  # Maia has no think-time head: no adaptive mode

    def __init__(self, maia_dir: str, **player_kwargs):
        self.maia_dir = maia_dir
        self.player_kwargs = player_kwargs
        self._players: dict[tuple, MaiaPlayer] = {}
        self._maia: MaiaSet | None = None  # ``predict``'s networks, loaded on first use

    def predict(
        self, games: Sequence[Game], *, start_fens: Sequence[str | None] | None = None
    ) -> list[Prediction]:
        """Maia's softmax over the legal moves and its W−L (White's view), each game from the
        network ``play`` would use (nearest the mover's own rating)."""
        if self._maia is None:
            self._maia = MaiaSet(self.maia_dir)
        maia = self._maia

        def own(g: Game) -> int:
            return nearest_rating(
                (g.white_elo if len(g.moves) % 2 == 0 else g.black_elo) or 1500, maia.ratings
            )

        return maia_predictions(maia, games, start_fens, own)

    def play(
        self,
        games: Sequence[Game],
        preset: str,
        rng,
        *,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        **overrides,
    ) -> list[Decision]:
        """The ``Player`` protocol: ``overrides`` are SearchConfig fields; ``deadline`` and
        ``should_stop`` are the caller's clock (``Allie.play``'s)."""
        key = (preset, tuple(sorted(overrides.items())))
        if key not in self._players:
            self._players[key] = MaiaPlayer(
                MaiaSpec(self.maia_dir, preset, 1500), overrides=overrides, **self.player_kwargs
            )
        player = self._players[key]
        key = rng if isinstance(rng, jax.Array) else jax.random.key(int(rng))
        out: list[Decision | None] = [None] * len(games)
        by_rating: dict[int, list[int]] = {}
        for i, g in enumerate(games):
            own = g.white_elo if len(g.moves) % 2 == 0 else g.black_elo
            by_rating.setdefault(nearest_rating(own or 1500, player.maia.ratings), []).append(i)
        for rating, rows in by_rating.items():
            player.spec = dataclasses.replace(player.spec, elo=rating)
            decisions = player.play(
                [games[i] for i in rows], key, deadline=deadline, should_stop=should_stop
            )
            for i, d in zip(rows, decisions, strict=True):
                out[i] = d
        return out  # type: ignore[return-value]


def maia_predictions(
    maia: MaiaSet,
    games: Sequence[Game],
    start_fens: Sequence[str | None] | None,
    rating_for: Callable[[Game], int],
) -> list[Prediction]:
    """Maia's softmax over the legal moves and its W−L (White's view) for each game (from
    ``start_fens[i]`` when given: the missing history is filled as lc0 does), each from the
    network ``rating_for(game)`` names; a game with no legal move gets its result as the value."""
    from allie_jax.baselines.eval_systems import vocab_policy

    fens = list(start_fens) if start_fens is not None else [None] * len(games)
    out: list[Prediction | None] = [None] * len(games)
    live: dict[int, list[int]] = {}
    boards: dict[int, chess.Board] = {}
    for i, g in enumerate(games):
        board = chess.Board(fens[i]) if fens[i] else chess.Board()
        for uci in g.moves:
            board.push_uci(uci)
        boards[i] = board
        if not any(board.legal_moves):
            out[i] = _terminal(board)
        else:
            live.setdefault(rating_for(g), []).append(i)
    for rating, rows in sorted(live.items()):
        encoders = []
        for i in rows:
            start = chess.Board(fens[i]) if fens[i] else None
            encoders.append(GameEncoder(games[i].moves, start))
        planes = np.stack(
            [e.encode(len(games[i].moves)) for e, i in zip(encoders, rows, strict=True)]
        )
        pol, wdl = maia.predictor(rating)(planes)
        for j, i in enumerate(rows):
            board, ply = boards[i], len(games[i].moves)
            ids = np.array([vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves], np.int32)
            black = board.turn == chess.BLACK
            probs = vocab_policy(pol[j], black, encoders[j].king_home[ply], ids)
            p = np.asarray(probs, np.float64)[ids]
            p = p / p.sum()
            value = float(wdl[j, 0] - wdl[j, 2])
            out[i] = Prediction(
                move_probs={vocab.MOVES[int(m)]: float(q) for m, q in zip(ids, p, strict=True)},
                think_time_s=0.0,
                value_white=value if not black else -value,
                resign=False,
            )
    return out  # type: ignore[return-value]


def _terminal(board: chess.Board) -> Prediction:
    """No legal move (mate or stalemate): the result as the value, no moves."""
    outcome = board.outcome(claim_draw=False)
    value = 0.0 if outcome is None or outcome.winner is None else (1.0 if outcome.winner else -1.0)
    return Prediction(move_probs={}, think_time_s=0.0, value_white=value, resign=False)
