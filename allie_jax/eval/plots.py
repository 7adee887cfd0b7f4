"""The paper's evaluation figures as PNGs, drawn from the report dict (so a saved report.json can be
re-plotted): accuracy vs Elo per system, predicted vs human think time, value correlation vs game
progress."""

from __future__ import annotations

import math
import pathlib

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def plot_accuracy_vs_elo(report: dict, path: pathlib.Path, min_positions: int = 20) -> bool:
    """Bins with fewer than ``min_positions`` positions are left out (report.json keeps them)."""
    acc = report.get("move_accuracy", {})
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, block in acc.items():
        rows = sorted(
            (int(b), r)
            for b, r in block["by_elo"].items()
            if _finite(r["value"]) and r["n"] >= min_positions
        )
        if not rows:
            continue
        x = [b + 50 for b, _ in rows]
        y = [100 * r["value"] for _, r in rows]
        lo = [max(0.0, 100 * (r["value"] - r["ci95"][0])) for _, r in rows]
        hi = [max(0.0, 100 * (r["ci95"][1] - r["value"])) for _, r in rows]
        label = name + (" (subsample)" if block.get("subsample") else "")
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=label)
        drawn = True
    ax.set_xlabel(f"mover Elo (100-Elo bins with ≥ {min_positions} positions)")
    ax.set_ylabel("move-matching accuracy (%)")
    ax.set_title("Move-matching accuracy")
    if drawn:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def plot_think_time(report: dict, path: pathlib.Path) -> bool:
    rows = [r for r in report.get("think_time", {}).get("by_human_time", []) if r["n"]]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [(r["bin"][0] + r["bin"][1]) / 2 for r in rows]
    med = [r["median"] for r in rows]
    ax.plot(x, med, marker="o", label="predicted median")
    ax.fill_between(x, [r["q25"] for r in rows], [r["q75"] for r in rows], alpha=0.3, label="IQR")
    top = max(r["bin"][1] for r in rows)
    ax.plot([0, top], [0, top], "k--", lw=0.8, label="y = x")
    ax.set_xlabel("human think time (s)")
    ax.set_ylabel("predicted think time (s)")
    r = report["think_time"]["pearson_r"]["r"]
    ax.set_title("Think time" + (f" (Pearson r = {r:.3f})" if _finite(r) else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _correlation_ylim(rows: list[dict]) -> tuple[float, float]:
    """y-limits that show every correlation and its interval, negative ones included."""
    points = [0.0, 1.0]
    for r in rows:
        points += [v for v in [r.get("r"), *(r.get("ci95") or [])] if _finite(v)]
    return (max(-1.05, min(points) - 0.05), min(1.05, max(points) + 0.05))


def plot_value_by_progress(report: dict, path: pathlib.Path) -> bool:
    value = report.get("value", {})
    rows = value.get("by_progress", [])
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [10 * r["group"] + 5 for r in rows]
    ax.plot(x, [r["r"] if _finite(r["r"]) else math.nan for r in rows], marker="o", label="Allie")
    sf = value.get("stockfish", {}).get("stockfish_by_progress", [])
    if sf:
        ax.plot(
            [10 * r["group"] + 5 for r in sf],
            [r["r"] if _finite(r["r"]) else math.nan for r in sf],
            marker="s",
            label="Stockfish",
        )
    ax.set_xlabel("game progress (%)")
    ax.set_ylabel("Pearson r with the outcome")
    ax.set_title("Value vs game outcome")
    ax.set_ylim(*_correlation_ylim(rows + sf))
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_plots(report: dict, out_dir: pathlib.Path) -> list[str]:
    """Draw every figure the report has data for; returns the file names written."""
    written = []
    for name, fn in (
        ("accuracy_vs_elo.png", plot_accuracy_vs_elo),
        ("think_time.png", plot_think_time),
        ("value_by_progress.png", plot_value_by_progress),
    ):
        if fn(report, out_dir / name):
            written.append(name)
    return written
