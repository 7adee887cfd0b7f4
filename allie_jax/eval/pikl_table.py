"""piKL's chess table from evaluation reports: KL-regularised search on Maia against the raw net.

For each λ (``pikl_lambda``) one ``launch.evaluate`` run scores ``maia-R`` and ``maia-R+search``
for R in 1100, 1500, 1900 (each net is both the search's prior and its anchor); every report's
``paired`` entries (``maia-R+search`` − ``maia-R`` on the same positions, game-clustered) give the
table: top-1 accuracy change and cross-entropy change, overall and per mover-rating bin, and the
plot of the seed's Figure 2 (accuracy change against the mover's rating, one line per net).
The driver that runs the evaluations is ``bench/eval_jobs.py pikl``.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence

NETS = (1100, 1500, 1900)
BIN = 200  # mover-rating bins of the table and the plot (the report's 100-Elo bins, pooled)
MIN_PLOT = 10  # bins with fewer positions are in the table but not on the plot


def rows(reports: Mapping[float, dict], nets: Sequence[int] = NETS) -> list[dict]:
    """One row per (net, λ): the paired difference overall and per rating bin."""
    out = []
    for lam, report in sorted(reports.items()):
        pairs = {(p["system"], p["baseline"]): p for p in report.get("paired", [])}
        for net in nets:
            p = pairs.get((f"maia-{net}+search", f"maia-{net}"))
            if p is None:
                continue
            bins: dict[int, list[float]] = {}
            for b, d in p["by_elo"].items():  # pool 100-Elo bins into BIN-wide ones
                lo = int(b) // BIN * BIN
                if d["n"]:
                    acc = bins.setdefault(lo, [0.0, 0.0])
                    acc[0] += d["value"] * d["n"]
                    acc[1] += d["n"]
            out.append(
                {
                    "net": net,
                    "lambda": lam,
                    "positions": p["positions"],
                    "games": p["games"],
                    "raw_accuracy": p["baseline_accuracy"]["value"],
                    "search_accuracy": p["system_accuracy"]["value"],
                    "difference": p["difference"],
                    "ci": [p["ci_low"], p["ci_high"]],
                    "ce_difference": p["cross_entropy_difference"]["value"],
                    "ce_ci": p["cross_entropy_difference"]["ci95"],
                    "by_bin": {b: (s / n, int(n)) for b, (s, n) in sorted(bins.items())},
                }
            )
    return out


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}"


def markdown(table: list[dict]) -> str:
    """The table: per net and λ, raw and search accuracy, the paired change with its game-clustered
    interval, the cross-entropy change, and the accuracy change per mover-rating bin."""
    bins = sorted({b for r in table for b in r["by_bin"]})
    head = (
        "| net | λ | positions | games | raw top-1 | search top-1 | change (pts) [95% CI] | "
        "CE change (nats) [95% CI] | " + " | ".join(f"{b}–{b + BIN - 1}" for b in bins) + " |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---|---|" + "---:|" * len(bins)]
    for r in table:
        lo, hi = r["ci"]
        clo, chi = r["ce_ci"]
        cells = []
        for b in bins:
            v = r["by_bin"].get(b)
            cells.append(f"{_pct(v[0])} (n={v[1]})" if v else "–")
        ce = "–" if math.isnan(r["ce_difference"]) else f"{r['ce_difference']:+.3f}"
        ce_ci = "" if math.isnan(clo) else f" [{clo:+.3f}, {chi:+.3f}]"
        lines.append(
            f"| maia-{r['net']} | {r['lambda']:g} | {r['positions']} | {r['games']} | "
            f"{100 * r['raw_accuracy']:.1f}% | {100 * r['search_accuracy']:.1f}% | "
            f"{_pct(r['difference'])} [{_pct(lo)}, {_pct(hi)}] | {ce}{ce_ci} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: pathlib.Path) -> None:
    """Accuracy change (search − raw, points) against the mover's rating: one line per net and λ
    (the seed's Figure 2, with λ in place of its c_puct)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {1100: "tab:blue", 1500: "tab:orange", 1900: "tab:green"}
    lams = sorted({r["lambda"] for r in table})
    styles = ["-", "--", ":", "-."]
    for r in table:
        kept = [(b, v) for b, (v, n) in r["by_bin"].items() if n >= MIN_PLOT]
        xs = [b + BIN / 2 for b, _ in kept]
        ys = [100 * v for _, v in kept]
        style = styles[lams.index(r["lambda"]) % len(styles)]
        ax.plot(xs, ys, style, marker="o", color=colors.get(r["net"]),
                label=f"maia-{r['net']}, λ={r['lambda']:g}")  # fmt: skip
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("mover rating")
    ax.set_ylabel("top-1 accuracy change, search − raw (points)")
    ax.set_title(f"KL-regularised search on Maia vs the raw net (bins with ≥ {MIN_PLOT} positions)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
