#!/usr/bin/env bash
# The first-GPU check (issue 10): under 8 minutes on one H200, from the repository root:
#   bash bench/gpu_check.sh            (needs `pip install -e '.[gpu]'`)
# Prints: the attention kernel `auto` picks and whether it agrees with XLA on packed rows, forward
# and backward (bench/attention_check.py); allie_medium bf16
# tokens/s, MFU and peak device memory at 131,072 tokens per step (256 x 512, allie_medium's
# defaults: one micro-batch, remat full; `launch.compile_check --topology h200-1` says it fits) through
# the real pipeline (sample shards -> grain workers -> DeviceFeed -> step), beside the pipeline and
# the step alone; search sims/s for allie_medium in $DTYPE (bench/search.py) at batch 1, the way
# one person plays, with LEAF_BATCHES leaves per game per step (SearchConfig.leaf_batch, default
# 1 8 32), and at batch 256 (one leaf per game).
# Dry run on a CPU with small sizes:
#   SIZE=tiny BATCH=8 ACCUM=1 STEPS=1 ROUNDS=1 WORKERS=0 SEARCH_SIZE=tiny SEARCH_BATCH=4 \
#     DTYPE=float32 LEAF_BATCHES="1 4" bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
SIZE=${SIZE:-allie_medium}
BATCH=${BATCH:-256}
ACCUM=${ACCUM:-1}
REMAT=${REMAT:-full}
STEPS=${STEPS:-5}
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-8}
DTYPE=${DTYPE:-bfloat16}
SEARCH_SIZE=${SEARCH_SIZE:-allie_medium}
SEARCH_BATCH=${SEARCH_BATCH:-256}
LEAF_BATCHES=${LEAF_BATCHES:-1 8 32}
ATTENTION=${ATTENTION:-auto}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
step() { echo; echo "== $1 ($(( $(date +%s) - start )) s)"; }

step "devices"
$PY -c "import jax; print(jax.devices()); print('backend', jax.default_backend())"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true

step "attention kernel"
if ! timeout 120 $PY bench/attention_check.py; then
  echo "the picked kernel failed or disagreed: measuring with XLA attention instead"
  ATTENTION=xla
fi

step "training: $SIZE $DTYPE, $BATCH x 512 tokens/step, grad_accum $ACCUM, remat $REMAT, $WORKERS grain workers"
timeout 330 $PY bench/train.py --sizes "$SIZE" --dtype "$DTYPE" --batch "$BATCH" \
  --grad_accum "$ACCUM" --seq_len 512 --steps "$STEPS" --rounds "$ROUNDS" --workers "$WORKERS" \
  --pipeline_batches 8 --attention_impl "$ATTENTION" --remat "$REMAT" \
  || echo "training bench failed or timed out (status $?)"

step "search: $SEARCH_SIZE $DTYPE at batch 1, leaf_batch $LEAF_BATCHES"
# shellcheck disable=SC2086  # LEAF_BATCHES is a list of numbers
timeout 200 $PY bench/search.py --sizes "$SEARCH_SIZE" --batches "$SEARCH_SIZE=1" \
  --leaf-batches $LEAF_BATCHES --dtype "$DTYPE" --plies 30 --presets search --rounds 3 \
  --baseline-games 1 \
  || echo "search bench failed or timed out (status $?)"

step "search: $SEARCH_SIZE $DTYPE at batch $SEARCH_BATCH"
timeout 150 $PY bench/search.py --sizes "$SEARCH_SIZE" --batches "$SEARCH_SIZE=$SEARCH_BATCH" \
  --dtype "$DTYPE" --plies 30 --presets search --rounds 1 --baseline-games 1 \
  || echo "search bench failed or timed out (status $?)"

step "done"
