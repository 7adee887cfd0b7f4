"""The inference API: one batched call answers "what would a human of this rating do here?".

``Allie.predict`` returns the model's raw beliefs (legal-move distribution, think time, value,
resignation); ``Allie.play`` turns them into a decision under a preset. Both take a batch of
games because every caller that matters (matches, bots serving many games) has several positions
waiting at once, and one batched model call costs about the same as a single one.

Every preset goes through ``allie_jax.search.Searcher`` (``policy`` and ``greedy`` are its
budget-0 path), so one rule (``allie_jax.search.decision``) picks every move and decides every
resignation. What the Searcher cannot take (it replays from the standard start inside jit and
reads at most the model's context) is answered from one forward pass with python-chess's legal
moves and the same rule: games longer than the context and positions with a claimable draw; a
search preset falling back to the policy there is flagged in ``Decision.note``.

The model reads the game, not the board. A game that starts from a FEN is first given a history
(``engine.fen_history``: a legal move sequence from the standard start reaching that position
exactly), and played from it like any other game; where none is found, a board-reading model the
caller set as ``fen_model`` answers, and without one the move is the fallback (``path``
"fallback", with a note saying why) rather than a search on a position the model misreads.

``Decision.path`` names what decided each move: "search" (simulations ran), "prior" (the
model's policy alone, as the preset asked or with no simulation run) or "fallback" (a caller out
of time answered from the root prior, ``Allie.root_prior``, or the position could not be read).

A clock reaches the search through ``play(..., deadline=, should_stop=)``: the search then runs
in chunks and stops with what it has. ``warmup`` compiles every shape a caller (the UCI engine,
batch 1) can meet, so no move ever waits for the compiler.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import math
import os
import pathlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import chess
import jax
import jax.numpy as jnp
import numpy as np

from allie_jax import aot, player, vocab
from allie_jax.game import Game, denormalize_think_time, header_tokens
from allie_jax.search import decision
from allie_jax.search.config import MODES, SearchConfig, check_fields
from allie_jax.search.decision import as_jax_key

log = logging.getLogger(__name__)
PRESETS = MODES  # the SearchConfig modes, one name per preset
# Leaves per search step of the engine's one game (``leaf_batch``) when its caller names none:
# ``launch.uci`` passes it to ``Allie`` (the UCI ``LeafBatch`` default). K > 1 makes a step's
# model call read the weights once for K leaves; picked by the batch-1 benchmark
# (bench/RESULTS.md). Batches of many games keep SearchConfig's 1.
PLAY_LEAF_BATCH = 16
_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
# fixed shapes: the direct pass and the root prior pad to one of these or the whole context (a
# long game's prior on a 1024-token model must not cost a 1024-token forward on a short clock)
_ENGINE_LENGTHS = (64, 128, 256)


Prediction = player.Prediction  # the one Prediction type (allie_jax/player.py)
Decision = player.Decision  # the one Decision type (allie_jax/player.py)


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


@functools.partial(aot.jit, static_argnames=("graphdef",))
def _last_position(graphdef, state, tokens, last):
    """Policy logits, think time and value at each row's last real position (float32)."""
    from flax import nnx

    out = nnx.merge(graphdef, state)(tokens, deterministic=True)
    rows = jnp.arange(tokens.shape[0])
    return (
        out.policy_logits[rows, last].astype(jnp.float32),
        out.time[rows, last].astype(jnp.float32),
        out.value[rows, last].astype(jnp.float32),
    )


class _Forward:
    """A jitted forward that returns only the last real position of each row.

    Rows are right-padded (causal attention never looks right, so padding cannot change the last
    real position) and the shapes are bucketed, so a match compiles a handful of programs.
    """

    reads_boards = False  # the decoder reads the game's tokens (``raw`` ignores the boards)

    def __init__(self, model: Any) -> None:
        from flax import nnx

        self.max_len = min(vocab.MAX_SEQ_LEN, model.config.max_len)
        self.lengths = tuple(b for b in _LENGTH_BUCKETS if b < self.max_len) + (self.max_len,)
        self._graphdef, self._state = nnx.split(model)

    def __call__(self, rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(rows)
        length = decision.bucket(max(len(r) for r in rows), self.lengths)
        batch = decision.next_pow2(n)
        tokens = np.full((batch, length), vocab.PAD, dtype=np.int32)
        last = np.zeros(batch, dtype=np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
            last[i] = len(r) - 1
        logits, time, value = _last_position(
            self._graphdef, self._state, jnp.asarray(tokens), jnp.asarray(last)
        )
        return np.asarray(logits)[:n], np.asarray(time)[:n], np.asarray(value)[:n]

    def raw(
        self, games: Sequence[Game], boards: Sequence[chess.Board]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Logits over the vocabulary, think time and value at each game's last position, from
        the games' tokens (``BoardForward.raw`` reads the boards instead)."""
        del boards
        return self([game_tokens(g, self.max_len) for g in games])

    def fix_shapes(self) -> None:
        """Pad to ``_ENGINE_LENGTHS`` or the whole context only (a closed set to compile)."""
        self.lengths = tuple(b for b in _ENGINE_LENGTHS if b < self.max_len) + (self.max_len,)


class Allie(player.PlayerBase):
    """A loaded model plus the machinery to answer batches of games (a ``player.Player``).

    ``fixed_shapes`` (set by ``warmup``) makes every Searcher compile a closed set of shapes
    (see ``Searcher``), which ``warmup`` then compiles ahead of the first move.
    """

    def __init__(
        self,
        model: Any,
        *,
        searcher_factory: Any = None,
        fixed_shapes: bool = False,
        defer_long_shapes: bool = False,
        leaf_batch: int | None = None,
    ) -> None:
        from allie_jax.engine import board as board_engine

        if board_engine.is_board_model(model):  # the board-state family (engine/board.py)
            self._forward = board_engine.BoardForward(model)
            searcher_factory = searcher_factory or board_engine.BoardSearcher
        else:
            from allie_jax.model.checkpoint import with_layer_layout

            # The search and the cache read one layer at a time: a scanned (training) layout
            # would slice every stacked weight per layer per step, so play unrolled.
            model = with_layer_layout(model, scan_layers=False)
            self._forward = _Forward(model)
        self.model = model
        self._searcher_factory = searcher_factory
        self._searchers: dict[Any, Any] = {}
        self._priors: collections.OrderedDict[Any, Prediction] = collections.OrderedDict()
        self.fixed_shapes = fixed_shapes
        # a player that reads boards (Maia, the board family), for positions given as a FEN
        # with no history this model can read
        self.fen_model: player.Player | None = None
        # ``warmup`` returns once the shapes of games up to the shortest cache width are
        # compiled, and compiles those only long games meet in a background thread
        # (``long_warmup``): a GUI waits for ``readyok``, a game reaches ~120 plies much later
        self.defer_long_shapes = defer_long_shapes
        # the ``leaf_batch`` of searches whose caller sets none (None: SearchConfig's); the
        # decoder only: the board family's small model gains nothing from several leaves
        self.leaf_batch = None if searcher_factory is not None else leaf_batch
        self.long_warmup: threading.Thread | None = None
        # where the model came from (``load``): the executable store's read-ahead record of
        # what ``warmup`` used is kept under it (``aot.ExecutableStore.preload``)
        self.source: str | None = None
        if fixed_shapes:
            self._forward.fix_shapes()

    @classmethod
    def load(cls, checkpoint: str | pathlib.Path, *, model: Any = None, **kwargs: Any) -> Allie:
        """Load a checkpoint directory (``config.json`` + ``params``) or a training workdir.

        ``model``: that checkpoint's model, already read by the caller (``launch.uci`` reads
        the weights in a thread while this module imports)."""
        from etils import epath

        from allie_jax.model.checkpoint import load_model

        path = epath.Path(checkpoint)
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
        # the executables this model's last launches used load (in background threads) while
        # its weights are read (a no-op when the caller already started them)
        aot.preload(checkpoint)
        allie = cls(load_model(path) if model is None else model, **kwargs)
        allie.source = aot.source_tag(checkpoint)
        return allie

    @classmethod
    def from_released(
        cls, output: str | pathlib.Path | None = None, *, sha256: str | None = None, **kwargs: Any
    ) -> Allie:
        """The released Allie from the Hugging Face Hub, checked and converted once (cached):
        ``allie_jax.weights.fetch_released_allie(output, sha256=..., **fetch options)``; the
        options ``Allie.load`` takes (``fixed_shapes``, ...) pass through."""
        from allie_jax import weights

        names = (
            "repo_id",
            "filename",
            "repo_type",
            "revision",
            "cache_dir",
            "token",
            "size",
            "log",
        )
        fetch = {k: kwargs.pop(k) for k in names if k in kwargs}
        return cls.load(weights.fetch_released_allie(output, sha256=sha256, **fetch), **kwargs)

    def fix_shapes(self) -> None:
        """From now on run the closed set of shapes ``warmup`` compiles (``Searcher``'s
        ``fixed_shapes``: two cache widths, one tree size per preset), not shapes that follow
        each batch: a game whose prefix grows would otherwise compile the search again at every
        cache width."""
        if not self.fixed_shapes:
            self.fixed_shapes = True
            self._searchers.clear()
            self._forward.fix_shapes()

    def warmup(
        self, preset: str | SearchConfig = "adaptive", batch_size: int = 1, **overrides
    ) -> int:
        """Compile every shape a batch of ``batch_size`` games under this preset can meet.

        Switches this Allie to fixed shapes first (the set is then closed: see ``Searcher``),
        then compiles the Searcher's pieces (chunked, as a caller with a clock runs them) and the
        direct pass of the fallback positions. Returns the number of compiled calls made. With
        JAX's persistent compilation cache on (``allie_jax.engine.compile_cache``), a second
        process loads these instead of compiling them. With ``defer_long_shapes`` it returns once
        the shapes of games within the shortest cache width are compiled; those of longer games
        (the wider cache, the direct pass over the whole context) compile in the background
        thread ``long_warmup``, started here. A warm start (the executable store is reading
        ahead what this model's last launches used: ``aot.preload``) defers them the same way:
        there they only load (about a second of CPU, at the lowest priority, done long before
        a game reaches ~120 plies), which is ~40% of what a warm ``readyok`` would otherwise
        wait for.
        """
        with aot.compile_only():  # synthetic inputs: their executables matter, not outputs
            return self._warmup(preset, batch_size, overrides)

    def _warmup(self, preset: str | SearchConfig, batch_size: int, overrides: dict) -> int:
        self.fix_shapes()
        config = self._config(preset, overrides)
        _play_keys(0)
        calls = 1
        searcher = self._searcher(config)
        roots = searcher.roots
        long_widths: tuple[int, ...] = ()
        lengths = self._forward.lengths
        store = aot.active_store()
        # only the decoder's roots (``prefill.DecoderRoots``) compile per cache width; a game
        # within the shortest width meets neither the wider ones nor the longest direct pass
        if not self.reads_boards:
            max_len = self.model.config.max_len
            widths = tuple(w for w in roots.replay_widths() if w <= max_len)
            long_widths = widths[1:]
            lengths = lengths[:-1] if len(lengths) > 1 else lengths
            roots.warm_widths = widths[:1]
        try:
            calls += searcher.warmup(batch_size)
        finally:
            if long_widths:
                roots.warm_widths = None
        batch = decision.next_pow2(batch_size)
        for length in lengths:
            self._warm_forward(length, batch, config)
            calls += 2
        # the root prior's few eager ops (``predict``), so the first move's prior compiles none
        self.predict([Game(moves=["e2e4"], white_elo=1500, black_elo=1500)] * batch_size)
        rest = self._forward.lengths[len(lengths) :]
        defer = self.defer_long_shapes or (store is not None and store.reading_ahead)
        if (long_widths or rest) and defer:
            self.long_warmup = threading.Thread(
                target=self._warm_long,
                args=(config, batch_size, long_widths, rest),
                name="allie-warm-long",
                daemon=True,
            )
            self.long_warmup.start()
        elif long_widths or rest:
            with _later(store):
                calls += self._warm_long_shapes(config, batch_size, long_widths, rest)
        if store is not None and self.source is not None:
            store.save_manifest(self.source)  # the next launch reads these ahead
        return calls + 1

    def _config(self, preset: str | SearchConfig, overrides: dict[str, Any]) -> SearchConfig:
        """``make_config``, with this Allie's ``leaf_batch`` where a preset name sets none."""
        if self.leaf_batch is not None and isinstance(preset, str):
            overrides = {"leaf_batch": self.leaf_batch, **overrides}
        return make_config(preset, **overrides)

    def _warm_forward(self, length: int, batch: int, config: SearchConfig) -> None:
        """The direct pass at one padded length and the policy step after it."""
        rows = [np.zeros(length, np.int32)] * batch
        logits, _, value = self._forward(rows)
        legal = np.zeros((batch, vocab.NUM_MOVES), bool)
        legal[:, 0] = True
        decision.policy_step_jit(
            logits, legal, value, np.zeros(batch, bool), as_jax_key(0), config=config
        )

    def _warm_long(
        self, config: SearchConfig, batch_size: int, widths: tuple[int, ...], lengths: tuple
    ) -> None:
        """``warmup``'s deferred part, at the lowest CPU priority (this thread only), on a
        Searcher of its own (its roots' cache is not the one moves use meanwhile). A failure
        here only means a long game's first move compiles what it needs."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        store = aot.active_store()
        try:
            with aot.compile_only(), _later(store):
                self._warm_long_shapes(config, batch_size, widths, lengths)
        except Exception:  # noqa: BLE001 - a background compile must never end the engine
            log.warning("warm-up of long games' shapes failed", exc_info=True)
        if store is not None and self.source is not None:
            store.save_manifest(self.source)  # what it compiled, for the next launch

    def _warm_long_shapes(
        self, config: SearchConfig, batch_size: int, widths: tuple[int, ...], lengths: tuple
    ) -> int:
        """The shapes only games past the shortest cache width meet; returns the calls made."""
        calls = 0
        if widths:
            searcher = self._new_searcher(config)
            searcher.roots.warm_widths = widths
            calls += searcher.warmup(batch_size)
        batch = decision.next_pow2(batch_size)
        for length in lengths:
            self._warm_forward(length, batch, config)
            calls += 2
        return calls

    @property
    def search_stats(self) -> collections.Counter:
        """``prefill_tokens``, ``simulations``, ``positions`` summed over this Allie's Searchers
        (a move that reuses its game's KV cache adds only the new plies' tokens)."""
        total: collections.Counter = collections.Counter()
        for searcher in self._searchers.values():
            total.update(searcher.stats)
        return total

    # ------------------------------------------------------------------ predict

    def _raw(self, games: Sequence[Game], boards: Sequence[chess.Board]):
        return self._forward.raw(games, boards)

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
        defaults = SearchConfig()
        legal = _legal_masks(boards)
        value_stm = np.array(
            [_side_to_move_value(float(v), b) for v, b in zip(value, boards, strict=True)]
        )
        resign = np.asarray(decision.resign_flags(logits, legal, value_stm, defaults))
        out = []
        for i, board in enumerate(boards):
            probs, ids = _legal_softmax(logits[i], board, 1.0)
            out.append(
                Prediction(
                    move_probs={vocab.MOVES[j]: float(p) for j, p in zip(ids, probs, strict=True)},
                    think_time_s=float(
                        np.clip(denormalize_think_time(time[i]), 0.0, defaults.max_think_time)
                    ),
                    value_white=float(value[i]),
                    resign=bool(resign[i]),
                )
            )
        return out

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes this model plays (``allie_jax.modes``): the board family has no think-time
        head, so no adaptive mode."""
        from allie_jax.modes import modes_for

        return modes_for(think_time=not self.reads_boards)

    @property
    def reads_boards(self) -> bool:
        """True for the board family: it reads the position itself, so any FEN is fine."""
        return self._forward.reads_boards

    def root_prior(self, game: Game, start_fen: str | None = None) -> Prediction:
        """The model's policy, think time and value at the game's root: one forward, cached.

        A caller with a clock computes this first, so that whatever happens to the search it
        has the model's own choice to play (``fallback_decision``).
        """
        key = (game.white_elo, game.black_elo, game.time_control, tuple(game.moves), start_fen)
        hit = self._priors.get(key)
        if hit is None:
            hit = self.predict([game], start_fens=[start_fen])[0]
            self._priors[key] = hit
            while len(self._priors) > 256:
                self._priors.popitem(last=False)
        self._priors.move_to_end(key)
        return hit

    def history_for(self, game: Game, start_fen: str | None, **limits: Any) -> tuple[Game, str]:
        """``game`` rewritten to start from the standard position when a history reaching
        ``start_fen`` is found (``fen_history.find_history``), and a line saying what happened;
        unchanged (with the reason) when none is."""
        from allie_jax.engine import fen_history

        if start_fen is None:
            return game, ""
        found = fen_history.find_history(start_fen, **limits)
        if not found.found:
            return game, found.why
        moves = list(found.moves or ()) + list(game.moves)
        note = f"history of {len(found.moves or ())} plies from the standard start to the FEN"
        return dataclasses.replace(game, moves=moves), note

    # ------------------------------------------------------------------ play

    def _searcher(self, config: Any) -> Any:
        key = repr(config)
        if key not in self._searchers:
            self._searchers[key] = self._new_searcher(config)
        return self._searchers[key]

    def _new_searcher(self, config: Any) -> Any:
        """A Searcher of this model's family (its ``searcher_factory``, the decoder's by default)
        with this Allie's ``fixed_shapes``: the closed shape set ``warmup`` compiles holds for
        every family (the board family's roots then replay at two widths, not seven)."""
        factory = self._searcher_factory
        if factory is None:
            from allie_jax.search import Searcher

            factory = Searcher
        return factory(self.model, config, fixed_shapes=self.fixed_shapes)

    def play(
        self,
        games: Sequence[Game],
        preset: str | Any = "policy",
        rng: Any = 0,
        *,
        start_fens: Sequence[str | None] | None = None,
        deadline: float | None = None,
        should_stop: Callable[[], bool] | None = None,
        budgets: Sequence[int] | None = None,
        progress: Callable[[int, list[str]], None] | None = None,
        find_histories: bool = True,
        **overrides: Any,
    ) -> list[Decision]:
        """Choose a move for each game under a preset name or a ``SearchConfig``.

        ``overrides`` adjust the preset's SearchConfig fields (``mean_sims``, ``temperature``, ...).
        The games' Elo headers are used as given: the caller decides whose rating conditions the
        policy (Allie-Policy plays at the opponent's rating; greedy uses the preset's 2,500).
        Give every live game a ``game_id``: the Searcher then keeps its KV cache between moves
        and a move costs only the plies added since the last one.

        ``deadline`` (a ``time.monotonic()`` instant) and ``should_stop`` (polled) let a clock
        cut the search short: it runs in chunks and plays from the simulations it has.
        ``budgets`` (one per game) replaces the preset's budget rule; ``progress(sims, moves)``
        hears each chunk's most visited moves (of the searched games, in their order).
        ``find_histories=False``: a caller that already looked for the FENs' histories (and
        passes the games it found one for from the standard start) skips the search for them.
        """
        games = list(games)
        if not games:
            return []
        boards = replay_boards(games, start_fens)
        for i, b in enumerate(boards):
            if b.is_game_over(claim_draw=False) or not any(True for _ in b.legal_moves):
                raise ValueError(f"game {i} is over ({b.result()}): no move to play")
        config = self._config(preset, overrides)
        if config.searches:
            # a mode this family cannot search (the board model under ``adaptive``: no think
            # time) is the caller's error, raised naming the mode, not a silent policy move
            self._searcher(config)
        if budgets is not None and len(budgets) != len(games):
            raise ValueError(f"budgets has {len(budgets)} entries for {len(games)} games")
        key_search, key_direct = _play_keys(rng)
        fens = list(start_fens) if start_fens is not None else [None] * len(games)
        decisions: list[Decision | None] = [None] * len(games)
        notes = [""] * len(games)
        unread: dict[int, str] = {}
        for i, fen in enumerate(fens):
            if fen is None or self.reads_boards:
                continue
            if not find_histories:
                unread[i] = "no history found for it"
                continue
            games[i], notes[i] = self.history_for(games[i], fen)
            if notes[i].startswith("history of"):
                fens[i] = None
            else:
                unread[i] = notes[i]
        if unread:
            for i, d in self._unread(games, boards, fens, unread, preset, rng, config).items():
                decisions[i] = d
        why = [
            "(read elsewhere)" if decisions[i] is not None else self._direct_reason(g, f, b)
            for i, (g, f, b) in enumerate(zip(games, fens, boards, strict=True))
        ]
        std = [i for i, w in enumerate(why) if not w]
        if std:
            try:
                searched = self._search(
                    [games[i] for i in std],
                    config,
                    key_search,
                    deadline=deadline,
                    should_stop=should_stop,
                    budgets=None if budgets is None else [budgets[i] for i in std],
                    progress=progress,
                )
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
        for i, note in enumerate(notes):
            d = decisions[i]
            if note and d is not None and i not in unread:
                decisions[i] = dataclasses.replace(
                    d, note="; ".join(x for x in (note, d.note) if x)
                )
        return decisions  # type: ignore[return-value]

    def _unread(
        self,
        games: list[Game],
        boards: list[chess.Board],
        fens: list[str | None],
        unread: dict[int, str],
        preset: Any,
        rng: Any,
        config: SearchConfig,
    ) -> dict[int, Decision]:
        """Games from a FEN with no history found: the ``fen_model`` reads them, else the
        fallback (the model's prior, which reads only the moves after the FEN), flagged."""
        idx = sorted(unread)
        out: dict[int, Decision] = {}
        if self.fen_model is not None:
            mode = preset if isinstance(preset, str) else config.mode
            played = self.fen_model.play(
                [games[i] for i in idx], mode, rng, start_fens=[fens[i] for i in idx]
            )
            for i, d in zip(idx, played, strict=True):
                note = f"no history for the FEN ({unread[i]}): the board model decided"
                out[i] = dataclasses.replace(d, note="; ".join(x for x in (note, d.note) if x))
            return out
        _, key = _play_keys(rng)
        direct = self._direct([games[i] for i in idx], [boards[i] for i in idx], config, key)
        for i, d in zip(idx, direct, strict=True):
            note = (
                f"no history for the FEN ({unread[i]}) and no board model (--fen_model): "
                "fallback: the model's prior from the moves after the FEN, a position it "
                "cannot read"
            )
            out[i] = dataclasses.replace(d, note=note, path="fallback")
        return out

    def _direct_reason(self, game: Game, fen: str | None, board: chess.Board) -> str:
        if fen is not None and not self.reads_boards:
            return "from a FEN"
        if len(game.moves) + 3 > self._forward.max_len:
            return "beyond the model's context"
        if board.is_repetition(3) or board.is_fifty_moves():
            return "in a claimable draw"
        return ""

    def _search(
        self, games: list[Game], config: Any, key: jax.Array, **clock: Any
    ) -> list[Decision]:
        searcher = self._searcher(config)
        for name in ("budgets", "progress"):
            if clock.get(name) is None:
                clock.pop(name, None)
        out = searcher.run(games, key, **clock)
        lam = out.effective_lambda  # None: the search reports no λ
        decisions = []
        for i in range(len(games)):
            pol = np.asarray(out.policy[i])
            ids = np.nonzero(pol > 0)[0]
            row = np.asarray(out.visit_counts[i])
            visits = {vocab.MOVES[j]: int(row[j]) for j in np.nonzero(row > 0)[0]}
            sims = int(out.num_sims[i])
            decisions.append(
                Decision(
                    move=str(out.move[i]),
                    think_time_s=float(out.think_time_s[i]),
                    value=float(out.value_white[i]),
                    resigned=bool(out.resign[i]),
                    sims=sims,
                    policy={vocab.MOVES[j]: float(pol[j]) for j in ids},
                    effective_lambda=math.nan if lam is None else float(lam[i]),
                    path="search" if sims > 0 else "prior",
                    search_value=math.nan if sims == 0 else float(out.search_value[i]),
                    visits=visits,
                )
            )
        return decisions

    def _direct(
        self,
        games: list[Game],
        boards: list[chess.Board],
        config: SearchConfig,
        key: jax.Array,
        why: str = "from a FEN",
    ) -> list[Decision]:
        """The budget-0 decision (``decision.policy_step``) from one forward pass, with
        python-chess's legal moves: what the Searcher's policy path does, for the positions it
        cannot take."""
        games = [decision.conditioned_game(config, g) for g in games]
        logits, time, value = self._raw(games, boards)
        legal = _legal_masks(boards)
        value_stm = np.array(
            [_side_to_move_value(float(v), b) for v, b in zip(value, boards, strict=True)],
            np.float32,
        )
        res = decision.policy_step_jit(
            logits, legal, value_stm, decision.argmax_rows(config, games), key, config=config
        )
        res = jax.device_get(res)
        note = "" if not config.searches else f"{config.mode} unavailable {why}: policy used"
        out = []
        for i, board in enumerate(boards):
            probs, ids = _legal_softmax(logits[i], board, 1.0)
            out.append(
                Decision(
                    move=vocab.MOVES[int(res["move_id"][i])],
                    think_time_s=float(
                        np.clip(denormalize_think_time(time[i]), 0.0, config.max_think_time)
                    ),
                    value=float(value[i]),
                    resigned=bool(res["resign"][i]),
                    sims=0,
                    policy={vocab.MOVES[j]: float(p) for j, p in zip(ids, probs, strict=True)},
                    note=note,
                )
            )
        return out


def _later(store: aot.ExecutableStore | None) -> contextlib.AbstractContextManager:
    """``store.later()`` (executables a launch needs only after it is ready), or nothing."""
    return contextlib.nullcontext() if store is None else store.later()


def _play_keys(rng: Any) -> tuple[jax.Array, jax.Array]:
    """The search's and the direct pass's keys of one ``play`` call (warm-up runs it too)."""
    key_search, key_direct = jax.random.split(as_jax_key(rng))
    return key_search, key_direct


def fallback_decision(prior: Prediction, note: str) -> Decision:
    """The move a caller out of time plays: the root prior's most likely legal move (the model's
    own first choice, never an arbitrary legal move)."""
    if not prior.move_probs:
        raise ValueError("the root prior has no legal move: the game is over")
    move = max(prior.move_probs, key=prior.move_probs.__getitem__)
    return Decision(
        move=move,
        think_time_s=prior.think_time_s,
        value=prior.value_white,
        resigned=False,
        sims=0,
        policy=dict(prior.move_probs),
        note=note,
        path="fallback",
    )


def temper(d: Decision, temperature: float, rng: Any) -> Decision:
    """A searched move drawn again from the search's final policy at ``temperature`` (0: its
    most likely move; 1: the move as the search drew it), by the one move rule
    (``decision.legal_prior`` to temper, ``decision.draw_moves`` to draw). Budget-0 moves
    already had the preset's temperature applied to the prior."""
    if d.path != "search" or temperature == 1.0 or not d.policy:
        return d
    ids = np.asarray([vocab.MOVE_TO_ID[m] for m in d.policy], np.int64)
    p = np.asarray(list(d.policy.values()), np.float64)
    legal = np.zeros((1, vocab.NUM_MOVES), bool)
    legal[0, ids] = True
    log_p = np.full((1, vocab.NUM_MOVES), -np.inf, np.float32)
    log_p[0, ids] = np.log(np.maximum(p, 1e-30))
    argmax = temperature <= 0
    tempered = decision.legal_prior(jnp.asarray(log_p), legal, 1.0 if argmax else temperature)
    move = decision.draw_moves(tempered, legal, jnp.asarray([argmax]), as_jax_key(rng))
    return dataclasses.replace(d, move=vocab.MOVES[int(move[0])])


def _legal_masks(boards: Sequence[chess.Board]) -> np.ndarray:
    """bool [B, 1968]: python-chess's legal moves as move ids."""
    legal = np.zeros((len(boards), vocab.NUM_MOVES), bool)
    for i, board in enumerate(boards):
        for m in board.legal_moves:
            legal[i, vocab.MOVE_TO_ID[m.uci()]] = True
    return legal


def _legal_softmax(
    logits: np.ndarray, board: chess.Board, temperature: float
) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(sorted(vocab.MOVE_TO_ID[m.uci()] for m in board.legal_moves), dtype=np.int64)
    if len(ids) == 0:
        return np.zeros(0), ids
    x = logits[ids].astype(np.float64) / max(temperature, 1e-6)
    x = np.exp(x - x.max())
    return x / x.sum(), ids


def make_config(preset: str | SearchConfig, **overrides: Any) -> SearchConfig:
    """A SearchConfig for a preset name (or the config itself), with field overrides."""
    if not isinstance(preset, str):
        return dataclasses.replace(preset, **overrides) if overrides else preset
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {', '.join(PRESETS)}")
    fields: dict[str, Any] = {"mode": preset, **overrides}
    check_fields(fields)
    return SearchConfig(**fields)
