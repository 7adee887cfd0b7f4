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
