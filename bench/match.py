"""Match benchmarks: batched self-play moves/s per preset, and real-clock games against Stockfish.

Self-play (default: 64 concurrent games of a random-init ``tiny``, each step one batched call)::

    .venv/bin/python bench/match.py [--checkpoint DIR] [--games 64] [--presets policy,search,adaptive]
        [--shapes auto,fixed,tight --rounds 3]

Against Stockfish under a real clock, the engine as a UCI process (``launch.uci``: compiled at
``isready``, the clock's deadline per move), through python-chess or a UCI tournament runner
(fastchess, built outside the repo)::

    .venv/bin/python bench/match.py --stockfish /usr/games/stockfish --sf-elo 1350 \\
        --tc 60+1 --games 20 --concurrency 2 --checkpoint DIR --presets adaptive \\
        [--runner python-chess|fastchess --fastchess /work/tools/fastchess/fastchess]

reports time losses, the worst Allie move time against its limit (``pacing.time_budget`` of the
clock it was asked with), and the score.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def self_play(args) -> None:
    """Moves/s of batched self-play per preset and shape mode, compile included and excluded.

    Each (preset, shapes) run starts from a freshly loaded Allie (nothing compiled in-process);
    ``--rounds`` repeats the list interleaved (ABAB...) so a changing load hits every variant.
    """
    import jax
    from flax import nnx

    from allie_jax.engine import Allie
    from allie_jax.engine import match as match_lib
    from allie_jax.model import AllieModel, ModelConfig

    def fresh() -> Allie:
        if args.checkpoint:
            return Allie.load(args.checkpoint)
        return Allie(AllieModel(ModelConfig.named("tiny"), rngs=nnx.Rngs(0)))

    print(f"device: {jax.devices()[0].platform}; games: {args.games}; load: {_load()}")
    for rnd in range(args.rounds):
        for preset in args.presets.split(","):
            for shapes in args.shapes.split(","):
                allie = fresh()
                spec = match_lib.parse_spec(f"allie:{args.checkpoint or 'tiny'}:{preset}:1500")
                cfg = match_lib.MatchConfig(
                    spec,
                    spec,
                    games=args.games,
                    concurrency=args.games,
                    max_plies=args.max_plies,
                    time_control=args.tc,
                    fixed_shapes={"fixed": True, "tight": False}.get(shapes),
                )
                with tempfile.TemporaryDirectory() as tmp:
                    compile0 = match_lib._COMPILE_S[0]
                    t = time.perf_counter()
                    r = match_lib.run_match(
                        cfg,
                        output=os.path.join(tmp, "bench.pgn"),
                        allie_loader=lambda _, a=allie: a,
                    )
                    wall = time.perf_counter() - t
                    compile_s = match_lib._COMPILE_S[0] - compile0
                print(
                    f"round {rnd + 1} {preset} shapes={shapes}: plies {r.plies}; wall {wall:.1f} s; "
                    f"moves/s {r.plies / wall:.1f} (compile included), "
                    f"{r.plies / max(wall - compile_s, 1e-9):.1f} (without its {compile_s:.1f} s "
                    f"of tracing and compiling); batched calls {r.allie_calls}; "
                    f"terminations {dict(r.terminations)}; load {_load()}",
                    flush=True,
                )


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _engine_cmd(args) -> list[str]:
    cmd = [sys.executable, "-m", "launch.uci", "--checkpoint", args.checkpoint]
    return cmd + (["--compile-cache", args.compile_cache] if args.compile_cache else [])


def _play_one(args, index: int, allie, sf, log) -> dict:
    """One game with python-chess as the runner; the driver keeps both real clocks."""
    import chess
    import chess.engine
    import chess.pgn

    from allie_jax.engine.pacing import Clock, time_budget

    base, inc = (float(x) for x in args.tc.split("+"))
    allie_white = index % 2 == 0
    board, clocks = chess.Board(), [base, base]
    moves, result, why = [], "*", ""
    gid = f"bench-{index}"
    while True:
        outcome = board.outcome(claim_draw=True)
        if outcome is not None:
            result, why = outcome.result(), outcome.termination.name.lower()
            break
        if len(board.move_stack) >= args.max_plies:
            result, why = "1/2-1/2", "max plies"
            break
        side = 0 if board.turn == chess.WHITE else 1
        ours = (side == 0) == allie_white
        engine = allie if ours else sf
        limit = chess.engine.Limit(
            white_clock=max(clocks[0], 0.001),
            black_clock=max(clocks[1], 0.001),
            white_inc=inc,
            black_inc=inc,
        )
        t = time.monotonic()
        res = engine.play(board, limit, game=gid)
        spent = time.monotonic() - t
        if ours:
            budget = time_budget(Clock(clocks[side], inc))
            moves.append({"spent": spent, "limit": budget, "clock": clocks[side]})
        clocks[side] -= spent
        if clocks[side] < 0:
            result = "0-1" if side == 0 else "1-0"
            why = "time forfeit " + ("allie" if ours else "stockfish")
            break
        clocks[side] += inc
        board.push(res.move)
    allie_points = {"1-0": 1.0, "0-1": 0.0, "1/2-1/2": 0.5}[result]
    allie_points = allie_points if allie_white else 1.0 - allie_points
    log(f"game {index + 1}: allie {'white' if allie_white else 'black'} {result} ({why}), "
        f"{len(board.move_stack)} plies, worst move {max(m['spent'] for m in moves):.2f} s")  # fmt: skip
    game = chess.pgn.Game.from_board(board)
    game.headers.update({"White": "allie" if allie_white else "stockfish", "Result": result})
    game.headers["Black"] = "stockfish" if allie_white else "allie"
    game.headers["Termination"] = why
    return {"result": result, "why": why, "allie_points": allie_points, "moves": moves,
            "pgn": str(game)}  # fmt: skip


def vs_stockfish_python_chess(args) -> list[dict]:
    import chess.engine

    def slot_games(slot: int) -> list[dict]:
        allie = chess.engine.SimpleEngine.popen_uci(_engine_cmd(args), cwd=REPO, timeout=1800)
        sf = chess.engine.SimpleEngine.popen_uci(args.stockfish)
        try:
            allie.configure({"Mode": args.presets.split(",")[0], "OppoElo": args.sf_elo})
            t = time.monotonic()
            allie.ping()  # isready: compiles every shape before the first game (not on a clock)
            print(f"slot {slot}: readyok after {time.monotonic() - t:.1f} s", flush=True)
            sf.configure({"UCI_LimitStrength": True, "UCI_Elo": args.sf_elo})
            out = []
            for i in range(slot, args.games, args.concurrency):
                out.append(_play_one(args, i, allie, sf, lambda s: print(s, flush=True)))
            return out
        finally:
            allie.quit()
            sf.quit()

    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = [g for part in pool.map(slot_games, range(args.concurrency)) for g in part]
    return results


def vs_stockfish_fastchess(args) -> list[dict]:
    """fastchess plays; its PGN's per-move comments (``{score/depth 1.234s}``) give the times."""
    import chess.pgn

    from allie_jax.engine.pacing import Clock, time_budget

    pgn = os.path.abspath(args.output or "bench_fastchess.pgn")
    cmd = [args.fastchess, "-engine", f"cmd={sys.executable}", "name=allie", "dir=" + REPO,
           "args=" + " ".join(_engine_cmd(args)[1:]), f"option.Mode={args.presets.split(',')[0]}",
           f"option.OppoElo={args.sf_elo}",
           "-engine", f"cmd={args.stockfish}", "name=stockfish", "option.UCI_LimitStrength=true",
           f"option.UCI_Elo={args.sf_elo}",
           "-each", f"tc={args.tc}", "-rounds", str((args.games + 1) // 2), "-games", "2",
           "-repeat", "-concurrency", str(args.concurrency), "-pgnout", f"file={pgn}",
           "-recover"]  # fmt: skip
    print(" ".join(cmd), flush=True)
    # fastchess writes its config.json into its working directory: keep that out of the checkout
    with tempfile.TemporaryDirectory(prefix="fastchess-") as workdir:
        subprocess.run(cmd, check=False, cwd=workdir)
    base, inc = (float(x) for x in args.tc.split("+"))
    results = []
    with open(pgn) as f:
        while (game := chess.pgn.read_game(f)) is not None:
            white = game.headers["White"] == "allie"
            clocks, moves = [base, base], []
            node = game
            while node.variations:
                node = node.variations[0]
                side = 0 if node.parent.board().turn else 1
                m = re.search(r"([0-9.]+)s", node.comment or "")
                spent = float(m.group(1)) if m else 0.0
                if (side == 0) == white:
                    budget = time_budget(Clock(clocks[side], inc))
                    moves.append({"spent": spent, "limit": budget, "clock": clocks[side]})
                clocks[side] += inc - spent
            result = game.headers["Result"]
            pts = {"1-0": 1.0, "0-1": 0.0, "1/2-1/2": 0.5}.get(result, 0.5)
            why = game.headers.get("Termination", "")
            if "time" in why.lower():
                loser_white = result == "0-1"
                why = "time forfeit " + ("allie" if loser_white == white else "stockfish")
            results.append({"result": result, "why": why, "moves": moves,
                            "allie_points": pts if white else 1.0 - pts})  # fmt: skip
    return results


def vs_stockfish(args) -> None:
    print(f"load before: {_load()}; runner: {args.runner}; tc {args.tc}; games {args.games}")
    t = time.monotonic()
    runner = vs_stockfish_fastchess if args.runner == "fastchess" else vs_stockfish_python_chess
    results = runner(args)
    moves = [m for g in results for m in g["moves"]]
    worst = max(moves, key=lambda m: m["spent"] - (m["limit"] or 0.0))
    over = sum(m["spent"] > (m["limit"] or 0.0) + 0.2 for m in moves)
    summary = {
        "games": len(results),
        "allie_time_losses": sum(g["why"] == "time forfeit allie" for g in results),
        "stockfish_time_losses": sum(g["why"] == "time forfeit stockfish" for g in results),
        "allie_score": sum(g["allie_points"] for g in results),
        "allie_moves": len(moves),
        "worst_move_s": round(worst["spent"], 3),
        "its_limit_s": round(worst["limit"] or 0.0, 3),
        "its_clock_s": round(worst["clock"], 3),
        "longest_move_s": round(max(m["spent"] for m in moves), 3),
        "moves_over_limit_plus_0.2s": over,
        "wall_s": round(time.monotonic() - t, 1),
        "load_after": _load(),
    }
    print(json.dumps(summary, indent=1))
    if args.output and args.runner != "fastchess":
        with open(args.output, "w") as f:
            f.write("\n\n".join(g["pgn"] for g in results) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="default: random-init tiny (self-play)")
    p.add_argument("--games", type=int, default=64)
    p.add_argument("--presets", "--preset", default="policy,search,adaptive")
    p.add_argument("--max-plies", type=int, default=200)
    p.add_argument(
        "--shapes",
        default="auto",
        help="self-play: auto (MatchConfig's default: fixed for adaptive presets), fixed (the "
        "engine's closed set) and/or tight (shapes follow each batch), comma-separated",
    )
    p.add_argument("--rounds", type=int, default=1, help="self-play: interleaved repeats")
    p.add_argument("--tc", default="180+2")
    p.add_argument("--stockfish", default=None, help="play this UCI engine under a real clock")
    p.add_argument("--sf-elo", type=int, default=1350)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--runner", choices=("python-chess", "fastchess"), default="python-chess")
    p.add_argument("--fastchess", default="/work/tools/fastchess/fastchess")
    p.add_argument("--compile-cache", default=None)
    p.add_argument("--output", default=None, help="PGN of the games against --stockfish")
    args = p.parse_args()
    if args.stockfish:
        if not args.checkpoint:
            p.error("--stockfish needs --checkpoint (the engine runs as a UCI process)")
        vs_stockfish(args)
    else:
        self_play(args)


if __name__ == "__main__":
    main()
