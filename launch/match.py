"""``python -m launch.match --white SPEC --black SPEC --games N --tc 180+2 --output games.pgn``.

A SPEC is ``allie:CKPT_DIR:PRESET:ELO`` (PRESET in policy/greedy/search/adaptive, ELO a rating or
``auto``) or ``uci:COMMAND[:Opt=val,...]`` (e.g. ``uci:/usr/games/stockfish:UCI_LimitStrength=true,UCI_Elo=1350``).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from allie_jax import cli

    cli.setup("launch.match")  # library INFO logs to a file, not the console
    from allie_jax.host_memory import keep_freed_host_memory

    keep_freed_host_memory()  # before JAX starts: XLA's temporaries stop faulting in each call
    from allie_jax.engine.match import (
        MatchConfig,
        calibration_markdown,
        is_batched,
        parse_spec,
        run_match,
    )

    p = argparse.ArgumentParser(
        prog="launch.match",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--white", required=True)
    p.add_argument("--black", required=True)
    p.add_argument("--games", type=int, default=2)
    p.add_argument("--tc", default="180+2", help="time control BASE+INC in seconds")
    p.add_argument("--output", default="games.pgn")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument(
        "--alternate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="swap colours every other game (default on)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-plies", type=int, default=600)
    p.add_argument("--no-resign", action="store_true", help="Allie never resigns")
    p.add_argument(
        "--raw-think-times",
        action="store_true",
        help="Allie spends its raw predicted think time (may lose on time)",
    )
    p.add_argument(
        "--system_options",
        default="",
        help="SearchConfig fields for the Allie sides, key=value,... as launch.evaluate's "
        "(e.g. lambda=0.2,lambda_schedule=constant,c_puct=1.5,selection=kl)",
    )
    p.add_argument(
        "--uci-movetime",
        type=float,
        default=None,
        help="seconds per move for UCI engines instead of the clock (fast matches)",
    )
    args = p.parse_args(argv)
    try:
        options = []
        for item in filter(None, (x.strip() for x in args.system_options.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ValueError(f"--system_options {item!r}: expected key=value")
            options.append((key, value))
        cfg = MatchConfig(
            white=parse_spec(args.white),
            black=parse_spec(args.black),
            games=args.games,
            time_control=args.tc,
            concurrency=args.concurrency,
            alternate=args.alternate,
            seed=args.seed,
            max_plies=args.max_plies,
            allow_resign=not args.no_resign,
            raw_think_times=args.raw_think_times,
            uci_movetime=args.uci_movetime,
            search_options=tuple(options),
        )
    except ValueError as exc:  # a bad spec or option: one line naming it
        print(f"launch.match: error: {exc}", file=sys.stderr)
        return 2
    result = run_match(cfg, output=args.output, log=lambda s: print(s, file=sys.stderr))
    print(
        f"{len(result.games)} games, {result.plies} plies in {result.wall_s:.1f} s "
        f"({result.plies_per_s:.1f} moves/s, {result.allie_calls} batched Allie calls)"
    )
    for spec in {cfg.white.name: cfg.white, cfg.black.name: cfg.black}.values():
        pts, w, d, lo = result.score(spec.name)
        print(f"{spec.name}: {pts:g}/{w + d + lo} (+{w} ={d} -{lo})")
    print("terminations: " + ", ".join(f"{k}: {v}" for k, v in result.terminations.items()))
    systems = sorted({s.name for s in (cfg.white, cfg.black) if is_batched(s)})
    if systems:
        print(calibration_markdown(args.output, systems))
    print(f"PGN written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
