"""Maia behind the UCI handler: ``python -m launch.uci --checkpoint maia:DIR[:preset[:elo]]``.

``allie_jax.engine.uci.UciHandler`` drives an ``Allie``-shaped object: ``play([game], preset, rng,
start_fens=..., <clock kwargs>, **overrides)`` and ``predict([game], start_fens=...)`` (MultiPV,
the game-over fallback). ``MaiaUciEngine`` answers both with ``MaiaPlayer``:

- the spec's preset is the default; a UCI ``Mode`` that is not a Maia preset (``adaptive``,
  ``greedy``, ...) plays the spec's preset, a Maia one (``policy``/``search``/``gumbel``) plays it;
- the spec's Elo picks the network (absent/``auto``: the one nearest the opponent's rating);
- the UCI ``Temperature`` is honoured (0: Maia's argmax, 1: sampling its policy);
- clock/deadline/search-budget kwargs are ignored (Maia answers in one network call, or a fixed
  number of simulations for ``search``/``gumbel``);
- positions set up from a FEN are refused with a clear error: Maia's input planes need the move
  history from the standard start (the handler then says so in an ``info string`` and plays a
  legal move).
"""

from __future__ import annotations

from collections.abc import Sequence

import chess
import jax
import numpy as np

from allie_jax import vocab
from allie_jax.baselines.maia_player import PRESETS, MaiaPlayer, MaiaSpec
from allie_jax.engine.api import Decision, Prediction
from allie_jax.game import Game


def _check_starts(start_fens: Sequence[str | None] | None) -> None:
    """Maia reads the history from the standard start: refuse any other start position."""
    for fen in start_fens or ():
        if fen is not None and fen != chess.STARTING_FEN:
            raise ValueError(
                f"maia: the position starts from FEN {fen!r}; Maia needs the game's moves from "
                "the standard start (use 'position startpos moves ...')"
            )


class MaiaUciEngine:
    """``Allie``-shaped Maia for ``run_uci`` (see the module docstring)."""

    def __init__(self, spec: MaiaSpec, **player_kwargs):
        self.spec = spec
        self.player_kwargs = player_kwargs
        self._players: dict[str, MaiaPlayer] = {spec.preset: MaiaPlayer(spec, **player_kwargs)}

    def preset_for(self, preset: str) -> str:
        """A UCI ``Mode`` → the Maia preset it plays (unknown ones: the spec's)."""
        return preset if preset in PRESETS else self.spec.preset

    def _player(self, preset: str) -> MaiaPlayer:
        preset = self.preset_for(preset)
        if preset not in self._players:
            spec = MaiaSpec(self.spec.maia_dir, preset, self.spec.elo)
            self._players[preset] = MaiaPlayer(spec, **self.player_kwargs)
        return self._players[preset]

    def play(
        self,
        games: Sequence[Game],
        preset: str,
        rng,
        *,
        start_fens: Sequence[str | None] | None = None,
        temperature: float = 0.0,
        sampling: str | None = None,
        **_clock_and_overrides,
    ) -> list[Decision]:
        _check_starts(start_fens)
        player = self._player(preset)
        player.temperature = 0.0 if sampling == "argmax" else float(temperature)
        key = rng if isinstance(rng, jax.Array) else jax.random.key(int(rng))
        return player.play(games, key)

    def predict(
        self, games: Sequence[Game], start_fens: Sequence[str | None] | None = None
    ) -> list[Prediction]:
        """Maia's softmax over the legal moves and its W−L (White's view) for each game."""
        _check_starts(start_fens)
        player = self._players[self.spec.preset]
        out: list[Prediction | None] = [None] * len(games)
        live: dict[int, list[int]] = {}
        for i, g in enumerate(games):
            board = chess.Board()
            for uci in g.moves:
                board.push_uci(uci)
            if not any(board.legal_moves):
                out[i] = _terminal(board)
            else:
                live.setdefault(player.rating_for(g), []).append(i)
        for rating, rows in sorted(live.items()):
            policies, values, _ = player._policy(rating, [games[i] for i in rows])
            for j, i in enumerate(rows):
                board, ids = player._legal(games[i])
                p = np.asarray(policies[j], np.float64)[ids]
                p = p / p.sum()
                white = board.turn == chess.WHITE
                out[i] = Prediction(
                    move_probs={vocab.MOVES[int(m)]: float(q) for m, q in zip(ids, p, strict=True)},
                    think_time_s=0.0,
                    value_white=float(values[j] if white else -values[j]),
                    resign=False,
                )
        return out  # type: ignore[return-value]


def _terminal(board: chess.Board) -> Prediction:
    """No legal move (mate or stalemate): the result as the value, no moves."""
    outcome = board.outcome(claim_draw=False)
    value = 0.0 if outcome is None or outcome.winner is None else (1.0 if outcome.winner else -1.0)
    return Prediction(move_probs={}, think_time_s=0.0, value_white=value, resign=False)


def load_maia_uci(spec: str) -> MaiaUciEngine:
    """``maia:DIR[:preset[:elo]]`` → the engine (one clear error for a bad spec or directory)."""
    from allie_jax.baselines.maia_player import parse_maia_spec

    return MaiaUciEngine(parse_maia_spec(spec))
