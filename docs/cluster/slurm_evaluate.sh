#!/bin/bash
# A SLURM job array that runs one launch.evaluate shard per task.
#
#   CHECKPOINT=/path/ckpt GAMES=/path/games.pgn OUT=/shared/run1 \
#     sbatch --array=0-99 docs/cluster/slurm_evaluate.sh [more launch.evaluate flags]
#
# Each task stages the games on its node's scratch disk (the job's identity is the content of the
# games and of the checkpoint, not their paths, so every staged copy belongs to one job), takes
# its shard from SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT, and writes its records under the
# shared $OUT/records. A preempted or killed task is simply run again (--requeue, or the same
# sbatch line with --array=K): it keeps its committed chunks. The task that completes the job
# builds $OUT/report.json and report.md, once, under a lock; `python -m launch.evaluate
# --report_only $OUT/records --output $OUT` rebuilds it at any time.
#SBATCH --job-name=allie-eval
#SBATCH --array=0-99
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:1
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=allie-eval-%A_%a.log
set -euo pipefail
: "${CHECKPOINT:?set CHECKPOINT}" "${GAMES:?set GAMES}" "${OUT:?set OUT}"
: "${SLURM_ARRAY_TASK_ID:?run under sbatch --array}"
PYTHON=${PYTHON:-python}
SCRATCH=${SCRATCH_DIR:-${TMPDIR:-/tmp}}/allie-eval-${SLURM_ARRAY_JOB_ID:-0}-$SLURM_ARRAY_TASK_ID
mkdir -p "$SCRATCH"
cp "$GAMES" "$SCRATCH/"
exec "$PYTHON" -m launch.evaluate \
  --checkpoint "$CHECKPOINT" \
  --games "$SCRATCH/$(basename "$GAMES")" \
  --output "$OUT" \
  --records "$OUT/records" \
  "$@"
