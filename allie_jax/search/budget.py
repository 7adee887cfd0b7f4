"""Simulations per game: the time-adaptive rule N = clip(round(c · t̂), 0, max_sims).

The released ``AdaptiveMCTS.convert_time_to_sims`` computed round(mean·(std·z + mean_t)/mean_t)
from the normalised time output z, which is the same as round(c · t̂) with c = mean / mean_t;
SPEC §4 also clips t̂ to [0, 200] s before the rule (the released code clipped only N).
"""

from __future__ import annotations

import numpy as np

from allie_jax.search.config import SearchConfig


def simulation_budgets(config: SearchConfig, think_time_s: np.ndarray) -> np.ndarray:
    """int32 [B] simulations per game from the predicted think time in seconds."""
    t = np.asarray(think_time_s, dtype=np.float64)
    if config.adaptive:
        t = np.clip(np.nan_to_num(t, nan=0.0), 0.0, config.max_think_time)
        # np.round is round-half-even like Python's round(), which the released code used.
        sims = np.round(config.sims_per_second * t)
        return np.clip(sims, 0, config.max_sims).astype(np.int32)
    if config.mode in ("search", "gumbel"):
        return np.full(t.shape, config.mean_sims, dtype=np.int32)
    return np.zeros(t.shape, dtype=np.int32)


def scaled_c_puct(config: SearchConfig, budgets: np.ndarray) -> np.ndarray:
    """float32 [B]: c_puct · sqrt(mean_sims / N), pUCT's exploration constant per game (SPEC §4).

    The released code scaled c this way to keep its λ_N constant across budgets; paired with
    λ_N = c·sqrt(ΣN)/(|A|+ΣN) it does not (λ falls as 1/(|A|+N)), so the final policy's λ now
    comes from ``SearchConfig.lambda_schedule`` ("released" reproduces this pairing).

    A budget of 0 runs no simulation; it gets the unscaled constant (never used in selection).
    """
    budgets = np.asarray(budgets, dtype=np.float64)
    c = np.full(budgets.shape, config.c_puct, dtype=np.float64)
    if config.scale_c_puct:
        run = budgets > 0
        c[run] = config.c_puct * np.sqrt(config.mean_sims / budgets[run])
    return c.astype(np.float32)
