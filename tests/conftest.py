"""Shared fixtures: the bundled real games (data/sample) so tests never read outside the repo."""

from __future__ import annotations

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_PGN = REPO / "data" / "sample" / "lichess_sample.pgn.zst"


@pytest.fixture(scope="session")
def sample_pgn() -> pathlib.Path:
    """Real Lichess games with clocks and Elo (CC0), bundled in the repo."""
    assert SAMPLE_PGN.exists(), f"missing bundled sample games: {SAMPLE_PGN}"
    return SAMPLE_PGN


@pytest.fixture(scope="session")
def prepared_sample(tmp_path_factory, sample_pgn) -> pathlib.Path:
    """The bundled games through the real prepare step (train/val/test ArrayRecord shards).

    The command line itself is tested in test_prepare.py; here the library call is enough.
    """
    from allie_jax.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("prepared")
    prepare([str(sample_pgn)], out, PrepareConfig(events="all", val_frac=0.05, test_frac=0.05))
    return out


@pytest.fixture(scope="session", autouse=True)
def _private_compile_cache(tmp_path_factory):
    """Engines and evaluations that tests start (in process or as commands) keep their JAX cache
    and executable store in a directory of this test session, not in the user's
    ``~/.cache/allie_jax``: tests neither leave files in the home directory nor share cache files
    with other test processes. A cache dir the user set (``ALLIE_JAX_CACHE_DIR``) is kept."""
    if os.environ.get("ALLIE_JAX_CACHE_DIR"):
        yield
        return
    os.environ["ALLIE_JAX_CACHE_DIR"] = str(tmp_path_factory.mktemp("allie_jax_cache"))
    yield
    os.environ.pop("ALLIE_JAX_CACHE_DIR", None)
