"""Our search against the REAL released search code (y0mingzhang/allie), same weights, same run.

The released repository is not part of this project (nothing of it is committed here): check it
out anywhere and pass its root with ``--released``. Its ``evaluation.decode.MCTS`` runs as
released (python-chess tree, one full-sequence PyTorch forward per simulation through its own
``UCITokenizer.pad_and_collate`` and ``CausalLMWithRegressionHead``), on CPU in float32. The
modules its imports name but this benchmark never calls (openai, openai_api_cache, optimum,
datasets, omegaconf) are replaced by empty stand-ins when they are not installed.

Weights: a released-structure model (``torch_allie.released_like``) is loaded into the released
classes with ``load_state_dict(strict=True)`` (so the key names are the real ones) and converted
to ours by ``convert_released_allie``.

Interleaved rounds: released MCTS on one position (``--sims`` simulations; a different position per
round), then ours on a batch of B positions at the same ply (``Searcher``, preset ``search`` with
the same simulations, cold cache: prefill included; ``--presets`` adds ``adaptive`` / ``gumbel``
with mean ``--sims``; ``--leaf-batches`` runs each with those ``leaf_batch`` values, K leaves of
each game evaluated per model call). The ratio of each round is ours sims/s over
the released sims/s; the median and min-max are reported, with the load average.

    git -C /work/.mirror/y0mingzhang+allie/repo archive HEAD | tar -x -C /tmp/allie_released
    python bench/released_search.py --released /tmp/allie_released --size small --plies 30 60
    python bench/released_search.py --released /tmp/allie_released --size allie_124m \
        --batches 1 --presets search,adaptive --leaf-batches 1 8
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time
import types

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import search as bench_search  # noqa: E402  (bench/search.py: positions, model configs)
import torch  # noqa: E402
from torch_allie import paired_models  # noqa: E402

from allie_jax.search import SearchConfig, Searcher  # noqa: E402

_STANDINS = {
    "openai": {},
    "openai_api_cache": {"OpenAIAPICache": object},
    "optimum": {},
    "optimum.bettertransformer": {"BetterTransformer": object},
    "datasets": {"Dataset": object, "load_dataset": None},
    "omegaconf": {"DictConfig": dict},
}


def import_released(root: pathlib.Path):
    """The released ``MCTS``, ``Game``, ``UCITokenizer`` and model classes from a checkout."""
    src = root / "src"
    if not (src / "evaluation" / "decode.py").exists():
        raise SystemExit(
            f"--released {root}: no src/evaluation/decode.py (a y0mingzhang/allie checkout?)"
        )
    tops = {name.split(".")[0] for name in _STANDINS}
    missing = {t for t in tops if t not in sys.modules and importlib.util.find_spec(t) is None}
    for name, attrs in _STANDINS.items():
        if name.split(".")[0] in missing:
            module = sys.modules.get(name) or types.ModuleType(name)
            for k, v in attrs.items():
                setattr(module, k, v)
            sys.modules[name] = module
    sys.path.insert(0, str(src))
    from evaluation.decode import MCTS
    from modeling.data import Game, UCITokenizer
    from modeling.model import CausalLMWithControlToken, CausalLMWithRegressionHead

    return MCTS, Game, UCITokenizer, CausalLMWithControlToken, CausalLMWithRegressionHead


def load1() -> float:
    try:
        return float(pathlib.Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--released", required=True, help="root of a y0mingzhang/allie checkout")
    p.add_argument("--size", default="small", help="small or a ModelConfig.named size")
    p.add_argument("--plies", type=int, nargs="+", default=[30, 60])
    p.add_argument("--batches", type=int, nargs="+", default=[32])
    p.add_argument("--sims", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--leaf-batches",
        type=int,
        nargs="+",
        default=[1],
        help="SearchConfig.leaf_batch values of ours (leaves per game per model call)",
    )
    p.add_argument(
        "--presets",
        default="search",
        help="comma-separated presets of ours (mean_sims = --sims), each against the same rounds",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: on a loaded machine OpenMP barriers starve; 0: torch's default)",
    )
    args = p.parse_args()
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    MCTS, Game, UCITokenizer, ControlToken, RegressionHead = import_released(
        pathlib.Path(args.released)
    )
    config = bench_search.model_config(args.size)
    clone, ours_model = paired_models(config)
    released_model = RegressionHead(ControlToken(clone.model.model)).eval()
    released_model.load_state_dict(clone.state_dict(), strict=True)
    tokenizer = UCITokenizer(max_length=config.max_len)
    mcts = MCTS(released_model, tokenizer, sample=False, device="cpu", n_sims=args.sims)
    print(
        f"released MCTS (y0mingzhang/allie) vs ours, model {args.size}, {args.sims} sims, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), float32, "
        f"{args.rounds} interleaved rounds"
    )
    print(
        f"{'ply':>4} {'preset':>9} {'B':>4} {'K':>3} {'released s/s':>12} {'ours s/s':>9} "
        f"{'ratio':>6} {'(min-max)':>11} {'load':>9}"
    )
    for ply in args.plies:
        load_start = load1()
        base_games, _ = bench_search.positions(ply, max(args.rounds, 5))
        runs = {}
        for preset in args.presets.split(","):
            for b in args.batches:
                for k in args.leaf_batches:
                    games, _ = bench_search.positions(ply, b)
                    config = SearchConfig.preset(preset, mean_sims=args.sims, leaf_batch=k)
                    searcher = Searcher(ours_model, config)
                    searcher.run(games, 0)  # compile (not timed)
                    runs[preset, b, k] = (searcher, games, [])
        released_rates = []
        with torch.inference_mode():
            for r in range(args.rounds):
                g = base_games[r % len(base_games)]
                game = Game(
                    g.time_control,
                    g.white_elo,
                    g.black_elo,
                    None,
                    False,
                    list(g.moves),
                    [0] * len(g.moves),
                )
                t = time.perf_counter()
                mcts.score_full(game, game.legal_moves)
                released_rates.append(args.sims / (time.perf_counter() - t))
                for searcher, games, rates in runs.values():
                    searcher.forget()
                    t = time.perf_counter()
                    out = searcher.run(games, r + 1)
                    rates.append(int(out.num_sims.sum()) / (time.perf_counter() - t))
        base = np.array(released_rates)
        for (preset, b, k), (_, _, rates) in runs.items():
            ratio = np.array(rates) / base
            print(
                f"{ply:>4} {preset:>9} {b:>4} {k:>3} {np.median(base):>12.1f} "
                f"{np.median(rates):>9.1f} "
                f"{np.median(ratio):>5.1f}x {f'{ratio.min():.1f}-{ratio.max():.1f}':>11} "
                f"{load_start:>4.1f}-{load1():<4.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
