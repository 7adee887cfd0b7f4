"""The inference API: one batched call answers "what would a human of this rating do here?".

``Allie.predict`` returns the model's raw beliefs (legal-move distribution, think time, value,
resignation); ``Allie.play`` turns them into a decision under a preset. Both take a batch of
games because every caller that matters (matches, bots serving many games) has several positions
waiting at once, and one batched model call costs about the same as a single one.

The search presets (``search``, ``adaptive``) go through ``allie_jax.search.Searcher``. The
policy and greedy presets need no tree, so they are answered here from one jitted forward pass
with python-chess's legal moves: the same distribution as the Searcher's budget-0 path (a test
compares them) without compiling the tree search. The direct path also serves what the Searcher
cannot take: games from a FEN (it replays from the standard start inside jit), games longer than
the model's context, and positions with a claimable draw; a search preset falling back to the
policy there is flagged in ``Decision.note``.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import chess
import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import vocab
from allie_jax.game import Game, denormalize_think_time, header_tokens

PRESETS = ("policy", "greedy", "search", "adaptive")
GREEDY_ELO = 2500  # the paper's Allie-Greedy plays argmax conditioned on a 2,500 rating
MAX_THINK_S = 200.0  # the Searcher's clip of the predicted think time (SPEC §4)
RESIGN_VALUE = -0.9  # resign only when the mover's value is below this (SPEC §4)
_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The model's view of the position after ``game.moves``.

    ``move_probs`` is the softmax over legal moves only; ``resign`` is the paper's rule (the
    termination token's logit beats every legal move and the mover's value is below −0.9).
    """

    move_probs: dict[str, float]
    think_time_s: float
    value_white: float
    resign: bool


@dataclasses.dataclass(frozen=True)
class Decision:
    """A move chosen under a preset. ``value`` is from White's view, like ``value_white``."""

    move: str
    think_time_s: float
    value: float
    resigned: bool
    sims: int
    policy: dict[str, float]
    note: str = ""


def _side_to_move_value(value_white: float, board: chess.Board) -> float:
    return value_white if board.turn == chess.WHITE else -value_white


def replay_boards(
    games: Sequence[Game], start_fens: Sequence[str | None] | None
) -> list[chess.Board]:
    """One board per game (``start_fens`` optional, one per game), via ``replay_board``."""
    fens = list(start_fens) if start_fens is not None else [None] * len(games)
    if len(fens) != len(games):
        raise ValueError(f"start_fens has {len(fens)} entries for {len(games)} games")
    return [replay_board(g, f) for g, f in zip(games, fens, strict=True)]


def replay_board(game: Game, start_fen: str | None = None) -> chess.Board:
    """The board after the game's moves, raising ValueError naming the first illegal move."""
    board = chess.Board(start_fen) if start_fen else chess.Board()
    for ply, uci in enumerate(game.moves):
        try:
            move = chess.Move.from_uci(uci)
        except ValueError:
            raise ValueError(f"game move {ply + 1} {uci!r} is not a UCI move") from None
        if move not in board.legal_moves:
            raise ValueError(f"game move {ply + 1} {uci!r} is illegal in {board.fen()}")
        board.push(move)
    return board


def game_tokens(game: Game, max_len: int = vocab.MAX_SEQ_LEN) -> np.ndarray:
    """Header and moves of a game in progress; long games keep the header and the latest moves.

    Keeping the header in front of the most recent moves is how the data pipeline continues a
    long game in later windows, so the model has seen exactly this layout in training.
    """
    head = header_tokens(game.white_elo, game.black_elo, game.time_control)
    moves = [vocab.encode_move(m) for m in game.moves]
    room = max_len - len(head)
    if len(moves) > room:
        moves = moves[len(moves) - room :]
    return np.asarray(head + moves, dtype=np.int32)


def _bucket(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return buckets[-1]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def as_jax_key(rng: Any) -> jax.Array:
    """Accept an int seed, a numpy Generator or a jax key; the Searcher wants a jax key."""
    if rng is None:
        rng = 0
    if isinstance(rng, (int, np.integer)):
        return jax.random.key(int(rng))
    if isinstance(rng, np.random.Generator):
        return jax.random.key(int(rng.integers(0, 2**31 - 1)))
    return rng


def _numpy_rng(key: jax.Array) -> np.random.Generator:
    return np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))


class _Forward:
    """A jitted forward that returns only the last real position of each row.

    Rows are right-padded (causal attention never looks right, so padding cannot change the last
    real position) and the shapes are bucketed, so a match compiles a handful of programs.
    """

    def __init__(self, model: Any) -> None:
        from flax import nnx

        self.max_len = min(
            vocab.MAX_SEQ_LEN, getattr(getattr(model, "config", None), "max_len", 512)
        )
        graphdef, state = nnx.split(model)
        self._state = state

        @jax.jit
        def fwd(state, tokens, last):
            out = nnx.merge(graphdef, state)(tokens, deterministic=True)
            rows = jnp.arange(tokens.shape[0])
            return (
                out.policy_logits[rows, last].astype(jnp.float32),
                out.time[rows, last].astype(jnp.float32),
                out.value[rows, last].astype(jnp.float32),
            )

        self._fwd = fwd

    def __call__(self, rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(rows)
        length = _bucket(
            max(len(r) for r in rows),
            tuple(b for b in _LENGTH_BUCKETS if b < self.max_len) + (self.max_len,),
        )
        batch = _pow2(n)
        tokens = np.full((batch, length), vocab.PAD, dtype=np.int32)
        last = np.zeros(batch, dtype=np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
            last[i] = len(r) - 1
        logits, time, value = self._fwd(self._state, jnp.asarray(tokens), jnp.asarray(last))
        return np.asarray(logits)[:n], np.asarray(time)[:n], np.asarray(value)[:n]


class Allie:
    """A loaded model plus the machinery to answer batches of games."""

    def __init__(self, model: Any, *, searcher_factory: Any = None) -> None:
        self.model = model
        self._forward = _Forward(model)
        self._searcher_factory = searcher_factory
        self._searchers: dict[Any, Any] = {}

    @classmethod
    def load(cls, checkpoint: str | pathlib.Path) -> Allie:
        """Load a checkpoint directory (``config.json`` + ``params``) or a training workdir."""
        from allie_jax.model.checkpoint import load_model

        path = pathlib.Path(checkpoint)
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
        return cls(load_model(path))

    # ------------------------------------------------------------------ predict

    def _raw(self, games: Sequence[Game], boards: Sequence[chess.Board]):
        rows = [game_tokens(g, self._forward.max_len) for g in games]
        logits, time, value = self._forward(rows)
        return logits, time, value

    def predict(
        self, games: Sequence[Game], *, start_fens: Sequence[str | None] | None = None
    ) -> list[Prediction]:
        """The model's legal-move distribution, think time, value and resignation, per game.

        ``start_fens[i]`` (optional) is the position game i's moves start from (the UCI engine's
        ``position fen``); the default is the standard start.
        """
        games = list(games)
        if not games:
            return []
        boards = replay_boards(games, start_fens)
        logits, time, value = self._raw(games, boards)
        out = []
        for i, board in enumerate(boards):
            probs, ids = _legal_softmax(logits[i], board, 1.0)
            legal_max = float(logits[i, ids].max()) if len(ids) else -np.inf
            v = float(value[i])
            resign = bool(
                logits[i, vocab.TERMINATION] > legal_max
                and _side_to_move_value(v, board) < RESIGN_VALUE
            )
            out.append(
                Prediction(
                    move_probs={vocab.MOVES[j]: float(p) for j, p in zip(ids, probs, strict=True)},
                    think_time_s=float(np.clip(denormalize_think_time(time[i]), 0.0, MAX_THINK_S)),
                    value_white=v,
                    resign=resign,
                )
            )
        return out

    # ------------------------------------------------------------------ play

    def _searcher(self, config: Any) -> Any:
        key = repr(config)
        if key not in self._searchers:
            factory = self._searcher_factory
            if factory is None:
                from allie_jax.search import Searcher

                factory = Searcher
            self._searchers[key] = factory(self.model, config)
        return self._searchers[key]

    def play(
        self,
        games: Sequence[Game],
        preset: str | Any = "policy",
        rng: Any = 0,
        *,
        start_fens: Sequence[str | None] | None = None,
        **overrides: Any,
    ) -> list[Decision]:
        """Choose a move for each game under a preset name or a ``SearchConfig``.

        ``overrides`` adjust the preset's SearchConfig fields (``mean_sims``, ``temperature``, ...).
        The games' Elo headers are used as given: the caller decides whose rating conditions the
        policy (Allie-Policy plays at the opponent's rating; greedy uses the preset's 2,500).
        """
        games = list(games)
        if not games:
            return []
        boards = replay_boards(games, start_fens)
        for i, b in enumerate(boards):
            if b.is_game_over(claim_draw=False) or not any(True for _ in b.legal_moves):
                raise ValueError(f"game {i} is over ({b.result()}): no move to play")
        config = make_config(preset, **overrides)
        key_search, key_direct = jax.random.split(as_jax_key(rng))
        # The Searcher replays from the standard start inside jit and reads at most max_len
        # tokens; FEN starts, over-long games and claimable draws are answered directly.
        fens = list(start_fens) if start_fens is not None else [None] * len(games)
        why = [self._direct_reason(g, f, b) for g, f, b in zip(games, fens, boards, strict=True)]
        decisions: list[Decision | None] = [None] * len(games)
        std = [i for i, w in enumerate(why) if not w]
        if std:
            try:
                searched = self._search_or_direct([games[i] for i in std], config, key_search)
            except ValueError as exc:  # a position the Searcher refuses: never lose the move
                why = [w or f"(search refused: {exc})" for w in why]
            else:
                for i, d in zip(std, searched, strict=True):
                    decisions[i] = d
        for reason in sorted({w for i, w in enumerate(why) if decisions[i] is None}):
            idx = [i for i, w in enumerate(why) if w == reason and decisions[i] is None]
            direct = self._direct(
                [games[i] for i in idx], [boards[i] for i in idx], config, key_direct, reason
            )
            for i, d in zip(idx, direct, strict=True):
                decisions[i] = d
        return decisions  # type: ignore[return-value]

    def _direct_reason(self, game: Game, fen: str | None, board: chess.Board) -> str:
        if fen is not None:
            return "from a FEN"
        if len(game.moves) + 3 > self._forward.max_len:
            return "beyond the model's context"
        if board.is_repetition(3) or board.is_fifty_moves():
            return "in a claimable draw"
        return ""

    def _search_or_direct(self, games: list[Game], config: Any, key: jax.Array) -> list[Decision]:
        mode = _get(config, "mode", "policy")
        no_search = not _search_available() and self._searcher_factory is None
        if mode in ("policy", "greedy") or no_search:
            # No tree: one jitted forward pass gives the same distribution as the Searcher's
            # budget-0 path, without compiling the tree search (tests/test_engine_api.py checks).
            boards = [replay_board(g) for g in games]
            return self._direct(games, boards, config, key, "(no allie_jax.search)")
        out = self._searcher(config).run(games, key)
        decisions = []
        for i in range(len(games)):
            pol = np.asarray(out.policy[i])
            ids = np.nonzero(pol > 0)[0]
            decisions.append(
                Decision(
                    move=str(out.move[i]),
                    think_time_s=float(out.think_time_s[i]),
                    value=float(out.value_white[i]),
                    resigned=bool(out.resign[i]),
                    sims=int(out.num_sims[i]),
                    policy={vocab.MOVES[j]: float(pol[j]) for j in ids},
                )
            )
        return decisions

    def _direct(
        self,
        games: list[Game],
        boards: list[chess.Board],
        config: Any,
        key: jax.Array,
        why: str = "from a FEN",
    ) -> list[Decision]:
        """Policy / greedy from one forward pass, with python-chess's legal moves."""
        mode = _get(config, "mode", "policy")
        temperature = float(_get(config, "temperature", 1.0))
        greedy_elo = int(_get(config, "greedy_elo", GREEDY_ELO))
        max_think = float(_get(config, "max_think_time", MAX_THINK_S))
        argmax = mode == "greedy" or _get(config, "sampling", None) == "argmax"
        if mode == "greedy":  # both header Elos, as the Searcher's greedy preset
            games = [
                dataclasses.replace(g, white_elo=greedy_elo, black_elo=greedy_elo) for g in games
            ]
        logits, time, value = self._raw(games, boards)
        gen = _numpy_rng(key)
        note = "" if mode in ("policy", "greedy") else f"{mode} unavailable {why}: policy used"
        out = []
        for i, board in enumerate(boards):
            probs, ids = _legal_softmax(logits[i], board, 1.0)
            if argmax or temperature <= 0:
                choice = int(np.argmax(probs))
            else:
                tprobs, _ = _legal_softmax(logits[i], board, temperature)
                choice = int(gen.choice(len(ids), p=tprobs))
            v = float(value[i])
            legal_max = float(logits[i, ids].max())
            resign = bool(
                _get(config, "resign", True)
                and logits[i, vocab.TERMINATION] > legal_max
                and _side_to_move_value(v, board)
                < float(_get(config, "resign_value", RESIGN_VALUE))
            )
            out.append(
                Decision(
                    move=vocab.MOVES[ids[choice]],
                    think_time_s=float(np.clip(denormalize_think_time(time[i]), 0.0, max_think)),
                    value=v,
                    resigned=resign,
                    sims=0,
                    policy={vocab.MOVES[j]: float(p) for j, p in zip(ids, probs, strict=True)},
                    note=note,
                )
            )
        return out


def _legal_softmax(
    logits: np.ndarray, board: chess.Board, temperature: float
) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(sorted(vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves), dtype=np.int64)
    if len(ids) == 0:
        return np.zeros(0), ids
    x = logits[ids].astype(np.float64) / max(temperature, 1e-6)
    x = np.exp(x - x.max())
    return x / x.sum(), ids


def _get(config: Any, name: str, default: Any) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


@functools.cache
def _search_available() -> bool:
    try:
        from allie_jax.search import SearchConfig, Searcher  # noqa: F401
    except ImportError:
        return False
    return True


def make_config(preset: str | Any, **overrides: Any) -> Any:
    """A SearchConfig for a preset name (or the config itself), with field overrides.

    Without ``allie_jax.search`` the config is a plain dict of the same fields, which the direct
    policy / greedy path understands.
    """
    if not isinstance(preset, str):
        return dataclasses.replace(preset, **overrides) if overrides else preset
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {', '.join(PRESETS)}")
    fields: dict[str, Any] = {"mode": preset, **overrides}
    if _search_available():
        from allie_jax.search import SearchConfig

        known = {f.name for f in dataclasses.fields(SearchConfig)}
        unknown = set(fields) - known
        if unknown:
            raise ValueError(f"SearchConfig has no field(s) {sorted(unknown)}")
        return SearchConfig(**fields)
    return dict(fields)
