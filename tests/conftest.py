"""Shared fixtures: the bundled real games (data/sample) so tests never read outside the repo."""

from __future__ import annotations

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
