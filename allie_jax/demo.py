"""`make demo`: the whole path on the bundled sample games, on CPU, in a few minutes.

PGN → prepared shards → tiny model trained → validation move accuracy → an evaluation report.
"""

from __future__ import annotations

import pathlib

from allie_jax.data.prepare import PrepareConfig, prepare

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO / "data" / "sample"


def run_demo(
    output: str | pathlib.Path, *, steps: int | None = None, eval_games: int = 100
) -> dict:
    output = pathlib.Path(output)
    inputs = sorted(str(p) for p in SAMPLE_DIR.glob("*.pgn.zst"))
    if not inputs:
        raise FileNotFoundError(f"no sample games under {SAMPLE_DIR}")

    print(f"[1/3] preparing {len(inputs)} sample files -> {output / 'data'}")
    stats = prepare(
        inputs,
        output / "data",
        PrepareConfig(events="all", val_frac=0.05, test_frac=0.05),
    )
    print(
        f"      games read {stats['games_read']}, written {stats['games_written']}, "
        f"dropped {stats['dropped']}, tokens {stats['tokens']}"
    )

    from allie_jax.train import train_and_evaluate, write_summary
    from configs.tiny import get_config

    config = get_config()
    config.data.data_dir = str(output / "data")
    if steps is not None:
        config.train.steps = steps
    print(f"[2/3] training the tiny model for {config.train.steps} steps -> {output / 'workdir'}")
    result = train_and_evaluate(config, output / "workdir")
    print(write_summary(result))

    report = None
    if eval_games:
        from allie_jax.eval.evaluate import EvalConfig, evaluate
        from allie_jax.train.logs import library_logs_to_file

        print(f"[3/3] evaluating on {eval_games} sample games -> {output / 'eval'}")
        # Orbax's restore and the evaluator's INFO lines go to a file, as in training
        with library_logs_to_file(output / "eval", name="evaluate") as log_file:
            report = evaluate(
                output / "workdir",
                SAMPLE_DIR / "lichess_sample.pgn.zst",
                output / "eval",
                EvalConfig(systems=("policy",), max_games=eval_games, random_games=20),
            )
        accuracy = report["move_accuracy"]["policy"]["overall"]
        think_r = report["think_time"]["pearson_r"]["r"]
        print(
            f"      move-matching accuracy {100 * accuracy['value']:.1f}% "
            f"(n={accuracy['n']}), think-time Pearson r {think_r:.3f}"
        )
        print(f"      report: {output / 'eval' / 'report.md'} (library log: {log_file})")
    return {"stats": stats, "train": result, "report": report}
