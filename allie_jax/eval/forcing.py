"""Uncommon, forcing positions (seed 001): forced mates in 2–4 with a unique first move.

Seed 001 asks whether a searchless model does implicit search; positions whose solution is a
deep but narrow forcing line are hard for pattern matching and easy for search. The set is found,
not hand-picked:

1. candidates: in games that ended by checkmate, the positions 7, 5 and 3 plies before the end
   with the eventual winner to move (where a mate in 2–4 is likely; nothing else is chosen), at
   most one kept per game (the first that qualifies), so positions come from distinct games;
2. Stockfish (``MultiPV 2``, a fixed node budget) keeps a position when its best line is a mate
   in ``min_mate..max_mate`` moves for the side to move and the second-best move does not also
   mate within ``max_mate`` (the solution's first move is unique; later moves are not checked).

Each kept position carries the game's moves up to it (the move-history model needs them), its
FEN, the solution's first move and the mate distance. ``solve_rate`` is the share of positions
where a model's most probable move is the solution (both families through ``engine.Allie``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import chess
import chess.engine

from allie_jax.game import Game

STOCKFISH = "/usr/games/stockfish"


@dataclasses.dataclass(frozen=True)
class ForcingConfig:
    stockfish: str = STOCKFISH
    nodes: int = 400_000  # per position
    min_mate: int = 2
    max_mate: int = 4
    plies_before_end: tuple[int, ...] = (7, 5, 3)
    max_positions: int = 60
    max_candidates: int = 400  # Stockfish calls at most (bounds the run time)
    skip_games: int = 0  # e.g. skip games that are also in a training sample
    threads: int = 1


@dataclasses.dataclass(frozen=True)
class ForcingPosition:
    game_id: str
    ply: int
    moves: tuple[str, ...]  # the game's moves before this position (from the standard start)
    fen: str
    solution: str  # UCI first move of the mate
    mate_in: int  # moves (not plies) to mate for the side to move
    white_elo: int | None
    black_elo: int | None

    def game(self) -> Game:
        return Game(moves=list(self.moves), white_elo=self.white_elo, black_elo=self.black_elo)


def candidates(games: Iterable[Game], config: ForcingConfig) -> Iterable[tuple[Game, int]]:
    """(game, ply) pairs near the end of games that ended in checkmate, winner to move."""
    for i, game in enumerate(games):
        if i < config.skip_games or not game.moves or game.termination != "Normal":
            continue
        board = chess.Board()
        for uci in game.moves:
            board.push_uci(uci)
        if not board.is_checkmate():
            continue
        n = len(game.moves)
        for back in config.plies_before_end:
            if n - back >= 0:
                yield game, n - back


def _mate(info: dict) -> int | None:
    score = info.get("score")
    return None if score is None else score.relative.mate()


def classify(
    engine: chess.engine.SimpleEngine, board: chess.Board, config: ForcingConfig
) -> tuple[str, int] | None:
    """(solution, mate_in) if ``board`` is a unique mate in ``min_mate..max_mate``, else None."""
    infos = engine.analyse(board, chess.engine.Limit(nodes=config.nodes), multipv=2)
    if not infos or "pv" not in infos[0]:
        return None
    best = _mate(infos[0])
    if best is None or not config.min_mate <= best <= config.max_mate:
        return None
    if len(infos) > 1:
        second = _mate(infos[1])
        if second is not None and 0 < second <= config.max_mate:
            return None
    return infos[0]["pv"][0].uci(), best


def find_forcing_positions(
    games: Iterable[Game], config: ForcingConfig, *, progress: bool = True
) -> tuple[list[ForcingPosition], dict[str, int]]:
    """Run Stockfish over the candidates; returns the positions and counts of what was seen."""
    from tqdm import tqdm

    found: list[ForcingPosition] = []
    stats = {"candidates": 0, "kept": 0}
    engine = chess.engine.SimpleEngine.popen_uci(config.stockfish)
    try:
        engine.configure({"Threads": config.threads})
        bar = tqdm(total=config.max_candidates, desc="stockfish", disable=not progress)
        done_games: set[int] = set()
        for game, ply in candidates(games, config):
            if stats["candidates"] >= config.max_candidates or len(found) >= config.max_positions:
                break
            if id(game) in done_games:
                continue
            stats["candidates"] += 1
            bar.update(1)
            board = chess.Board()
            for uci in game.moves[:ply]:
                board.push_uci(uci)
            hit = classify(engine, board, config)
            if hit is None:
                continue
            found.append(
                ForcingPosition(
                    game_id=game.game_id,
                    ply=ply,
                    moves=tuple(game.moves[:ply]),
                    fen=board.fen(),
                    solution=hit[0],
                    mate_in=hit[1],
                    white_elo=game.white_elo,
                    black_elo=game.black_elo,
                )
            )
            stats["kept"] += 1
            done_games.add(id(game))
        bar.close()
    finally:
        engine.quit()
    return found, stats


def write_positions(path, positions: Sequence[ForcingPosition]) -> None:
    from etils import epath

    lines = [json.dumps(dataclasses.asdict(p)) for p in positions]
    epath.Path(path).write_text("\n".join(lines) + ("\n" if lines else ""))


def read_positions(path) -> list[ForcingPosition]:
    from etils import epath

    out = []
    for n, line in enumerate(epath.Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            data["moves"] = tuple(data["moves"])
            out.append(ForcingPosition(**data))
        except (json.JSONDecodeError, TypeError, KeyError) as err:
            raise ValueError(f"{path}: line {n} is not a forcing position ({err})") from None
    return out


def solve_rate(allie: Any, positions: Sequence[ForcingPosition], *, elo: int | None = 2500) -> dict:
    """Share of positions where the model's most probable legal move is the solution.

    ``elo``: the rating both header Elos are set to (greedy's 2,500 by default; None keeps the
    game's). Returns ``{"value", "ci95" (Wilson), "n", "solved", "by_mate_in"}``.
    """
    games = []
    for p in positions:
        g = p.game()
        if elo is not None:
            g = dataclasses.replace(g, white_elo=elo, black_elo=elo)
        games.append(g)
    solved = []
    for start in range(0, len(games), 32):
        preds = allie.predict(games[start : start + 32])
        solved += [max(pr.move_probs, key=pr.move_probs.get) for pr in preds]
    hits = [s == p.solution for s, p in zip(solved, positions, strict=True)]
    by_mate: dict[str, list[int]] = {}
    for h, p in zip(hits, positions, strict=True):
        by_mate.setdefault(str(p.mate_in), [0, 0])
        by_mate[str(p.mate_in)][0] += int(h)
        by_mate[str(p.mate_in)][1] += 1
    n, k = len(hits), sum(hits)
    return {
        "value": k / n if n else math.nan,
        "ci95": list(wilson(k, n)),
        "n": n,
        "solved": k,
        "by_mate_in": {m: {"solved": a, "n": b} for m, (a, b) in sorted(by_mate.items())},
        "moves": solved,
    }


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (positions here come from distinct games)."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))
