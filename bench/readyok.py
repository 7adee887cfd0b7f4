"""Time to ``readyok`` of ``launch.uci``, cold (empty cache dir) and warm (second launch onwards).

A GUI or a tournament manager starts the engine, sends ``uci`` / ``isready`` and waits; a game on
a clock cannot afford a compile at the first ``go``, so ``isready`` compiles every shape the engine
will meet and the cache dir (JAX's persistent cache plus ``allie_jax.aot``'s executable store)
makes every later launch start from disk. Each launch is timed from process start to
``readyok``, then one ``go`` on a clock is timed. Cold and warm launches are interleaved
(cold, warm, cold, warm, ...: each cold launch gets its own empty dir, each warm launch reuses
the first cold launch's dir) and the medians are printed with the load average.
``--leaf-batch K`` sets the UCI ``LeafBatch`` option before ``isready`` (so what K compiles is
included). ``--size`` instead of ``--checkpoint`` saves a model of that shape (random weights:
start-up does not depend on them) to a temporary model dir first. Usage::

    python bench/readyok.py --checkpoint demo_out/workdir [--mode adaptive] [--rounds 3]
    python bench/readyok.py --size allie_124m --leaf-batch 8 --rounds 5

``--play 10+0.1`` (after the start-up rounds) plays the engine against Stockfish on that clock
through python-chess's UCI client and prints moves/s and simulations per move (the engine's last
``info nodes`` of each move), the first ``--play-plies`` plies of each of ``--play-games`` games::

    python bench/readyok.py --size allie_124m --leaf-batch 8 --rounds 0 --play 10+0.1 3+2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def launch(
    checkpoint: str, mode: str, cache: Path, leaf_batch: int = 1, tree: Path = REPO
) -> tuple[float, float]:
    """(seconds to readyok from process start, seconds of one go at 10+0.1); ``tree``: the
    checkout whose ``launch.uci`` runs (``bench/readyok_ab.py`` passes a worktree)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launch.uci",
            "--checkpoint",
            checkpoint,
            "--compile-cache",
            str(cache),
        ],
        cwd=tree,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    options = f"setoption name Mode value {mode}\nsetoption name LeafBatch value {leaf_batch}\n"
    proc.stdin.write(f"uci\n{options}isready\n")
    proc.stdin.flush()
    ready = first_go = float("nan")
    for line in proc.stdout:
        if line.strip() == "readyok":
            ready = time.monotonic() - start
            break
    proc.stdin.write("position startpos moves e2e4\ngo wtime 10000 btime 10000 winc 100 binc 100\n")
    proc.stdin.flush()
    start = time.monotonic()
    for line in proc.stdout:
        if line.startswith("bestmove"):
            first_go = time.monotonic() - start
            break
    proc.stdin.write("quit\n")
    proc.stdin.flush()
    proc.wait(60)
    return ready, first_go


def play(
    checkpoint: str,
    cache: Path,
    mode: str,
    leaf_batch: int,
    tc: str,
    plies: int,
    stockfish: str = "/usr/games/stockfish",
) -> tuple[list[float], list[int]]:
    """One game of the engine (White) against Stockfish at ``tc`` (BASE+INC seconds), at most
    ``plies`` plies: the seconds and the simulations of each engine move."""
    import chess
    import chess.engine

    base, _, inc = tc.partition("+")
    clock = {chess.WHITE: float(base), chess.BLACK: float(base)}
    increment = float(inc or 0)
    command = [sys.executable, "-m", "launch.uci", "--checkpoint", checkpoint]
    # no command timeout: isready compiles every shape first, minutes on a cold cache
    ours = chess.engine.SimpleEngine.popen_uci(
        command + ["--compile-cache", str(cache)], cwd=REPO, timeout=None
    )
    theirs = chess.engine.SimpleEngine.popen_uci(stockfish)
    seconds, sims = [], []
    try:
        ours.configure({"Mode": mode, "LeafBatch": leaf_batch})
        theirs.configure({"UCI_LimitStrength": True, "UCI_Elo": 1500})
        ours.ping()  # isready: every shape compiled before the clock starts
        board = chess.Board()
        while not board.is_game_over() and board.ply() < plies:
            limit = chess.engine.Limit(
                white_clock=clock[chess.WHITE],
                black_clock=clock[chess.BLACK],
                white_inc=increment,
                black_inc=increment,
            )
            engine = ours if board.turn == chess.WHITE else theirs
            t = time.monotonic()
            result = engine.play(board, limit, info=chess.engine.INFO_BASIC)
            spent = time.monotonic() - t
            clock[board.turn] += increment - spent
            if clock[board.turn] < 0:
                print(f"  {'engine' if engine is ours else 'stockfish'} lost on time")
                break
            if engine is ours:
                seconds.append(spent)
                sims.append(int(result.info.get("nodes", 0)))
            if result.move is None:
                break
            board.push(result.move)
    finally:
        ours.quit()
        theirs.quit()
    return seconds, sims


def save_random(size: str, path: Path) -> Path:
    """A model dir holding a ``size``-shaped model with random weights (in a child process, so
    this process stays free of JAX)."""
    code = (
        "import sys; from flax import nnx; "
        "from allie_jax.model import AllieModel, ModelConfig; "
        "from allie_jax.model.checkpoint import save_model; "
        "save_model(AllieModel(ModelConfig.named(sys.argv[1], dropout=0.0), rngs=nnx.Rngs(0)), "
        "sys.argv[2])"
    )
    subprocess.run([sys.executable, "-c", code, size, str(path)], cwd=REPO, check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a workdir or exported model dir")
    source.add_argument("--size", help="a ModelConfig.named size, saved with random weights")
    parser.add_argument("--mode", default="adaptive", help="the UCI Mode option")
    parser.add_argument("--leaf-batch", type=int, default=1, help="the UCI LeafBatch option")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--play", nargs="*", default=[], help="clocks BASE+INC to play on")
    parser.add_argument("--play-games", type=int, default=1)
    parser.add_argument("--play-plies", type=int, default=60)
    args = parser.parse_args()
    load = lambda: open("/proc/loadavg").read().split()[0]  # noqa: E731
    load_before = load()
    cold, warm, go_cold, go_warm = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="allie_readyok_") as tmp:
        checkpoint = args.checkpoint or str(save_random(args.size, Path(tmp) / "model"))
        kept = Path(tmp) / "cold-0"
        for r in range(args.rounds):
            ready, go = launch(checkpoint, args.mode, Path(tmp) / f"cold-{r}", args.leaf_batch)
            cold.append(ready)
            go_cold.append(go)
            ready, go = launch(checkpoint, args.mode, kept, args.leaf_batch)
            warm.append(ready)
            go_warm.append(go)
            print(f"round {r}: cold readyok {cold[-1]:.2f} s, warm readyok {warm[-1]:.2f} s")
        for tc in args.play:
            for g in range(args.play_games):
                load_start = load()
                seconds, sims = play(
                    checkpoint,
                    kept,
                    args.mode,
                    args.leaf_batch,
                    tc,
                    args.play_plies,
                )
                if seconds:
                    print(
                        f"play {tc} game {g}: {len(seconds)} engine moves, "
                        f"{len(seconds) / sum(seconds):.2f} moves/s, sims/move median "
                        f"{statistics.median(sims)} ({min(sims)}-{max(sims)}), sims/s "
                        f"{sum(sims) / sum(seconds):.1f}, seconds/move median "
                        f"{statistics.median(seconds):.2f}; load {load_start} -> {load()}",
                        flush=True,
                    )
    if not cold:
        return
    print(
        f"{args.checkpoint or args.size}, mode {args.mode}, LeafBatch {args.leaf_batch}: cold readyok median {statistics.median(cold):.2f} s "
        f"({min(cold):.2f}-{max(cold):.2f}), first go {statistics.median(go_cold):.3f} s; "
        f"warm readyok median {statistics.median(warm):.2f} s ({min(warm):.2f}-{max(warm):.2f}), "
        f"first go {statistics.median(go_warm):.3f} s; load {load_before} -> {load()}"
    )


if __name__ == "__main__":
    main()
