"""Evaluation jobs at scale: the figures of issue 15, each from the real command line.

    python bench/eval_jobs.py rss        # peak RSS of launch.evaluate, 1,000 vs 10,000 games
    python bench/eval_jobs.py speed      # positions/s of policy and adaptive (tiny model)
    python bench/eval_jobs.py rebuild    # --report_only on the records of the full sample
    python bench/eval_jobs.py shards     # 2 shards merged vs 1 shard, full sample
    python bench/eval_jobs.py bytes [--bytes_games 400] [--bytes_input plain|zst|both]
                                         # input bytes each of 4 tasks reads
    python bench/eval_jobs.py pikl --maia_dir /work/shared/models/maia1 --workdir OUT \
        [--pikl_games 200] [--pikl_positions 400] [--lambdas 0.03,0.1,0.3,1]
                                         # piKL's chess table: OUT/pikl.md and OUT/pikl.png

Every run uses a freshly initialised tiny model saved as a checkpoint (the numbers measure the job,
not a trained model's accuracy). Each figure is printed as one JSON line with the command, the
machine and ``/proc/loadavg`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "lichess_sample.pgn.zst"
ARENAS = REPO.parent / "shared" / "data" / "lichess" / "lichess_arenas_2025-03-25to28_noclk.pgn.zst"


def loadavg() -> str:
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def checkpoint(tmp: pathlib.Path) -> str:
    path = tmp / "tiny"
    if not path.exists():
        code = (
            "import sys; from flax import nnx; from allie_jax.model import AllieModel, ModelConfig;"
            "from allie_jax.model.checkpoint import save_model;"
            "save_model(AllieModel(ModelConfig.named('tiny'), rngs=nnx.Rngs(0)), sys.argv[1])"
        )
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=REPO)
    return str(path)


def evaluate(args: list[str]) -> tuple[float, int, str]:
    """Run launch.evaluate; (wall seconds, peak RSS of the process in MiB, the command)."""
    cmd = [sys.executable, "-m", "launch.evaluate", "--noplots", *args]
    start = time.perf_counter()
    with subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL) as proc:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - start, usage.ru_maxrss // 1024, " ".join(cmd[1:])


def emit(**row) -> None:
    row.update(machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(json.dumps(row), flush=True)


def rss(tmp: pathlib.Path, ckpt: str) -> None:
    for n in (1000, 10000):
        before = loadavg()
        wall, mib, cmd = evaluate(
            [f"--checkpoint={ckpt}", f"--games={ARENAS}", f"--output={tmp}/rss{n}",
             "--systems=policy", f"--max_games={n}", "--random_games=0"]
        )  # fmt: skip
        manifest = json.loads(
            next((tmp / f"rss{n}" / "records").glob("shard-*/manifest.json")).read_text()
        )
        rows = sum(c["rows"] for c in manifest["chunks"])
        rwall, rmib, _ = evaluate([f"--report_only={tmp}/rss{n}/records", f"--output={tmp}/r{n}"])
        emit(figure="peak_rss", games=n, positions=rows, peak_rss_mib=mib,
             scoring_peak_rss_mib=manifest["peak_rss_mib"], report_only_peak_rss_mib=rmib,
             report_only_s=round(rwall, 1), wall_s=round(wall, 1), command=cmd,
             loadavg_before=before, loadavg_after=loadavg())  # fmt: skip


def _chunk_rates(records: pathlib.Path, key: str, column: str) -> list[float]:
    """Positions/s of each chunk after the first (compilation lands in the first)."""
    import pyarrow.parquet as pq

    manifest = json.loads(next(records.glob("shard-*/manifest.json")).read_text())
    rates = []
    for c in manifest["chunks"][1:]:
        table = pq.read_table(next(records.glob("shard-*/" + c["file"])), columns=[column])
        n = sum(table.column(column).to_pylist())
        rates.append(n / c["timings_s"][key])
    return rates


def speed(tmp: pathlib.Path, ckpt: str) -> None:
    before = loadavg()
    out = tmp / "speed_policy"
    _, _, cmd = evaluate(
        [f"--checkpoint={ckpt}", f"--games={SAMPLE}", f"--output={out}", "--systems=policy",
         "--max_games=300", "--chunk_games=50", "--random_games=0"]
    )  # fmt: skip
    rates = _chunk_rates(out / "records", "policy_pass_s", "policy.scored")
    emit(figure="positions_per_s", system="policy", per_chunk=[round(r) for r in rates],
         median=round(sorted(rates)[len(rates) // 2]), command=cmd, loadavg_before=before,
         loadavg_after=loadavg())  # fmt: skip
    before = loadavg()
    out = tmp / "speed_adaptive"
    _, _, cmd = evaluate(
        [f"--checkpoint={ckpt}", f"--games={SAMPLE}", f"--output={out}",
         "--systems=policy,adaptive", "--search_positions=all", "--max_games=12",
         "--chunk_games=3", "--search_batch_size=32", "--random_games=0"]
    )  # fmt: skip
    rates = _chunk_rates(out / "records", "adaptive_s", "adaptive.scored")
    emit(figure="positions_per_s", system="adaptive", per_chunk=[round(r, 1) for r in rates],
         median=round(sorted(rates)[len(rates) // 2], 1), command=cmd, loadavg_before=before,
         loadavg_after=loadavg())  # fmt: skip


def rebuild(tmp: pathlib.Path, ckpt: str) -> pathlib.Path:
    out = tmp / "full"
    if not (out / "report.json").exists():
        evaluate(
            [f"--checkpoint={ckpt}", f"--games={SAMPLE}", f"--output={out}",
             "--systems=policy,greedy", "--max_games=100000", "--random_games=20"]
        )  # fmt: skip
    before = loadavg()
    wall, mib, cmd = evaluate([f"--report_only={out}/records", f"--output={tmp}/rebuilt"])
    same = (tmp / "rebuilt" / "report.json").read_text() == (out / "report.json").read_text()
    manifest = json.loads(next((out / "records").glob("shard-*/manifest.json")).read_text())
    rows = sum(c["rows"] for c in manifest["chunks"])
    emit(figure="report_rebuild", rows=rows, wall_s=round(wall, 2), peak_rss_mib=mib,
         identical_to_direct_run=same, command=cmd, loadavg_before=before,
         loadavg_after=loadavg())  # fmt: skip
    return out


def shards(tmp: pathlib.Path, ckpt: str) -> None:
    one = rebuild(tmp, ckpt)
    before = loadavg()
    cmds = []
    for k in range(2):
        _, _, cmd = evaluate(
            [f"--checkpoint={ckpt}", f"--games={SAMPLE}", f"--output={tmp}/two",
             "--systems=policy,greedy", "--max_games=100000", "--random_games=20",
             "--num_shards=2", f"--shard_index={k}"]
        )  # fmt: skip
        cmds.append(cmd)
    from allie_jax.eval import records

    a = records.load_records(one / "records").human
    b = records.load_records(tmp / "two" / "records").human
    ra = json.loads((one / "report.json").read_text())
    rb = json.loads((tmp / "two" / "report.json").read_text())
    for r in (ra, rb):
        for k in ("timings_s", "elapsed_s", "policy_positions_per_s", "records", "shards"):
            r["meta"].pop(k)
        r["meta"]["config"].pop("num_shards")
    per_shard = [
        sum(1 for _ in (tmp / "two" / "records").glob(f"shard-0000{k}-of-00002/chunk-*"))
        for k in range(2)
    ]
    emit(figure="two_shards_vs_one", rows=a.num_rows, records_equal=a.equals(b),
         reports_equal=ra == rb, chunks_per_shard=per_shard, commands=cmds,
         loadavg_before=before, loadavg_after=loadavg())  # fmt: skip


def task_bytes(tmp: pathlib.Path, ckpt: str, games_n: int = 400, inputs: str = "both") -> None:
    """4 tasks of one job (JOB_COMPLETION_INDEX 0..3, one after another) on the arenas file, as
    the .pgn.zst it is and decompressed to a plain .pgn: the input bytes each read (the index
    builder reads the whole file once, and for the .zst writes the seekable copy; the others read
    the index and their own games), against streaming (--index_dir none), where every task reads
    the whole input."""
    import zstandard

    plain = tmp / "arenas.pgn"
    if not plain.exists():
        with open(ARENAS, "rb") as f, open(plain, "wb") as g:
            zstandard.ZstdDecompressor().copy_stream(f, g)
    runs = []
    if inputs in ("plain", "both"):
        runs += [("indexed", plain, []), ("streamed", plain, ["--index_dir=none"])]
    if inputs in ("zst", "both"):
        runs += [("zst_indexed", ARENAS, []), ("zst_streamed", ARENAS, ["--index_dir=none"])]
    for mode, games, extra in runs:
        size = games.stat().st_size
        before = loadavg()
        out = tmp / f"bytes_{mode}"
        cmds = []
        for k in range(4):
            os.environ["JOB_COMPLETION_INDEX"] = str(k)
            try:
                _, _, cmd = evaluate(
                    [f"--checkpoint={ckpt}", f"--games={games}", f"--output={out}",
                     "--systems=policy", f"--max_games={games_n}",
                     "--num_shards=4", "--random_games=0", *extra]
                )  # fmt: skip
            finally:
                os.environ.pop("JOB_COMPLETION_INDEX")
            cmds.append(f"JOB_COMPLETION_INDEX={k} {cmd}")
        per_task = []
        for k in range(4):
            m = json.loads(
                (out / "records" / f"shard-0000{k}-of-00004" / "manifest.json").read_text()
            )
            got = m.get("input_bytes_read")
            per_task.append(
                {"index": got["index"], "games": got["games"], "built_index": got["index_built"],
                 **({"copy_written": got["copy_written"]} if "copy_written" in got else {})}
                if got
                else {"whole_input_passes": 1, "bytes": size}
            )  # fmt: skip
        meta = out / "records" / "index" / "index.json"
        index = json.loads(meta.read_text()) if meta.exists() else {}
        emit(figure="task_input_bytes", mode=mode, input=str(games), input_bytes=size,
             max_games=games_n, copy_bytes=index.get("copy_bytes"), per_task=per_task,
             commands=cmds, loadavg_before=before, loadavg_after=loadavg())  # fmt: skip


def pikl(tmp: pathlib.Path, args: argparse.Namespace) -> None:
    """piKL's chess table: one launch.evaluate run per λ with maia-R and maia-R+search (R = 1100,
    1500, 1900; each net its own prior and anchor) on the bundled games; the paired differences
    become OUT/pikl.md and OUT/pikl.png (``allie_jax.eval.pikl_table``)."""
    from allie_jax.eval import pikl_table

    nets = pikl_table.NETS
    systems = ",".join([f"maia-{r}" for r in nets] + [f"maia-{r}+search" for r in nets])
    reports, cmds = {}, []
    before = loadavg()
    for lam in [float(x) for x in args.lambdas.split(",")]:
        out = tmp / f"pikl-{lam:g}"
        if not (out / "report.json").exists():
            _, _, cmd = evaluate(
                [f"--games={SAMPLE}", f"--output={out}", f"--systems={systems}",
                 f"--maia_dir={args.maia_dir}", f"--pikl_lambda={lam}",
                 f"--max_games={args.pikl_games}", f"--search_positions={args.pikl_positions}",
                 "--random_games=0"]
            )  # fmt: skip
            cmds.append(cmd)
        reports[lam] = json.loads((out / "report.json").read_text())
    table = pikl_table.rows(reports, nets)
    (tmp / "pikl.md").write_text(pikl_table.markdown(table))
    pikl_table.plot(table, tmp / "pikl.png")
    emit(figure="pikl_table", table=str(tmp / "pikl.md"), plot=str(tmp / "pikl.png"),
         commands=cmds, loadavg_before=before, loadavg_after=loadavg())  # fmt: skip
    print(pikl_table.markdown(table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "figure", choices=["rss", "speed", "rebuild", "shards", "bytes", "pikl", "all"]
    )
    parser.add_argument("--bytes_games", type=int, default=400, help="bytes: games read")
    parser.add_argument(
        "--bytes_input", choices=["plain", "zst", "both"], default="both", help="bytes: inputs"
    )
    parser.add_argument("--maia_dir", default=str(REPO.parent / "shared" / "models" / "maia1"))
    parser.add_argument("--lambdas", default="0.03,0.1,0.3,1", help="pikl: the λ sweep")
    parser.add_argument("--pikl_games", type=int, default=200, help="pikl: games read")
    parser.add_argument("--pikl_positions", type=int, default=400, help="pikl: searched positions")
    parser.add_argument("--workdir", default=None, help="Keep outputs here (default: a temp dir).")
    args = parser.parse_args()
    tmp = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="eval-jobs-"))
    tmp.mkdir(parents=True, exist_ok=True)
    if args.figure == "pikl":
        pikl(tmp, args)
        return
    ckpt = checkpoint(tmp)
    figures = {"rss": rss, "speed": speed, "rebuild": rebuild, "shards": shards,
               "bytes": lambda t, c: task_bytes(t, c, args.bytes_games, args.bytes_input)}  # fmt: skip
    for name, run in figures.items():
        if args.figure in (name, "all"):
            run(tmp, ckpt)


if __name__ == "__main__":
    main()
