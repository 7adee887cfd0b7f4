"""Skill calibration: FIDE performance ratings and the paper's skill calibration error (SCE).

A system's performance in a bin of games is the opponents' mean rating plus FIDE's rating
difference dp(p) for its score fraction p (FIDE Rating Regulations, table 8.1(a), p rounded to
the nearest hundredth). SCE(bin) = |performance − opponents' mean| = |dp(p)|, reported per
200-Elo bin of the opponent and as mean / max over bins (paper §5, Table "skill calibration").

Games are read from PGN headers only (White, Black, WhiteElo, BlackElo, Result), so a PGN written
by the match tool with any termination or move text works; moves are not replayed.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Iterable, Iterator, Sequence

import chess.pgn
import numpy as np

from allie_jax.data.paths import as_path
from allie_jax.pgn import open_text

# dp for p = 1.00, 0.99, ..., 0.50 (FIDE table 8.1(a)); below 0.50, dp(p) = −dp(1 − p).
FIDE_DP_TABLE: tuple[int, ...] = (
    800, 677, 589, 538, 501, 470, 444, 422, 401, 383,
    366, 351, 336, 322, 309, 296, 284, 273, 262, 251,
    240, 230, 220, 211, 202, 193, 184, 175, 166, 158,
    149, 141, 133, 125, 117, 110, 102, 95, 87, 80,
    72, 65, 57, 50, 43, 36, 29, 21, 14, 7,
    0,
)  # fmt: skip
assert len(FIDE_DP_TABLE) == 51

RESULT_SCORE = {"1-0": (1.0, 0.0), "0-1": (0.0, 1.0), "1/2-1/2": (0.5, 0.5)}


def fide_dp(p: float) -> int:
    """FIDE rating difference for a score fraction p in [0, 1] (p is rounded to a hundredth)."""
    if not 0.0 <= p <= 1.0 or math.isnan(p):
        raise ValueError(f"score fraction must be in [0, 1], got {p}")
    percent = int(math.floor(p * 100 + 0.5 + 1e-9))  # round half up, robust to 0.745 -> 74.4999
    if percent >= 50:
        return FIDE_DP_TABLE[100 - percent]
    return -FIDE_DP_TABLE[percent]


def performance_rating(opponent_ratings: Sequence[float], scores: Sequence[float]) -> float:
    """Mean opponent rating + dp(mean score): the FIDE performance over a set of games."""
    ratings = np.asarray(opponent_ratings, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if ratings.size == 0 or ratings.shape != scores.shape:
        raise ValueError(
            f"performance_rating needs one score per rated game, got {ratings.size} ratings "
            f"and {scores.size} scores"
        )
    return float(ratings.mean() + fide_dp(float(scores.mean())))


@dataclasses.dataclass(frozen=True)
class SystemGame:
    """One game from the system's side: the opponent's rating and the system's score."""

    system: str
    opponent_elo: float
    score: float  # 1 win, 0.5 draw, 0 loss


@dataclasses.dataclass(frozen=True)
class CalibrationBin:
    lo: int  # opponent rating bin [lo, lo + width)
    hi: int
    games: int
    score: float  # mean score of the system
    opponent_mean: float
    performance: float
    sce: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SystemCalibration:
    system: str
    games: int
    score: float
    opponent_mean: float
    performance: float
    bins: tuple[CalibrationBin, ...]
    sce_mean: float  # mean over bins of |performance − opponents' mean|
    sce_max: float

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bins"] = [b.to_dict() for b in self.bins]
        return d


@dataclasses.dataclass(frozen=True)
class CalibrationTable:
    """Per-system calibration; ``to_dict`` goes into report.json, ``to_markdown`` into report.md."""

    bin_width: int
    systems: dict[str, SystemCalibration]

    def __getitem__(self, system: str) -> SystemCalibration:
        return self.systems[system]

    def to_dict(self) -> dict:
        return {
            "bin_width": self.bin_width,
            "systems": {k: v.to_dict() for k, v in self.systems.items()},
        }

    def to_markdown(self) -> str:
        return calibration_markdown(self.to_dict())


def calibration_markdown(table: dict) -> str:
    """Markdown of a ``CalibrationTable.to_dict()`` (report.json keeps the dict form)."""
    width = table["bin_width"]
    systems = table["systems"].values()
    lines = [
        "| system | games | score | performance | opponents | SCE mean | SCE max |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in systems:
        lines.append(
            f"| {s['system']} | {s['games']} | {s['score']:.3f} | {s['performance']:.0f} | "
            f"{s['opponent_mean']:.0f} | {s['sce_mean']:.0f} | {s['sce_max']:.0f} |"
        )
    lines += ["", f"Per {width}-Elo opponent bin (performance / SCE / games):", ""]
    los = sorted({b["lo"] for s in systems for b in s["bins"]})
    lines.append("| system | " + " | ".join(f"{lo}-{lo + width}" for lo in los) + " |")
    lines.append("|---|" + "---:|" * len(los))
    for s in systems:
        by_lo = {b["lo"]: b for b in s["bins"]}
        cells = [
            f"{by_lo[lo]['performance']:.0f} / {by_lo[lo]['sce']:.0f} / {by_lo[lo]['games']}"
            if lo in by_lo
            else "–"
            for lo in los
        ]
        lines.append(f"| {s['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibrate(
    games: Iterable[SystemGame], *, bin_width: int = 200, min_games: int = 1
) -> CalibrationTable:
    """Performance and SCE per system and per ``bin_width``-Elo bin of the opponent."""
    by_system: dict[str, list[SystemGame]] = {}
    for g in games:
        by_system.setdefault(g.system, []).append(g)
    systems = {}
    for name, rows in by_system.items():
        opp = np.array([r.opponent_elo for r in rows])
        score = np.array([r.score for r in rows])
        lows = (np.floor(opp / bin_width) * bin_width).astype(int)
        bins = []
        for lo in np.unique(lows):
            sel = lows == lo
            if sel.sum() < min_games:
                continue
            perf = performance_rating(opp[sel], score[sel])
            mean = float(opp[sel].mean())
            bins.append(
                CalibrationBin(
                    lo=int(lo),
                    hi=int(lo + bin_width),
                    games=int(sel.sum()),
                    score=float(score[sel].mean()),
                    opponent_mean=mean,
                    performance=perf,
                    sce=abs(perf - mean),
                )
            )
        sces = [b.sce for b in bins]
        systems[name] = SystemCalibration(
            system=name,
            games=len(rows),
            score=float(score.mean()),
            opponent_mean=float(opp.mean()),
            performance=performance_rating(opp, score),
            bins=tuple(bins),
            sce_mean=float(np.mean(sces)) if sces else math.nan,
            sce_max=float(np.max(sces)) if sces else math.nan,
        )
    return CalibrationTable(bin_width=bin_width, systems=systems)


def system_games_from_pgn(
    path: str | pathlib.Path, system_names: Sequence[str]
) -> Iterator[SystemGame]:
    """The games of a PGN in which one side's name is a system; unrated or unfinished games skipped.

    A game between two systems counts for both (each against the other's rating).
    """
    path = as_path(path)  # local or gs:// (etils.epath); open_text reads either
    if not path.exists():
        raise FileNotFoundError(f"calibration PGN not found: {path}")
    names = set(system_names)
    with open_text(path) as f:
        while (headers := chess.pgn.read_headers(f)) is not None:
            scores = RESULT_SCORE.get(headers.get("Result", "*"))
            if scores is None:
                continue
            sides = (
                (headers.get("White", ""), headers.get("BlackElo"), scores[0]),
                (headers.get("Black", ""), headers.get("WhiteElo"), scores[1]),
            )
            for name, opp_elo, score in sides:
                if name not in names:
                    continue
                try:
                    elo = float(opp_elo)
                except (TypeError, ValueError):
                    continue
                yield SystemGame(system=name, opponent_elo=elo, score=score)


def calibration_from_pgn(
    path: str | pathlib.Path, system_names: Sequence[str], *, bin_width: int = 200
) -> CalibrationTable:
    """Calibration table of the named systems from a PGN of their games (the match tool's output)."""
    table = calibrate(system_games_from_pgn(path, system_names), bin_width=bin_width)
    missing = [n for n in system_names if n not in table.systems]
    if len(missing) == len(system_names):
        raise ValueError(
            f"no rated, finished game of any of {list(system_names)} in {path} "
            "(names must match the PGN's White/Black headers)"
        )
    return table
