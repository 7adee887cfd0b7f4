"""Evaluator throughput: positions/s of one causal pass per game vs one pass per prefix.

Baseline in the same run: the released evaluator's design, which re-runs the model on every
prefix of a game to score its next move (here batched over prefixes, on the same jitted forward,
so the comparison isolates the algorithm). Both paths are warmed up first (every padded shape
compiled), then timed on the same games, model-only and with the per-position reduction
(legal-move masks from python-chess, top move, invalid mass, resign rule). Usage::

    python bench/evaluate.py [--games 100] [--size tiny] [--batch_size 16]
    python bench/evaluate.py --torch --size allie_124m --games 40   # vs one PyTorch forward per game

``--torch`` (needs the ``torch`` extra): our causal pass with and without compilation beside ONE
PyTorch forward over each whole game (batch 1, float32, ``torch.inference_mode``, log-softmax at
every position like ours), same weights (a released-structure PyTorch model converted by
``convert_released_allie``), same run; after the cold (compiling) pass the two are interleaved
over ``--rounds`` rounds and the medians reported, with the load average. The whole policy system
of ``launch.evaluate`` (pass + reduction to the records' rows) is timed in the same rounds.

Threads: XLA's CPU pool uses every CPU the process may use, so torch gets as many intra-op
threads (``--torch_threads 0``, the default); ``--cpus N`` pins the process to N CPUs first, for
an N-core comparison on a shared machine (``--cpus 1``: one core each).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import platform
import time

from allie_jax.host_memory import keep_freed_host_memory

# before JAX starts, as launch.uci / match / evaluate do (both sides of every ratio share it);
# ALLIE_JAX_HOST_MALLOC=system measures with glibc's defaults
HOST_MALLOC = keep_freed_host_memory()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from allie_jax.eval.evaluate import reduce_outputs  # noqa: E402
from allie_jax.eval.positions import game_positions  # noqa: E402
from allie_jax.eval.scoring import CausalScorer, score_per_prefix  # noqa: E402
from allie_jax.model import AllieModel, ModelConfig  # noqa: E402
from allie_jax.pgn import read_games  # noqa: E402

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sample" / "lichess_sample.pgn.zst"


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run(args: argparse.Namespace) -> dict:
    model = AllieModel(ModelConfig.named(args.size), rngs=nnx.Rngs(0))
    games = list(itertools.islice(read_games(args.pgn), args.games))
    gps = [game_positions(g) for g in games]
    positions = sum(gp.num_moves + 1 for gp in gps)
    scorer = CausalScorer(model, batch_size=args.batch_size)

    def causal():
        return list(scorer.score(games))

    def prefix():
        return list(score_per_prefix(scorer, games))

    def reduce(outs):
        return [reduce_outputs(o, gps[i]) for i, o in outs]

    # warm-up: compile every padded shape both paths use
    causal()
    prefix_warm = list(score_per_prefix(scorer, games[: max(1, len(games) // 10)]))
    del prefix_warm
    for bucket in range(scorer.bucket, scorer.max_len + 1, scorer.bucket):
        scorer.run_rows([np.zeros(bucket, np.int32)])

    t_causal, outs_c = timed(causal)
    t_prefix, outs_p = timed(prefix)
    t_reduce, _ = timed(lambda: reduce(outs_c))
    t_rules, _ = timed(lambda: [game_positions(g) for g in games])
    # the two designs compute the same numbers
    ref = dict(outs_p)
    diff = max(float(np.abs(o.log_probs - ref[i].log_probs).max()) for i, o in outs_c)
    result = {
        "device": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "host_malloc_kept": HOST_MALLOC,
        "machine": platform.processor() or platform.machine(),
        "model": args.size,
        "games": len(games),
        "positions": positions,
        "causal_pass_positions_per_s": positions / t_causal,
        "per_prefix_positions_per_s": positions / t_prefix,
        "model_speedup": t_prefix / t_causal,
        "causal_end_to_end_positions_per_s": positions / (t_causal + t_reduce + t_rules),
        "per_prefix_end_to_end_positions_per_s": positions / (t_prefix + t_reduce + t_rules),
        "end_to_end_speedup": (t_prefix + t_reduce + t_rules) / (t_causal + t_reduce + t_rules),
        "seconds": {
            "causal": t_causal,
            "per_prefix": t_prefix,
            "reduce": t_reduce,
            "python_chess_rules": t_rules,
        },
        "max_abs_logprob_diff": diff,
    }
    return result


def load1() -> float:
    try:
        return float(pathlib.Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def restrict_cpus(cpus: int) -> int:
    """Pin this process to its first ``cpus`` allowed CPUs (0: keep all); returns the count.

    Call before JAX starts its backend and before torch starts its pool: XLA's CPU thread pool
    is sized by the CPUs the process may use, so pinning is how both sides get the same cores.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if cpus > 0:
        allowed = allowed[:cpus]
        os.sched_setaffinity(0, allowed)
    return len(allowed)


def run_torch(args: argparse.Namespace) -> dict:
    """Ours (cold: compile included; warm) against one PyTorch forward per whole game."""
    import sys

    import torch

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from torch_allie import paired_models

    from allie_jax.eval.scoring import game_tokens
    from allie_jax.eval.systems import PolicySystem, Positions

    load_start = load1()
    torch_model, model = paired_models(args.size)
    games = list(itertools.islice(read_games(args.pgn), args.games))
    max_len = min(model.config.max_len, 512)
    rows = [game_tokens(g, max_len) for g in games]
    positions = sum(len(t) - h + 1 for t, h in rows)

    def ours():
        return list(CausalScorer(model, batch_size=args.batch_size).score(games))

    def theirs():
        out = []
        with torch.inference_mode():
            for tokens, h in rows:
                logits, value, time_s = torch_model(torch.as_tensor(tokens[None], dtype=torch.long))
                logp = torch.log_softmax(logits[0, h - 1 :].float(), dim=-1)
                out.append((logp.numpy(), value[0, h - 1 :].numpy(), time_s[0, h - 1 :].numpy()))
        return out

    # the whole policy system of launch.evaluate: pass + reduction to records rows (top-k legal
    # moves, p(human), legality, resign); the python-chess replay is done once, outside
    gps = [game_positions(g) for g in games]
    sizes = [gp.num_moves + 1 for gp in gps]
    pos = Positions(
        games,
        gps,
        np.concatenate([np.full(n, j) for j, n in enumerate(sizes)]),
        np.concatenate([np.arange(n) for n in sizes]),
    )
    system = PolicySystem(model, batch_size=args.batch_size)

    jax.clear_caches()  # cold: compiles every shape it meets (or loads it, with --compile_cache)
    t_cold, outs = timed(ours)
    timed(lambda: system.score(pos))  # its own programs are the same; warm its host code too
    warm, torch_times, system_times = [], [], []
    for _ in range(args.rounds):
        t, outs = timed(ours)
        warm.append(t)
        t, ref = timed(theirs)
        torch_times.append(t)
        t, _ = timed(lambda: system.score(pos))
        system_times.append(t)
    ours_by_game = dict(outs)
    diff = max(
        float(np.abs(ours_by_game[i].log_probs[:, : ref[i][0].shape[1]] - ref[i][0]).max())
        for i in range(len(games))
    )
    ratios = [b / a for a, b in zip(warm, torch_times, strict=True)]
    t_warm, t_torch = float(np.median(warm)), float(np.median(torch_times))
    return {
        "device": jax.devices()[0].device_kind,
        "cpus": args.cpus_used,
        "compile_cache": args.compile_cache,
        "torch_threads": torch.get_num_threads(),
        "model": args.size,
        "games": len(games),
        "positions": positions,
        "tokens_per_call": CausalScorer(model, batch_size=args.batch_size).tokens_per_call,
        "ours_with_compile_positions_per_s": positions / t_cold,
        "ours_positions_per_s": positions / t_warm,
        "ours_min_max": [positions / max(warm), positions / min(warm)],
        "ours_policy_system_positions_per_s": positions / float(np.median(system_times)),
        "torch_one_forward_per_game_positions_per_s": positions / t_torch,
        "torch_min_max": [positions / max(torch_times), positions / min(torch_times)],
        "ratio_ours_over_torch": float(np.median(ratios)),
        "ratio_min_max": [min(ratios), max(ratios)],
        "ratio_with_compile": t_torch / t_cold,
        "max_abs_logprob_diff_vs_torch": diff,
        "rounds": args.rounds,
        "load_average_start_end": [load_start, load1()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=100)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--pgn", default=str(SAMPLE))
    parser.add_argument("--torch", action="store_true", help="compare with PyTorch (torch extra)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds for --torch")
    parser.add_argument(
        "--cpus",
        type=int,
        default=0,
        help="pin the process to this many CPUs before JAX and torch start (0: all it may use)",
    )
    parser.add_argument(
        "--torch_threads",
        type=int,
        default=0,
        help="torch intra-op threads for --torch (0: one per CPU the process uses, like XLA)",
    )
    parser.add_argument(
        "--compile_cache",
        default=None,
        help="JAX persistent compilation cache dir for --torch (a second run's cold pass then "
        "loads programs instead of compiling; default: none, every cold pass compiles)",
    )
    args = parser.parse_args()
    args.cpus_used = restrict_cpus(args.cpus)
    if args.compile_cache:
        from allie_jax.engine.compile_cache import enable_compilation_cache

        enable_compilation_cache(args.compile_cache)
    if args.torch:
        import torch

        torch.set_num_threads(args.torch_threads or args.cpus_used)
    if args.torch:
        print(json.dumps(run_torch(args), indent=2))
        return
    result = run(args)
    print(json.dumps(result, indent=2))
    print(
        f"\n| evaluator | positions/s (model) | positions/s (end to end) |\n|---|---:|---:|\n"
        f"| one causal pass per game | {result['causal_pass_positions_per_s']:,.0f} | "
        f"{result['causal_end_to_end_positions_per_s']:,.0f} |\n"
        f"| one pass per prefix (released) | {result['per_prefix_positions_per_s']:,.0f} | "
        f"{result['per_prefix_end_to_end_positions_per_s']:,.0f} |\n"
        f"| ratio | {result['model_speedup']:.1f}× | {result['end_to_end_speedup']:.1f}× |"
    )


if __name__ == "__main__":
    main()
