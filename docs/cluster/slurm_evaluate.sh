#!/bin/bash
# A SLURM job array that runs one launch.evaluate shard per task.
#
#   CHECKPOINT=/path/ckpt GAMES=/path/games.pgn OUT=/shared/run1 \
#     sbatch --array=0-99 docs/cluster/slurm_evaluate.sh [more launch.evaluate flags]
#
# Each task takes its shard from SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT and writes its
# records under the shared $OUT/records. The first task to start indexes the games once, under a
# lock ($OUT/records/index: each game's byte offset, the subsamples, and for a .pgn.zst / .bz2 a
# seekable copy with one zstd frame per game); every task then reads only its own games (or build
# it as a step of its own first: `python -m launch.evaluate --prepare_index` with the tasks' flags,
# and the array with --dependency=afterok:THAT_JOB). The games are read where they are ($GAMES on
# a shared file system, or gs://); STAGE=1 copies them to the node's scratch disk first (the job's identity is the content of the games and of the
# checkpoint, not their paths, so every staged copy belongs to one job; but each copy reads the
# whole file). A preempted or killed task is simply run again (--requeue, or the same sbatch line
# with --array=K): it keeps its committed chunks. The task that completes the job builds
# $OUT/report.json and report.md, once, under a lock; `python -m launch.evaluate --report_only
# $OUT/records --output $OUT` rebuilds it at any time.
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
INPUT=$GAMES
if [ "${STAGE:-0}" = 1 ]; then
  SCRATCH=${SCRATCH_DIR:-${TMPDIR:-/tmp}}/allie-eval-${SLURM_ARRAY_JOB_ID:-0}-$SLURM_ARRAY_TASK_ID
  mkdir -p "$SCRATCH"
  cp "$GAMES" "$SCRATCH/"
  INPUT=$SCRATCH/$(basename "$GAMES")
fi
exec "$PYTHON" -m launch.evaluate \
  --checkpoint "$CHECKPOINT" \
  --games "$INPUT" \
  --output "$OUT" \
  --records "$OUT/records" \
  "$@"
