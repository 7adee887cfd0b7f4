#!/usr/bin/env bash
# Issue 13's figures on CPU: train the board-state transformer variants and the tiny Allie on the
# same prepared games for the same number of optimizer steps, then score them on the same held-out
# games (launch.board_compare) and on the forcing positions (launch.forcing_positions).
#   bench/board_experiments.sh DATA_DIR FORCING_JSONL OUT [STEPS]
set -euo pipefail
DATA=$1; FORCING=$2; OUT=$3; STEPS=${4:-200}
PY=${PYTHON:-python}
mkdir -p "$OUT"
common=(--data_dir "$DATA" --config.train.steps="$STEPS" --config.train.eval_every="$STEPS"
        --config.train.checkpoint_every="$STEPS" --config.train.log_every=20)
board=(--config configs/board_tiny.py --config.model.board.num_layers=2 --config.train.batch_size=32
       --config.data.shuffle_window=512 --config.train.eval_batches=4)
train() {  # name, args...
  local name=$1; shift
  [ -e "$OUT/$name/best" ] && return 0
  local t0=$(date +%s)
  $PY -m launch.train --workdir "$OUT/$name" "$@" "${common[@]}" > "$OUT/$name.log" 2>&1
  echo "$name $(( $(date +%s) - t0 )) s $(cat /proc/loadavg)" >> "$OUT/times.txt"
}
train board "${board[@]}"
train allie_tiny --config configs/tiny.py
train board_norefine "${board[@]}" --config.model.board.refinement=False
train board_nomask "${board[@]}" --config.model.board.mask_illegal=False
train board_flip "${board[@]}" --config.model.board.flip=True
train board_9add "${board[@]}" --config.model.board.piece_scheme=9_add
train board_9tokens "${board[@]}" --config.model.board.piece_scheme=9_tokens
names=(allie_tiny board board_norefine board_nomask board_flip board_9add board_9tokens)
pairs=$(for n in "${names[@]}"; do printf '%s=%s,' "$n" "$OUT/$n"; done)
$PY -m launch.board_compare --checkpoints "${pairs%,}" --data_dir "$DATA" --split test \
    --max_games 150 --baseline allie_tiny --output "$OUT/compare" > "$OUT/compare.log" 2>&1
$PY -m launch.forcing_positions --positions "$FORCING" --checkpoints "${pairs%,}" \
    --output "$OUT/forcing_solve.json" > "$OUT/forcing_solve.log" 2>&1
echo "all done $(cat /proc/loadavg)" >> "$OUT/times.txt"
