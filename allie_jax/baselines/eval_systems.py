"""Maia as evaluation systems (``allie_jax.eval.systems`` seam): ``maia``, ``maia-1500``,
``maia+search``, ``maia+gumbel``, ``maia-1900+search``, ...

- ``maia`` is Maia*: per position, the network nearest the mover's rating (1100..1900, clamped;
  an unknown rating uses 1500). ``maia-XXXX`` fixes the network.
- ``+search`` / ``+gumbel`` / ``+visits`` run ``MaiaSearcher`` in that mode (``pibar`` for
  ``+search``) on the protocol's search positions, with Maia's policy as prior and anchor and its
  WDL as value.

Options (``--system_options key=value``): ``maia_dir`` (required unless the evaluation config
has ``maia_dir``, or ``$MAIA_DIR`` is set), ``pikl_lambda`` (float; default Grill's λ_N / mctx's
σ), ``maia_sims`` (simulations, default 32), ``maia_anchor`` (rating of a different anchor net),
``maia_batch`` (positions per search batch, default 32).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from allie_jax import vocab
from allie_jax.baselines import lc0_moves
from allie_jax.baselines.lc0_planes import GameEncoder
from allie_jax.baselines.maia import MaiaSet, load_maia
from allie_jax.eval.systems import TOP_K, Positions, Scores, SystemContext

DEFAULT_RATING = 1500  # Maia* for a player without a rating
# system-name suffix -> MaiaSearchConfig mode; the other search modes of ``SearchConfig`` are
# valid names (``allie_jax.eval.systems.check_names``) that this factory refuses with the reason
SEARCH_SUFFIXES = {"search": "pibar", "gumbel": "gumbel", "visits": "visits"}


def parse_name(name: str) -> tuple[int | None, str | None]:
    """``maia-1500+gumbel`` → (1500, "gumbel"); ``maia`` → (None, None) (Maia*, no search)."""
    base, _, suffix = name.partition("+")
    rating = None
    if base != "maia":
        if not base.startswith("maia-") or not base[5:].isdigit():
            raise ValueError(
                f"system {name!r}: expected maia, maia-RATING, optionally +search/+gumbel"
            )
        rating = int(base[5:])
    if suffix and suffix not in SEARCH_SUFFIXES:
        raise ValueError(
            f"system {name!r}: unknown suffix +{suffix} for Maia (it has no think-time head for "
            f"an adaptive budget); use one of {sorted(SEARCH_SUFFIXES)}"
        )
    return rating, (SEARCH_SUFFIXES[suffix] if suffix else None)


def mover_rating(game, ply: int) -> float:
    elo = game.white_elo if ply % 2 == 0 else game.black_elo
    return float(elo) if elo else float(DEFAULT_RATING)


def vocab_policy(
    lc0_logits: np.ndarray, black: bool, king_home: bool, legal_ids: np.ndarray
) -> np.ndarray:
    """Maia's move probabilities over the vocabulary (softmax over the legal moves only)."""
    legal = np.zeros((1, vocab.NUM_MOVES), bool)
    legal[0, legal_ids] = True
    logits = lc0_moves.lc0_to_vocab_logits(
        lc0_logits[None], np.array([black]), np.array([king_home]), legal
    )[0].astype(np.float64)
    probs = np.zeros(vocab.NUM_MOVES)
    if legal_ids.size:
        z = logits[legal_ids]
        e = np.exp(z - z.max())
        probs[legal_ids] = e / e.sum()
    return probs


class _Choice:
    """Which network scores a position: fixed, or nearest to the mover's rating (Maia*)."""

    def __init__(self, maia: MaiaSet, rating: int | None):
        if rating is not None and rating not in maia.ratings:
            raise ValueError(f"no maia-{rating} network in {maia.files} (have {maia.ratings})")
        self.maia, self.rating = maia, rating

    def __call__(self, positions: Positions, p: int) -> int:
        if self.rating is not None:
            return self.rating
        game = positions.games[int(positions.game[p])]
        from allie_jax.baselines.maia import nearest_rating

        return nearest_rating(mover_rating(game, int(positions.ply[p])), self.maia.ratings)


class MaiaSystem:
    """Maia's raw policy (argmax over legal moves) at every position."""

    subsample = False

    def __init__(self, name: str, maia: MaiaSet, rating: int | None, top_k: int = TOP_K):
        self.name = name
        self.choice = _Choice(maia, rating)
        self.top_k = top_k
        self.info: dict[str, Any] = {"maia": rating if rating is not None else "nearest (Maia*)"}
        self.on_batch = None

    def score(self, positions: Positions) -> Scores:
        out = Scores.empty(len(positions), self.top_k)
        human = positions.human_move()
        encoders: dict[int, GameEncoder] = {}
        by_net: dict[int, list[int]] = {}
        for p in range(len(positions)):
            if positions.legal_ids(p).size:
                by_net.setdefault(self.choice(positions, p), []).append(p)
        for rating, rows in by_net.items():
            planes = []
            for p in rows:
                g = int(positions.game[p])
                if g not in encoders:
                    encoders[g] = GameEncoder(positions.games[g].moves)
                planes.append(encoders[g].encode(int(positions.ply[p])))
            pol, wdl = self.choice.maia.predictor(rating)(np.stack(planes))
            for j, p in enumerate(rows):
                enc, ply = encoders[int(positions.game[p])], int(positions.ply[p])
                black = ply % 2 == 1
                probs = vocab_policy(pol[j], black, enc.king_home[ply], positions.legal_ids(p))
                out.set_from_distribution(
                    p, probs, positions.legal_ids(p), int(human[p]), all_tokens=False
                )
                v = float(wdl[j, 0] - wdl[j, 2])
                out.value[p] = -v if black else v
            if self.on_batch is not None:
                self.on_batch(len(rows))
        return out


class MaiaSearchSystem:
    """KL-regularised search on Maia (``MaiaSearcher``) at the protocol's search positions."""

    subsample = True

    def __init__(
        self,
        name: str,
        maia: MaiaSet,
        rating: int | None,
        config,
        *,
        anchor_rating: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
        top_k: int = TOP_K,
    ):
        self.name = name
        self.choice = _Choice(maia, rating)
        self.config = config
        self.anchor_rating = anchor_rating
        self.batch_size = batch_size
        self.seed = seed
        self.top_k = top_k
        self._searchers: dict[int, Any] = {}
        self.info: dict[str, Any] = {
            "maia": rating if rating is not None else "nearest (Maia*)",
            "mode": config.mode,
            "simulations": config.num_simulations,
            "pikl_lambda": config.pikl_lambda,
            "anchor": anchor_rating,
        }
        self.on_batch = None

    def _searcher(self, rating: int):
        from allie_jax.baselines.maia_search import MaiaSearcher

        if rating not in self._searchers:
            maia = self.choice.maia
            anchor = None
            if self.anchor_rating is not None and self.anchor_rating != rating:
                anchor = load_maia(maia.files[self.anchor_rating])
            self._searchers[rating] = MaiaSearcher(
                load_maia(maia.files[rating]),
                self.config,
                anchor_net=anchor,
                batch_size=self.batch_size,
            )
        return self._searchers[rating]

    def score(self, positions: Positions) -> Scores:
        import jax

        out = Scores.empty(len(positions), self.top_k)
        human = positions.human_move()
        by_net: dict[int, list[int]] = {}
        for p in range(len(positions)):
            if positions.legal_ids(p).size:
                by_net.setdefault(self.choice(positions, p), []).append(p)
        from allie_jax.eval.systems import game_batches, position_key

        base = jax.random.key(self.seed + 7)
        sampling = self.config.mode == "gumbel"
        for rating, rows in sorted(by_net.items()):
            sub = Positions(
                positions.games, positions.gps, positions.game[rows], positions.ply[rows]
            )
            for batch in game_batches(sub, self.batch_size, per_game=sampling):
                chunk = [rows[j] for j in batch]
                first = chunk[0]
                game_id = positions.games[int(positions.game[first])].game_id
                key = jax.random.fold_in(
                    base, position_key(self.seed + rating, game_id, int(positions.ply[first]))
                )
                games = [
                    positions.games[int(positions.game[p])].moves[: int(positions.ply[p])]
                    for p in chunk
                ]
                res = self._searcher(rating).run(games, key)
                for j, p in enumerate(chunk):
                    legal = positions.legal_ids(p)
                    out.set_from_distribution(
                        p, res.policy[j], legal, int(human[p]), all_tokens=False
                    )
                    v = float(res.search_value[j])
                    out.value[p] = -v if int(positions.ply[p]) % 2 else v
                    out.num_sims[p] = res.num_sims[j]
                if self.on_batch is not None:
                    self.on_batch(len(chunk))
        return out


def _option(options: Mapping[str, str], key: str, cast, default):
    if key not in options or options[key] in ("", "none", "None"):
        return default
    try:
        return cast(options[key])
    except ValueError:
        raise ValueError(
            f"--system_options {key}={options[key]!r}: not a valid {cast.__name__}"
        ) from None


def maia_search_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The ``--system_options`` that name SearchConfig fields (``c_puct``, ``lambda_schedule``,
    ``selection``, ``leaf_batch``, ...), as MaiaSearchConfig arguments: its own fields by name,
    the rest as ``search_overrides``. The budget (``maia_sims``) and λ (``pikl_lambda`` /
    ``lambda``) keep their Maia spellings; ``mean_sims``/``max_sims`` are the decoder's."""
    import dataclasses

    from allie_jax.baselines.maia_search import MaiaSearchConfig
    from allie_jax.search.config import OPTION_ALIASES, SearchConfig, from_options

    skip = {"mode", "mean_sims", "max_sims", "anchor_lambda"}
    named = {OPTION_ALIASES.get(k, k) for k in options} - skip
    search_fields = {f.name for f in dataclasses.fields(SearchConfig)}
    cast = from_options("search", options)  # text to each field's type, errors naming the key
    own = {f.name for f in dataclasses.fields(MaiaSearchConfig)}
    out: dict[str, Any] = {}
    extra: list[tuple[str, Any]] = []
    for field in sorted(named & search_fields):
        if field in own:
            out[field] = getattr(cast, field)
        else:
            extra.append((field, getattr(cast, field)))
    if extra:
        out["search_overrides"] = tuple(extra)
    return out


def maia_dir_from(ctx: SystemContext) -> str:
    path = ctx.options.get("maia_dir") or ctx.get("maia_dir", None) or os.environ.get("MAIA_DIR")
    if not path:
        raise ValueError(
            "the maia systems need the Maia-1 networks: --maia_dir DIR "
            "(or --system_options maia_dir=DIR, or $MAIA_DIR)"
        )
    return str(path)


def make_maia(name: str, ctx: SystemContext):
    """Factory for the registry (``allie_jax.eval.systems.BUILTIN["maia"]``)."""
    from allie_jax.baselines.maia_search import MaiaSearchConfig

    rating, mode = parse_name(name)
    maia = _shared_set(maia_dir_from(ctx))
    top_k = ctx.get("top_k", TOP_K)
    if mode is None:
        return MaiaSystem(name, maia, rating, top_k=top_k)
    # piKL's λ: pikl_lambda, or the SearchConfig spelling anchor_lambda / lambda
    lam = ctx.get("pikl_lambda", None)
    for key in ("lambda", "anchor_lambda", "pikl_lambda"):
        lam = _option(ctx.options, key, float, lam)
    config = MaiaSearchConfig(
        mode=mode,
        num_simulations=_option(ctx.options, "maia_sims", int, 32),
        pikl_lambda=lam,
        **maia_search_options(ctx.options),
    )
    return MaiaSearchSystem(
        name,
        maia,
        rating,
        config,
        anchor_rating=_option(ctx.options, "maia_anchor", int, None),
        batch_size=_option(ctx.options, "maia_batch", int, 32),
        seed=ctx.get("seed", 0),
        top_k=top_k,
    )


_SETS: dict[str, MaiaSet] = {}


def _shared_set(maia_dir: str) -> MaiaSet:
    """One ``MaiaSet`` per directory, so ``maia`` and ``maia+search`` share loaded networks."""
    if maia_dir not in _SETS:
        _SETS[maia_dir] = MaiaSet(maia_dir)
    return _SETS[maia_dir]
