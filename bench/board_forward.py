"""The board model's jitted forward alone, this tree against an earlier revision, interleaved.

What a board-family search step spends most of its time in is the model's forward over the
step's leaves; this times that forward by itself (``board_tiny``, random weights, real positions
from the sample games, refinement on) at each batch size, for the package as it is now ("after")
and at ``--before`` (imported as ``allie_jax_old``, as ``bench/family_search.py`` does), and
checks that both give the same outputs (max |Δ| of final log-probs over legal moves, of the
value). XLA's flop count (``cost_analysis``) gives the achieved GFLOP/s.

    flock /work/bench.lock .venv/bin/python bench/board_forward.py --batches 8 32 --before HEAD
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def boards(count: int, ply: int = 30):
    """``count`` real positions (sample games cut at ``ply``) and their Elos."""
    import chess
    from family_search import positions

    out, whites, blacks = [], [], []
    for i, g in enumerate(positions(ply, count)):
        b = chess.Board()
        for m in g.moves[: ply - (i % 7)]:  # vary the plies so both colours move
            b.push_uci(m)
        out.append(b)
        whites.append(g.white_elo)
        blacks.append(g.black_elo)
    return out, whites, blacks


def forward(pkg: str, batch: int):
    """(jitted fn, args, flops) of package ``pkg``'s forward at ``batch`` positions."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    bt = importlib.import_module(f"{pkg}.model.board_transformer")
    bf = importlib.import_module(f"{pkg}.data.board_features")
    model = bt.BoardTransformer(bt.BoardConfig.named("board_tiny"), rngs=nnx.Rngs(0))
    # Random but non-zero relative bias and head biases, so every term is exercised.
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    rng = np.random.default_rng(1)
    leaves = [x + jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype) for x in leaves]
    nnx.update(model, jax.tree.unflatten(treedef, leaves))
    graphdef, params = nnx.split(model)
    bs, w, b = boards(batch)
    inputs = bf.board_inputs(bs, white_elos=w, black_elos=b)
    inputs = {k: jnp.asarray(inputs[k]) for k in bf.INPUT_FIELDS}

    def fwd(params, inputs):
        out = nnx.merge(graphdef, params)(inputs, deterministic=True)
        return out.final_log_probs, out.value

    fn = jax.jit(fwd)
    compiled = fn.lower(params, inputs).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return compiled, (params, inputs), float(cost.get("flops", 0.0))


def median_ms(fn, args, reps: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    p.add_argument("--before", default=None, help="git revision of the 'before' package")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    pkgs = ["allie_jax"]
    if args.before:
        from family_search import old_package

        old_package(args.before)
        pkgs = ["allie_jax_old", "allie_jax"]
    print(f"{'batch':>5} {'package':>14} {'ms (rounds)':>28} {'GFLOP':>7} {'GFLOP/s':>8}")
    for batch in args.batches:
        built = {pkg: forward(pkg, batch) for pkg in pkgs}
        if len(pkgs) == 2:
            (f0, a0, _), (f1, a1, _) = built[pkgs[0]], built[pkgs[1]]
            lp0, v0 = (np.asarray(x) for x in f0(*a0))
            lp1, v1 = (np.asarray(x) for x in f1(*a1))
            legal = np.asarray(a1[1]["move_info"]) >= 0
            print(
                f"batch {batch}: max |Δ| log-probs (legal) {np.abs(lp0 - lp1)[legal].max():.2e}, "
                f"value {np.abs(v0 - v1).max():.2e}, illegal equal "
                f"{bool(np.all(lp0[~legal] == lp1[~legal]) or np.all(lp1[~legal] < -1e8))}"
            )
        ms = {pkg: [] for pkg in pkgs}
        for _ in range(args.rounds):
            for pkg in pkgs:
                fn, a, _ = built[pkg]
                ms[pkg].append(median_ms(fn, a, args.reps))
        for pkg in pkgs:
            flops = built[pkg][2]
            m = float(np.median(ms[pkg]))
            spread = f"{m:6.2f} ({min(ms[pkg]):.2f}-{max(ms[pkg]):.2f})"
            print(f"{batch:>5} {pkg:>14} {spread:>28} {flops / 1e9:7.3f} {flops / m / 1e6:8.1f}")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
