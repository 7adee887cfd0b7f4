"""The compile check's report as text for a terminal (the JSON is ``check.compile_check``'s dict)."""

from __future__ import annotations

from typing import Any

from allie_jax.compile_check.hlo import COLLECTIVES


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f} GiB"


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _flops(f: float | None) -> str:
    return "-" if f is None else f"{f / 1e12:.3f} TFLOP"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def collectives_line(program: dict[str, Any]) -> str:
    parts = [
        f"{k} {program['collectives'][k]} ({gib(program['collective_bytes'][k])})"
        for k in COLLECTIVES
        if program["collectives"].get(k)
    ]
    return ", ".join(parts) or "none"


def format_report(report: dict[str, Any]) -> str:
    model, chip = report["model"], report["chip"]
    mesh = " x ".join(f"{k} {v}" for k, v in report["mesh"].items())
    across = {k: v for k, v in report.get("mesh_dcn", {}).items() if v > 1}
    if across:
        mesh += " (across slices: " + ", ".join(f"{k} {v}" for k, v in across.items()) + ")"
    search = (
        f"search {model['search_batch']} roots, cache {model['search_cache_width']} tokens, "
        "one chip"
        if model.get("search_batch")
        else "search not compiled"
    )
    lines = [
        f"{model['name']} ({model['params'] / 1e6:.1f}M params, {model['dtype']}) on "
        f"{report['topology']}: {report['devices']} x {chip['device_kind']}, "
        f"{report['hosts']} host(s), {report['slices']} slice(s); mesh {mesh}",
        f"attention {model['attention']}, remat {model['remat']}, batch {model['batch_size']} x "
        f"{model['seq_len']} tokens in {model['grad_accum']} micro-batch(es); {search}",
        f"per device, against {gib(report['hbm_bytes'])} HBM, "
        f"{chip['peak_flops'] / 1e12:.0f} TFLOP/s, {chip['hbm_bandwidth'] / 1e9:.0f} GB/s:",
    ]
    header = (
        f"{'program':8} {'fits':5} {'argument':>11} {'output':>11} {'temp':>11} {'total':>11} "
        f"{'FLOPs/step':>14} {'roofline':>10} {'XLA opt.':>10} {'MFU':>6} {'compile':>8}"
    )
    lines.append(header)
    for name, p in report["programs"].items():
        b = p["bytes_per_device"]
        lines.append(
            f"{name:8} {'yes' if p['fits'] else 'NO':5} {gib(b.get('argument')):>11} "
            f"{gib(b.get('output')):>11} {gib(b.get('temp')):>11} {gib(b.get('total')):>11} "
            f"{_flops(p['flops_per_step']):>14} {_seconds(p['predicted_step_seconds']):>10} "
            f"{_seconds(p.get('xla_optimal_seconds')):>10} {_pct(p['predicted_mfu']):>6} "
            f"{p['compile_seconds']:>7.1f}s"
        )
    for name, p in report["programs"].items():
        if p.get("error"):
            lines.append(f"{name}: the compiler refused it: {p['error']}")
            continue
        lines.append(f"collectives per step, {name}: {collectives_line(p)}")
        if p["loops"].get("run_time_bound"):
            lines.append(
                f"{name}: {p['loops']['run_time_bound']} loop(s) with a run-time bound counted "
                "once (FLOPs and time are per iteration of them)"
            )
    verdict = "fits" if report["fits"] else "DOES NOT FIT"
    lines.append(f"{verdict}; compiled in {report['compile_seconds']:.1f} s (jax {report['jax']})")
    return "\n".join(lines)
