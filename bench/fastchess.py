"""Allie under fastchess (built from its source, outside the repository) against Stockfish with
an opening book of real positions: time losses, moves decided by the fallback, and the worst
move time against its limit.

The book: 20 positions from real games (``data/sample``, after 8 plies, distinct), written as an
EPD book (what fastchess and cutechess send as ``position fen ...``) and as a PGN book (sent as
``position startpos moves ...``). fastchess logs every engine line; each Allie move's
``info string move M path P ... limit L elapsed E`` gives its path and its time against its
limit; the PGN's termination gives the time losses.

    flock /work/bench.lock .venv/bin/python bench/fastchess.py --fastchess /tmp/fastchess/fastchess \\
        --checkpoint DIR --tc 10+0.1 --games 20 --book epd

fastchess's ``tc`` is in seconds: a 1+0 game (one minute, no increment) is ``--tc 60+0``. By
default each of ``games/2`` openings is played twice, once with each colour; ``--once`` plays
``games`` openings once each, colours alternating. The load average is sampled every 30 s while
fastchess runs (the robustness runs are meant to see whatever load the box has).
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time

import chess
import chess.pgn

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def book_games(n: int, plies: int = 8) -> list[list[chess.Move]]:
    """``n`` distinct openings: the first ``plies`` moves of real games."""
    import zstandard

    path = REPO / "data" / "sample" / "lichess_sample.pgn.zst"
    with path.open("rb") as f:
        pgn = io.StringIO(zstandard.ZstdDecompressor().stream_reader(f).read().decode())
    seen, out = set(), []
    while len(out) < n:
        game = chess.pgn.read_game(pgn)
        if game is None:
            break
        moves = list(game.mainline_moves())[:plies]
        board = chess.Board()
        for m in moves:
            board.push(m)
        if len(moves) == plies and board.fen() not in seen:
            seen.add(board.fen())
            out.append(moves)
    return out


def write_books(games: list[list[chess.Move]], where: pathlib.Path) -> dict[str, pathlib.Path]:
    epd, pgn = where / "book.epd", where / "book.pgn"
    with epd.open("w") as f:
        for moves in games:
            board = chess.Board()
            for m in moves:
                board.push(m)
            f.write(board.epd() + "\n")
    with pgn.open("w") as f:
        for i, moves in enumerate(games):
            game = chess.pgn.Game()
            game.headers["Event"] = f"book {i}"
            node = game
            for m in moves:
                node = node.add_variation(m)
            f.write(str(game) + "\n\n")
    return {"epd": epd, "pgn": pgn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fastchess")
    parser.add_argument("--checkpoint")
    parser.add_argument("--report", help="only summarize the run in this folder (its --out)")
    parser.add_argument("--tc", default="10+0.1")
    parser.add_argument("--games", type=int, default=20)
    parser.add_argument("--book", choices=("epd", "pgn"), default="epd")
    parser.add_argument("--mode", default="adaptive")
    parser.add_argument("--stockfish", default="/usr/games/stockfish")
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout_s", type=float, default=6 * 3600)
    parser.add_argument(
        "--once",
        action="store_true",
        help="play each of `games` openings once, colours alternating (default: games/2 "
        "openings, each with both colours)",
    )
    args = parser.parse_args()
    if args.report:
        print("\n".join(summarize(pathlib.Path(args.report))))
        return
    if not args.fastchess or not args.checkpoint:
        parser.error("--fastchess and --checkpoint are required (or --report DIR)")
    if args.once and args.games > 20:
        parser.error(f"--games {args.games}: the book holds 20 positions; --once plays at most 20")

    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="fastchess-"))
    out.mkdir(parents=True, exist_ok=True)
    books = write_books(book_games(20), out)  # fastchess plays the first games/2, both colours
    log, pgn_out = out / "fastchess.log", out / "games.pgn"
    cmd = [
        args.fastchess,
        "-engine",
        f"cmd={sys.executable}",
        f"args=-m launch.uci --checkpoint {args.checkpoint}",
        f"dir={REPO}",
        "name=allie",
        f"option.Mode={args.mode}",
        "option.OppoElo=1350",
        "-engine",
        f"cmd={args.stockfish}",
        "name=stockfish",
        "option.UCI_LimitStrength=true",
        "option.UCI_Elo=1350",
        "-each",
        f"tc={args.tc}",
        *(
            ["-rounds", str(args.games), "-games", "1"]  # game ids alternate the colours
            if args.once
            else ["-rounds", str(max(1, args.games // 2)), "-games", "2", "-repeat"]
        ),
        "-openings",
        f"file={books[args.book]}",
        f"format={args.book}",
        "order=sequential",
        "-pgnout",
        f"file={pgn_out}",
        "-log",
        f"file={log}",
        "level=info",
        "engine=true",
        "-concurrency",
        "1",
        # uciok keeps fastchess's default 10 s startup limit; isready compiles every shape
        # (minutes on a busy CPU): wait for it, off the clock
        "-ucinewgame-ms",
        "1800000",
        "-ping-ms",
        "1800000",
    ]
    loads: list[tuple[float, float, float]] = [os.getloadavg()]
    done = threading.Event()

    def sample_load() -> None:
        while not done.wait(30.0):
            loads.append(os.getloadavg())

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    t = time.monotonic()
    proc = subprocess.Popen(
        # fastchess writes its config.json into its working directory: keep it with the output
        cmd,
        cwd=pgn_out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:  # report the games finished so far
        proc.kill()
        stdout, _ = proc.communicate()
        stdout += f"\n(stopped after {args.timeout_s} s)"
    wall = time.monotonic() - t
    done.set()
    loads.append(os.getloadavg())
    (out / "load.txt").write_text("".join(f"{a:.2f} {b:.2f} {c:.2f}\n" for a, b, c in loads))
    (out / "stdout.txt").write_text(stdout)
    print(f"fastchess rc {proc.returncode}, {args.tc} ({args.book} book), {wall:.0f} s")
    for line in summarize(out):
        print(line)
    if proc.returncode != 0:
        print(stdout[-2000:])


def summarize(out: pathlib.Path) -> list[str]:
    """The figures of one run from its folder (fastchess.log, games.pgn, load.txt).

    Allie's own ``info string move ... limit L elapsed E`` gives its clock's view; fastchess's
    PGN comments give the GUI's view of each move's time, paired with the engine's limits in
    order (one game at a time, so both list Allie's moves in the same order).
    """
    log, pgn_out = out / "fastchess.log", out / "games.pgn"
    paths: collections.Counter = collections.Counter()
    worst, worst_line = -1e9, ""
    over_limit = 0
    limits: list[float | None] = []
    pattern = re.compile(
        r"allie ---> info string move (\S+) path (\S+).*?(?:limit ([\d.]+)s)? elapsed ([\d.]+)s"
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        m = pattern.search(line)
        if not m:
            continue
        paths[m.group(2)] += 1
        limits.append(float(m.group(3)) if m.group(3) else None)
        if m.group(3):
            late = float(m.group(4)) - float(m.group(3))
            over_limit += late > 0
            if late > worst:
                worst, worst_line = late, line.strip()
    bestmoves = text.count("allie ---> bestmove")
    forfeits: collections.Counter = collections.Counter()
    terminations: collections.Counter = collections.Counter()
    gui_times: list[float] = []
    games = 0
    with open(pgn_out) if pgn_out.exists() else io.StringIO("") as f:
        while (game := chess.pgn.read_game(f)) is not None:
            games += 1
            term = game.headers.get("Termination", "")
            terminations[term] += 1
            if "time" in term.lower():
                loser = "white" if game.headers.get("Result") == "0-1" else "black"
                forfeits[game.headers.get(loser.capitalize(), loser)] += 1
            allie_white = game.headers.get("White") == "allie"
            for node in game.mainline():
                if node.turn() != allie_white:  # the move just played was Allie's
                    t = re.search(r"([\d.]+)s", node.comment)
                    if t:
                        gui_times.append(float(t.group(1)))
    fens = text.count("allie <--- position fen")
    fallback_fen = text.count("no history for the FEN")
    lines = [
        f"{games} games; terminations {dict(terminations)}",
        f"time losses: {dict(forfeits) or 0}",
        f"Allie moves by path: {dict(paths)}  (fallback: {paths.get('fallback', 0)}); "
        f"bestmoves {bestmoves}, without a path line: {bestmoves - sum(paths.values())}",
        f"'position fen' commands: {fens}; FENs without a history: {fallback_fen}",
        f"moves over their limit (engine clock): {over_limit}; worst elapsed - limit: {worst:+.3f} s",
        f"  {worst_line[:220]}",
    ]
    if gui_times:
        lines.append(f"Allie's longest move (fastchess's PGN time): {max(gui_times):.3f} s")
    if len(gui_times) == len(limits) and gui_times:
        paired = [(g - lim, g, lim) for g, lim in zip(gui_times, limits, strict=True) if lim]
        late, g, lim = max(paired)
        lines.append(
            f"worst fastchess time - engine limit: {late:+.3f} s ({g:.3f} s against {lim:.3f} s); "
            f"over the limit: {sum(x[0] > 0 for x in paired)} of {len(paired)}"
        )
    else:
        lines.append(f"(PGN move times {len(gui_times)} and limits {len(limits)} do not pair)")
    if (out / "load.txt").exists():
        one_minute = [float(x.split()[0]) for x in (out / "load.txt").read_text().splitlines()]
        lines.append(
            f"load average (1 min, every 30 s): start {one_minute[0]:.1f}, end "
            f"{one_minute[-1]:.1f}, min {min(one_minute):.1f}, max {max(one_minute):.1f}, "
            f"mean {sum(one_minute) / len(one_minute):.1f}"
        )
    lines.append(f"logs: {out}")
    return lines


if __name__ == "__main__":
    main()
