"""The human anchor's strength, λ (value units), under each ``lambda_schedule``, and Gumbel's
improved policy for a noise-level and a whole-point Q spread, stock σ against the anchored mode.

Every number comes from the search code itself (``pibar.schedule_lambda``, ``gumbel.transform``),
not from a re-derivation here:

    .venv/bin/python bench/anchor_table.py
    .venv/bin/python bench/anchor_table.py --anchor_lambda 0.3 --num_legal 20

Table 1: λ at a search of N simulations (ΣN = N at the root), |A| legal moves, c_puct, and the
mean budget of the adaptive rule (``mean_sims``) that the "released" pairing scales c by.
Table 2: prior [0.6, 0.3, 0.1], max N = 20 visits, Q = [0, 0.01, 0.02] and Q = [0, 0.5, 1.0]:
π' = softmax(log prior + σ(Q)) under stock mctx σ (c_visit 50, c_scale 0.1) and under the anchored
σ = Q/λ, with the λ each reports.
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np

from allie_jax.search import gumbel, pibar
from allie_jax.search.config import LAMBDA_SCHEDULES, SearchConfig


def lambda_table(config: SearchConfig, budgets: list[int], num_legal: int) -> list[str]:
    n = jnp.asarray(budgets, jnp.float32)
    scaled = config.c_puct * jnp.sqrt(config.mean_sims / n)  # budget.scaled_c_puct's rule
    head = f"{'schedule':<10}" + "".join(f"{'N=' + str(b):>10}" for b in budgets)
    lines = [head]
    for schedule in LAMBDA_SCHEDULES:
        lam = pibar.schedule_lambda(
            schedule,
            anchor_lambda=config.anchor_lambda,
            c_puct=config.c_puct,
            scaled_c_puct=scaled,
            total_visits=n,
            num_legal=jnp.full(n.shape, num_legal),
            sqrt=config.lambda_sqrt,
        )
        lines.append(f"{schedule:<10}" + "".join(f"{float(x):>10.4f}" for x in lam))
    return lines


def policy_table(anchor_lambda: float, max_n: int) -> list[str]:
    prior = np.array([0.6, 0.3, 0.1], np.float32)
    visits = jnp.asarray([max_n, 0, 0])
    lines = [f"{'mode':<22}{'Q':<18}{'lambda':>8}   improved policy"]
    modes = (
        ("stock mctx sigma", gumbel.GumbelParams()),
        (
            f"anchored, lambda={anchor_lambda:g}",
            gumbel.GumbelParams(transform="anchor", anchor_lambda=anchor_lambda),
        ),
    )
    for name, params in modes:
        for q in ([0.0, 0.01, 0.02], [0.0, 0.5, 1.0]):
            lam = anchor_lambda if params.transform == "anchor" else None
            sigma_q, eff = gumbel.transform(jnp.asarray(q, jnp.float32), visits, params, lam)
            z = np.log(prior) + np.asarray(sigma_q)
            p = np.exp(z - z.max())
            p /= p.sum()
            lines.append(
                f"{name:<22}{str(q):<18}{float(eff):>8.4f}   [{', '.join(f'{x:.3f}' for x in p)}]"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor_lambda", type=float, default=SearchConfig().anchor_lambda)
    ap.add_argument("--c_puct", type=float, default=SearchConfig().c_puct)
    ap.add_argument("--mean_sims", type=int, default=SearchConfig().mean_sims)
    ap.add_argument("--num_legal", type=int, default=30)
    ap.add_argument("--budgets", default="5,50,200")
    ap.add_argument("--max_n", type=int, default=20)
    args = ap.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
        if min(budgets) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--budgets {args.budgets!r}: expected positive integers, comma-separated")
    if args.num_legal < 1 or args.max_n < 1:
        ap.error("--num_legal and --max_n must be at least 1")
    config = SearchConfig(
        anchor_lambda=args.anchor_lambda,
        c_puct=args.c_puct,
        mean_sims=args.mean_sims,
        max_sims=max(args.mean_sims, 200),
    )
    print(
        f"lambda by schedule (|A| = {args.num_legal}, c_puct = {config.c_puct}, "
        f"mean_sims = {config.mean_sims}, anchor_lambda = {config.anchor_lambda})"
    )
    print("\n".join(lambda_table(config, budgets, args.num_legal)))
    print(f"\nimproved policy, prior [0.6, 0.3, 0.1], max N = {args.max_n}")
    print("\n".join(policy_table(config.anchor_lambda, args.max_n)))


if __name__ == "__main__":
    main()
