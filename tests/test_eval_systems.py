"""The per-system seam: built-in systems answer what the causal pass / the searcher answer, and the
registry resolves names and prefixes."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from flax import nnx

from allie_jax.eval import systems as sysmod
from allie_jax.eval.positions import game_positions
from allie_jax.eval.scoring import CausalScorer
from allie_jax.model import AllieModel, ModelConfig
from allie_jax.pgn import read_games

ev = importlib.import_module("allie_jax.eval.evaluate")


@pytest.fixture(scope="module")
def tiny_model():
    return AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def chunk(sample_pgn):
    games = []
    for g in read_games(sample_pgn):
        games.append(g)
        if len(games) == 3:
            break
    gps = [game_positions(g) for g in games]
    game = np.concatenate([np.full(gp.num_moves + 1, i) for i, gp in enumerate(gps)])
    ply = np.concatenate([np.arange(gp.num_moves + 1) for gp in gps])
    return sysmod.Positions(games, gps, game, ply)


def test_policy_system_matches_the_causal_pass(tiny_model, chunk):
    (system,) = sysmod.make_systems(["policy"], sysmod.SystemContext(model=tiny_model))
    assert isinstance(system, sysmod.System) and not system.subsample
    scores = system.score(chunk)
    assert scores.scored.all()
    human = chunk.human_move()
    for i, out in CausalScorer(tiny_model).score(chunk.games):
        rows = np.flatnonzero(chunk.game == i)
        gp = chunk.gps[i]
        ref = ev.reduce_outputs(out, gp)
        np.testing.assert_array_equal(scores.top1[rows], ref.pred)
        np.testing.assert_array_equal(scores.top_legal[rows], ref.top_legal)
        np.testing.assert_allclose(scores.invalid_mass[rows], ref.invalid_mass, rtol=1e-5)
        np.testing.assert_array_equal(scores.resign[rows], ref.resign)
        np.testing.assert_array_equal(scores.value[rows], out.value_white)
        n = gp.num_moves
        p_ref = np.exp(out.log_probs[np.arange(n), gp.move_ids])
        np.testing.assert_allclose(scores.p_human[rows[:n]], p_ref, rtol=1e-5)
        assert np.isnan(scores.p_human[rows[n]])  # the final board has no human move
    # top-k: legal moves only, most probable first
    for p in range(0, len(chunk), 17):
        legal = set(chunk.legal_ids(p).tolist())
        moves = [m for m in scores.top_moves[p] if m >= 0]
        assert set(moves) <= legal and len(moves) == min(len(legal), sysmod.TOP_K)
        assert np.all(np.diff(scores.top_probs[p, : len(moves)]) <= 0)
    assert (human[: chunk.gps[0].num_moves] >= 0).all()


def test_greedy_conditions_on_2500(tiny_model, chunk):
    (greedy,) = sysmod.make_systems(["greedy"], sysmod.SystemContext(model=tiny_model))
    assert greedy.info == {"elo": 2500}
    scores = greedy.score(chunk)
    for i, out in CausalScorer(tiny_model).score(chunk.games, elo_override=2500):
        rows = np.flatnonzero(chunk.game == i)
        np.testing.assert_array_equal(scores.top1[rows], ev.reduce_outputs(out, chunk.gps[i]).pred)


def test_registry_prefixes_and_errors():
    made = []

    def factory(name, ctx):
        made.append(name)
        return name

    sysmod.register("testsys", factory)
    try:
        assert sysmod.make_systems(["testsys-1500"], sysmod.SystemContext()) == ["testsys-1500"]
        assert sysmod.resolve("testsys") is factory
    finally:
        sysmod._REGISTRY.pop("testsys")
    with pytest.raises(ValueError, match="unknown system 'nonesuch'"):
        sysmod.check_names(["policy", "nonesuch"])
    with pytest.raises(ValueError, match="twice"):
        sysmod.check_names(["policy", "policy"])
    with pytest.raises(ValueError, match="checkpoint"):
        sysmod.make_systems(["policy"], sysmod.SystemContext())
    sysmod.register("lazy", "allie_jax.eval.systems:_policy")
    try:
        assert sysmod.resolve("lazy") is sysmod._policy
    finally:
        sysmod._REGISTRY.pop("lazy")
