"""Maia behind the UCI handler: ``python -m launch.uci --checkpoint maia:DIR[:preset[:elo]]``.

``allie_jax.engine.uci.UciHandler`` drives a ``player.Player``: ``play([game], preset, rng,
start_fens=..., <clock kwargs>, **overrides)``, ``predict([game], start_fens=...)``,
``root_prior(game, fen)`` (MultiPV, the fallback) and ``warmup``. ``MaiaUciEngine`` answers them
with ``MaiaPlayer``:

- the spec's preset is the default; a UCI ``Mode`` that is not a Maia preset (``adaptive``,
  ``greedy``, ...) plays the spec's preset, a Maia one (``policy``/``search``/``gumbel``) plays it;
- the spec's Elo picks the network (absent/``auto``: the one nearest the opponent's rating);
- the UCI ``Temperature`` is honoured (0: Maia's argmax, 1: sampling its policy);
- clock/deadline/search-budget kwargs are ignored (Maia answers in one network call, or a fixed
  number of simulations for ``search``/``gumbel``);
- Maia reads boards, so a position set up from a FEN is played directly: the missing history is
  filled by repeating the position, as lc0 does (``lc0_planes.GameEncoder``). Maia's search walks
  games from the standard start, so from a FEN every preset plays Maia's policy (said in the
  decision's note), its move drawn by the package's one move rule (``search/decision.py``) at
  the UCI ``Temperature``, as every other family's budget-0 move is.

This module imports only the standard library at import time (``launch.uci`` checks a spec
before answering ``uci``, which must not wait for numpy, python-chess or JAX).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from allie_jax.modes import modes_for
from allie_jax.player import PlayerBase, Prediction

if TYPE_CHECKING:
    from allie_jax.game import Game

MAIA_PRESETS = modes_for(think_time=False)  # Maia has no think-time head: no adaptive mode


def spec_error(spec: str) -> str | None:
    """What is wrong with ``maia:DIR[:preset[:elo]]`` (None: nothing), without starting JAX.

    ``maia_player.parse_maia_spec`` is the full parse (run when the engine loads); this light
    check lets ``launch.uci`` refuse a bad spec in one line before answering ``uci``.
    """
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if kind != "maia" or not parts or len(parts) > 3 or not parts[0]:
        return f"maia spec {spec!r}: expected maia:DIR[:PRESET[:ELO]]"
    if len(parts) > 1 and parts[1] and parts[1] not in MAIA_PRESETS:
        return f"maia spec {spec!r}: preset {parts[1]!r} not in {sorted(MAIA_PRESETS)}"
    if len(parts) == 3 and parts[2] not in ("", "auto") and not parts[2].isdigit():
        return f"maia spec {spec!r}: Elo {parts[2]!r} is not a number"
    import os

    if not os.path.isdir(parts[0]):
        return f"maia spec {spec!r}: Maia directory {parts[0]!r} not found"
    return None


class MaiaUciEngine(PlayerBase):
    """Maia as a ``player.Player`` for ``run_uci`` (see the module docstring); it reads boards,
    so a FEN is played directly (``PlayerBase``'s ``reads_boards``, no history search)."""

    def __init__(self, spec: Any, **player_kwargs: Any) -> None:
        from allie_jax.baselines.maia_player import MaiaPlayer

        self.spec = spec
        self.player_kwargs = player_kwargs
        self._players: dict[str, Any] = {spec.preset: MaiaPlayer(spec, **player_kwargs)}
        self._priors: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    modes = MAIA_PRESETS

    def preset_for(self, preset: str) -> str:
        """A UCI ``Mode`` → the Maia preset it plays (unknown ones: the spec's)."""
        return preset if preset in MAIA_PRESETS else self.spec.preset

    def _player(self, preset: str) -> Any:
        from allie_jax.baselines.maia_player import MaiaPlayer, MaiaSpec

        preset = self.preset_for(preset)
        if preset not in self._players:
            spec = MaiaSpec(self.spec.maia_dir, preset, self.spec.elo)
            self._players[preset] = MaiaPlayer(spec, **self.player_kwargs)
        return self._players[preset]

    def play(
        self,
        games: Sequence[Game],
        preset: str,
        rng: Any,
        *,
        start_fens: Sequence[str | None] | None = None,
        temperature: float = 0.0,
        sampling: str | None = None,
        **_clock_and_overrides: Any,
    ) -> list[Any]:
        import dataclasses

        import jax

        from allie_jax.search import decision

        fens = list(start_fens) if start_fens is not None else [None] * len(games)
        player = self._player(preset)
        # greedy: Maia's most probable move at any Temperature (from a FEN too)
        greedy = self.preset_for(preset) == "greedy"
        t = 0.0 if sampling == "argmax" or greedy else float(temperature)
        player.temperature = t
        key = decision.as_jax_key(rng)
        out: list[Any] = [None] * len(games)
        std = [i for i, f in enumerate(fens) if f is None]
        if std:
            played = player.play([games[i] for i in std], key)
            for i, d in zip(std, played, strict=True):
                out[i] = dataclasses.replace(d, path="search" if d.sims > 0 else "prior")
        for i, fen in enumerate(fens):
            if fen is None:
                continue
            out[i] = self._from_fen(games[i], fen, jax.random.fold_in(key, i), player)
        return out

    def _from_fen(self, game: Game, fen: str, key: Any, player: Any) -> Any:
        """Maia's policy move on a position set up from a FEN (history filled as lc0 does),
        drawn by the package's one move rule (``decision.policy_step``) at the player's
        temperature and sampling, exactly as a budget-0 move from the standard start is."""
        import numpy as np

        from allie_jax import vocab
        from allie_jax.player import Decision
        from allie_jax.search import decision

        pred = self.predict([game], start_fens=[fen])[0]
        config = player.search_config
        # Maia's legal softmax as logits: log p differs from its raw logits by a constant, which
        # neither the tempered softmax nor the argmax sees
        logits = np.full((1, vocab.VOCAB_SIZE), -1e9, np.float32)
        legal = np.zeros((1, vocab.NUM_MOVES), bool)
        for move, prob in pred.move_probs.items():
            logits[0, vocab.MOVE_TO_ID[move]] = np.log(max(prob, 1e-38))
            legal[0, vocab.MOVE_TO_ID[move]] = True
        res = decision.policy_step_jit(
            logits,
            legal,
            np.zeros(1, np.float32),
            decision.argmax_rows(config, [game]),
            key,
            config=config,
        )
        move = vocab.MOVES[int(res["move_id"][0])]
        tempered = np.asarray(res["policy"][0])
        note = "maia read the position from the FEN (history filled by repeating it, as lc0)"
        if player.config is not None:
            note += "; its search needs the game from the standard start: policy played"
        return Decision(
            move=move,
            think_time_s=0.0,
            value=pred.value_white,
            resigned=False,
            sims=0,
            policy={m: float(tempered[vocab.MOVE_TO_ID[m]]) for m in pred.move_probs},
            note=note,
            path="prior",
        )

    def warmup(self, preset: str = "policy", batch_size: int = 1, **overrides: Any) -> int:
        """Run every network call a move under ``preset`` makes once (at ``isready``), so the
        first move does not spend its clock compiling: the prior, the move, a FEN start."""
        from allie_jax.game import Game

        game = Game(moves=["e2e4"], white_elo=1500, black_elo=1500)
        self.predict([game])
        self.play([game], preset, 0, **overrides)
        fen = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"
        self.play([Game(moves=[], white_elo=1500, black_elo=1500)], preset, 0, start_fens=[fen])
        return 3

    def root_prior(self, game: Game, fen: str | None = None) -> Prediction:
        """``predict`` for one game, cached (the UCI handler's fallback and MultiPV)."""
        key = (game.white_elo, game.black_elo, tuple(game.moves), fen)
        hit = self._priors.get(key)
        if hit is None:
            hit = self.predict([game], start_fens=[fen])[0]
            self._priors[key] = hit
            while len(self._priors) > 256:
                self._priors.popitem(last=False)
        return hit

    def predict(
        self, games: Sequence[Game], *, start_fens: Sequence[str | None] | None = None
    ) -> list[Prediction]:
        """Maia's softmax over the legal moves and its W−L (White's view) for each game, from
        the network the spec's preset plays (``maia_player.maia_predictions``)."""
        from allie_jax.baselines.maia_player import maia_predictions

        player = self._players[self.spec.preset]
        return maia_predictions(player.maia, games, start_fens, player.rating_for)


def load_maia_uci(spec: str) -> MaiaUciEngine:
    """``maia:DIR[:preset[:elo]]`` → the engine (one clear error for a bad spec or directory)."""
    from allie_jax.baselines.maia_player import parse_maia_spec

    return MaiaUciEngine(parse_maia_spec(spec))
