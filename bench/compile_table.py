"""Fit, bytes per chip, predicted MFU and collectives of the paper's configs on every named TPU
slice, from ``launch.compile_check`` (one subprocess per row, so no compile reuses another's
caches and one crash costs one row).

Rows: ``allie_medium`` and ``allie_large`` at their config defaults on each topology, then on
v5e-16 every combination of attention (splash / xla) x remat (none / full) x grad_accum (1 / 2).
Real-size compiles take minutes each on a CPU host (allie_medium unrolled on v5e-16: ~1,100 s
without ``scan_layers``); run it alone, e.g.

    flock /work/bench.lock .venv-tpu/bin/python bench/compile_table.py \
        --markdown bench/compile_table.md --json bench/compile_table.json

Both files are rewritten after every row, so an interrupted run keeps what it finished.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ("allie_medium", "allie_large")
TOPOLOGIES = ("v4-8", "v5e-16", "v5e-256", "v5p-8", "v5p-128", "2xv5e-16")
VARIANT_TOPOLOGY = "v5e-16"
VARIANTS = {
    "attention_impl": ("splash", "xla"),
    "remat": ("none", "full"),
    "grad_accum": (1, 2),
}
_SECTIONS = {"attention_impl": "model", "remat": "model", "grad_accum": "train"}


def rows(configs, topologies) -> list[tuple[str, str, dict]]:
    """(config, topology, overrides): defaults everywhere, then the v5e-16 variants."""
    out = [(c, t, {}) for c in configs for t in topologies]
    for c in configs:
        for values in itertools.product(*VARIANTS.values()):
            out.append((c, VARIANT_TOPOLOGY, dict(zip(VARIANTS, values, strict=True))))
    return out


def run_row(python, config, topology, overrides, programs, timeout) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report_path = pathlib.Path(tmp) / "report.json"
        cmd = [
            str(python),
            "-m",
            "launch.compile_check",
            "--config",
            f"configs/{config}.py",
            "--topology",
            topology,
            "--programs",
            programs,
            "--json",
            str(report_path),
        ]
        cmd += [f"--config.{_SECTIONS[k]}.{k}={v}" for k, v in overrides.items()]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
            rc, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            rc, stderr = None, f"timed out after {timeout} s"
        row = {
            "config": config,
            "topology": topology,
            "overrides": overrides,
            "rc": rc,
            "seconds": time.perf_counter() - start,
        }
        if report_path.exists():
            row["report"] = json.loads(report_path.read_text())
        else:
            lines = stderr.strip().splitlines()
            last = lines[-1] if lines else f"exit status {rc}"
            row["error"] = last.removeprefix("launch.compile_check: error: ")
        return row


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def markdown(results: list[dict]) -> str:
    lines = [
        "| config | topology | variant | fit | GiB/chip (train) | HBM GiB | pred. MFU | "
        "step (roofline) | collectives (train, per step) | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        variant = ", ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "defaults"
        rep = r.get("report")
        if rep is None:
            lines.append(
                f"| {r['config']} | {r['topology']} | {variant} | error: {r['error']} | | | | | | |"
            )
            continue
        coll = ", ".join(f"{k} {n}" for k, n in rep["collectives"].items() if n) or "none"
        mfu = "-" if rep["predicted_mfu"] is None else f"{100 * rep['predicted_mfu']:.1f}%"
        step = rep["predicted_step_seconds"]
        lines.append(
            f"| {r['config']} | {r['topology']} | {variant} | "
            f"{'yes' if rep['fits'] else 'NO'} | {_gib(rep['bytes_per_device']['total'])} | "
            f"{_gib(rep['hbm_bytes'])} | {mfu} | "
            f"{'-' if step is None else f'{step * 1e3:.1f} ms'} | {coll} | "
            f"{rep['compile_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(REPO / ".venv-tpu" / "bin" / "python"))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--programs", default="train,eval,search", help="for the default rows")
    parser.add_argument("--variant_programs", default="train,eval", help="for the v5e-16 rows")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per row")
    parser.add_argument("--markdown", default=str(REPO / "bench" / "compile_table.md"))
    parser.add_argument("--json", default=str(REPO / "bench" / "compile_table.json"))
    args = parser.parse_args()
    if not pathlib.Path(args.python).exists():
        print(f"compile_table: error: --python {args.python} does not exist", file=sys.stderr)
        return 2
    results = []
    for config, topology, overrides in rows(args.configs.split(","), args.topologies.split(",")):
        programs = args.variant_programs if overrides else args.programs
        row = run_row(args.python, config, topology, overrides, programs, args.timeout)
        results.append(row)
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
        pathlib.Path(args.markdown).write_text(markdown(results))
        print(markdown([row]).splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
