"""Batched, time-adaptive, KL-regularised MCTS on mctx (SPEC §4).

``Searcher(model, SearchConfig.preset("adaptive")).run(games, rng)`` plays one move per game;
``reference`` holds a plain-Python MCTS with the same equations for parity tests and baselines.
"""

from allie_jax.search.config import SearchConfig
from allie_jax.search.searcher import Searcher, SearchOutput

__all__ = ["SearchConfig", "SearchOutput", "Searcher"]
