"""report.md: the paper's offline tables rendered from the report dict (report.json's content).

Rates print as percentages with their 95 % interval, clustered by game (or by player: the report's
``meta.cluster``); a cell resting on fewer than 30 games is marked ‡. Paired differences print in
percentage points. Correlations print as r [lo, hi] with the same cluster bootstrap (a whole
game, or player, resampled at once), and the games they rest on. Anything that could not be measured
(no positions, constant series) prints as "–".
"""

from __future__ import annotations

import math

from allie_jax.eval.positions import SPECIAL_MOVES

PAPER = {  # the paper's anchors (Allie, arXiv 2410.03893), shown next to ours
    "policy": "55.7",
    "adaptive": "55.9",
    "search": "55.9",
}


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


FEW = 30  # fewer clusters than this: the cell is marked


def _few(r: dict) -> str:
    games = r.get("games")
    return "‡" if games is not None and games < FEW else ""


def pct(r: dict | None) -> str:
    """ "55.7 % [55.6, 55.8] (n=1,234)" from a rate dict (‡: fewer than 30 games)."""
    if not r or not _ok(r.get("value")):
        return "–"
    lo, hi = r["ci95"]
    ci = f" [{100 * lo:.1f}, {100 * hi:.1f}]" if _ok(lo) and _ok(hi) else ""
    return f"{100 * r['value']:.1f}%{ci} (n={r['n']:,}){_few(r)}"


def diff_pts(value, lo, hi, games=None) -> str:
    """A paired difference in percentage points with its interval."""
    if not _ok(value):
        return "–"
    ci = f" [{100 * lo:+.1f}, {100 * hi:+.1f}]" if _ok(lo) and _ok(hi) else ""
    few = "‡" if games is not None and games < FEW else ""
    return f"{100 * value:+.1f}{ci}{few}"


def nats(m: dict | None) -> str:
    if not m or not _ok(m.get("value")):
        return "–"
    lo, hi = m["ci95"]
    ci = f" [{lo:.3f}, {hi:.3f}]" if _ok(lo) and _ok(hi) else ""
    return f"{m['value']:.3f}{ci}{_few(m)}"


def nats_diff(m: dict | None) -> str:
    if not m or not _ok(m.get("value")):
        return "–"
    lo, hi = m["ci95"]
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if _ok(lo) and _ok(hi) else ""
    return f"{m['value']:+.3f}{ci}{_few(m)}"


def mass(m: dict | None) -> str:
    if not m or not _ok(m.get("value")):
        return "–"
    lo, hi = m["ci95"]
    return f"{100 * m['value']:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}]"


def corr(c: dict | None) -> str:
    if not c or not _ok(c.get("r")):
        return "–"
    lo, hi = c["ci95"]
    ci = f" [{lo:.3f}, {hi:.3f}]" if _ok(lo) and _ok(hi) else ""
    games = c.get("games")
    on = f", {games:,} games" if isinstance(games, int) else ""
    return f"{c['r']:.3f}{ci}{_few(c)} (n={c['n']:,}{on})"


def _num(x, fmt: str = ".2f") -> str:
    return format(x, fmt) if _ok(x) else "–"


def to_markdown(report: dict) -> str:
    meta = report.get("meta", {})
    lines = ["# Allie offline evaluation", ""]
    if meta:
        lines += [
            f"- checkpoint: `{meta.get('checkpoint')}`",
            f"- games: {meta.get('games')} from `{meta.get('games_file')}` "
            f"({meta.get('positions_scored', 0):,} positions scored, "
            f"{meta.get('positions_truncated', 0):,} beyond the context window)",
            f"- move matching: {meta.get('accuracy_rule', '')}",
            f"- elapsed: {_num(meta.get('elapsed_s'), '.1f')} s; policy pass "
            f"{_num(meta.get('policy_positions_per_s'), ',.0f')} positions/s (compilation included)",
            "",
        ]

    for w in report.get("warnings", []):
        lines += [f"> **Warning:** {w}", ""]
    if meta.get("intervals"):
        lines += [
            f"Intervals of rates, means and correlations: {meta['intervals']}; ‡ marks a cell on "
            f"fewer than {FEW}. A correlation's interval resamples whole clusters too (a game's "
            "positions are not independent draws): wider than Fisher's interval over positions "
            "when they move together.",
            "",
        ]

    acc = report.get("move_accuracy", {})
    if acc:
        lines += ["## Move-matching accuracy", ""]
        lines += [
            "| system | all moves | cross-entropy (nats) | "
            + " | ".join(SPECIAL_MOVES)
            + " | paper |"
        ]
        lines += ["|---|---|---|" + "---|" * len(SPECIAL_MOVES) + "---|"]
        for name, block in acc.items():
            label = name + (" (subsample)" if block.get("subsample") else "")
            cells = [pct(block["special"].get(k)) for k in SPECIAL_MOVES]
            lines.append(
                f"| {label} | {pct(block['overall'])} | {nats(block.get('cross_entropy'))} | "
                + " | ".join(cells)
                + f" | {PAPER.get(name, '–')} |"
            )
        paired = report.get("paired", [])
        if paired:
            lines += [
                "",
                "### Paired: each system minus its baseline on the same positions",
                "",
                "| system | baseline | positions | games | system | baseline | difference (pts) "
                "| cross-entropy difference |",
                "|---|---|---:|---:|---|---|---|---|",
            ]
            for p in paired:
                sig = " *" if p.get("significant") else ""
                lines.append(
                    f"| {p['system']} | {p['baseline']} | {p['positions']:,} | {p['games']:,} | "
                    f"{pct(p['system_accuracy'])} | {pct(p['baseline_accuracy'])} | "
                    f"{diff_pts(p['difference'], p['ci_low'], p['ci_high'], p['games'])}{sig} | "
                    f"{nats_diff(p.get('cross_entropy_difference'))} |"
                )
            lines.append("\n\\* the interval excludes 0.")
        for name, block in acc.items():
            if "mean_sims" in block:
                lines.append(f"\n{name}: mean simulations {_num(block.get('mean_sims'), '.1f')}")
        bins = sorted({int(b) for block in acc.values() for b in block["by_elo"]})
        if bins:
            lines += ["", "### By mover Elo (100-Elo bins)", ""]
            lines += ["| Elo | " + " | ".join(acc) + " |", "|---|" + "---|" * len(acc)]
            for b in bins:
                cells = [pct(block["by_elo"].get(str(b))) for block in acc.values()]
                lines.append(f"| {b} | " + " | ".join(cells) + " |")
        if paired and bins:
            lines += ["", "### Paired differences by mover Elo (points)", ""]
            heads = [f"{p['system']} − {p['baseline']}" for p in paired]
            lines += ["| Elo | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
            for b in bins:
                cells = []
                for p in paired:
                    d = p["by_elo"].get(str(b))
                    cells.append(diff_pts(d["value"], *d["ci95"], d.get("games")) if d else "–")
                lines.append(f"| {b} | " + " | ".join(cells) + " |")
        lines.append("")

    legal = report.get("legal")
    if legal:
        lines += ["## Legal moves", "", "| positions | top move legal | invalid probability mass |"]
        lines += ["|---|---|---|"]
        for source in ("human", "random"):
            if source not in legal:
                continue
            for subset, label in (("all", ""), ("check", " (under check)")):
                b = legal[source][subset]
                lines.append(
                    f"| {source}{label} | {pct(b['top_legal'])} | {mass(b['invalid_mass'])} |"
                )
        lines += ["", "Paper: 100.0 / 100.0 / 99.9 / 96.6 % top move legal.", ""]

    tt = report.get("think_time")
    if tt:
        lines += [
            "## Think time",
            "",
            f"Pearson r (predicted vs human seconds): {corr(tt['pearson_r'])} — paper 0.697.",
            "",
            "| human seconds | n | predicted median | IQR |",
            "|---|---:|---:|---|",
        ]
        for row in tt["by_human_time"]:
            lo, hi = row["bin"]
            lines.append(
                f"| {lo:g}–{hi:g} | {row['n']} | {_num(row['median'])} | "
                f"{_num(row['q25'])}–{_num(row['q75'])} |"
            )
        lines.append("")

    rs = report.get("resign")
    if rs:
        lines += [
            "## Resignation",
            "",
            f"- TPR (final boards of games lost by resignation, loser to move): {pct(rs['tpr'])} "
            "— paper 86.4%",
            f"- FPR (every other board): {pct(rs['fpr'])} — paper 0.1%",
            f"- resigned games: {rs['resigned_games']} "
            f"({rs['resigned_games_winner_to_move']} with the winner to move, not scored)",
            "",
        ]

    val = report.get("value")
    if val:
        lines += [
            "## Value",
            "",
            f"Pearson r of value with the outcome, all positions: {corr(val['overall'])}",
            "",
            "| game progress | Allie r | Stockfish r |",
            "|---|---|---|",
        ]
        sf = val.get("stockfish", {}).get("stockfish_by_progress", [])
        sf_by = {row["group"]: row for row in sf}
        for row in val["by_progress"]:
            d = row["group"]
            lines.append(f"| {10 * d}–{10 * d + 10}% | {corr(row)} | {corr(sf_by.get(d))} |")
        if "stockfish" in val:
            s = val["stockfish"]
            lines += [
                "",
                f"Stockfish subsample ({s['positions']} positions, {s['nodes']:,} nodes): "
                f"Stockfish vs outcome {corr(s['stockfish_vs_outcome'])}; Allie vs outcome "
                f"{corr(s['value_vs_outcome'])}; Allie vs Stockfish {corr(s['value_vs_stockfish'])}",
            ]
        lines.append("")

    cal = report.get("calibration")
    if cal:
        from allie_jax.eval.calibration import calibration_markdown

        lines += ["## Skill calibration", "", calibration_markdown(cal), ""]

    plots = meta.get("plots")
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)
