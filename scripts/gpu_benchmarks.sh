#!/usr/bin/env bash
# Every benchmark on the GPUs this machine has, sized to finish in about ten
# minutes, all results (JSON + PNG) in one folder:
#
#   scripts/gpu_benchmarks.sh [OUT_DIR]          # default benchmarks/results/gpu-<time>
#   WITH_RLLIB=1 scripts/gpu_benchmarks.sh       # also compare_rllib.py (CPU, ~+10 min)
#   SMOKE=1 scripts/gpu_benchmarks.sh OUT_DIR    # every step at its tiny CI size
#
# Towers/replicas are 1, 2, 4 real GPUs, capped at the GPUs found; with no GPU
# it says so and measures fake GPUs (logical CPU devices) instead. Besides
# the MLP and LSTM of benchmarks/learner.py, the learner runs a CNN policy on
# 84x84x4 image observations (the Atari shape).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-benchmarks/results/gpu-$(date +%Y%m%d-%H%M%S)}"
export TF_CPP_MIN_LOG_LEVEL=3
export BENCH_RAY_NUM_CPUS="${BENCH_RAY_NUM_CPUS:-$(nproc)}"
mkdir -p "$OUT"

NGPU=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
TOWERS=""
for n in 1 2 4; do
  if [ "$n" -le "$NGPU" ]; then TOWERS="${TOWERS:+$TOWERS,}$n"; fi
done
if [ "$NGPU" -gt 0 ]; then
  GPU_FLAG="--real-gpus"
  echo "# $NGPU GPU(s) found: towers $TOWERS" >&2
else
  GPU_FLAG=""
  TOWERS="1,2,4"
  echo "# no GPU found (nvidia-smi): measuring fake GPUs on the CPU instead" >&2
fi
# sizes: one round of the full workloads, or every script's --smoke size (CI)
if [ "${SMOKE:-0}" = "1" ]; then
  SIZE="--smoke"; REPEATS=""; DURATION=""; TOWERS="${TOWERS%%,4}"; CALLERS="1,4"
  E2E_LIMIT=""  # e2e.py picks its own smoke target
else
  SIZE="--rounds 1"; REPEATS="--repeats 3"; DURATION="--duration 3"; CALLERS="1,4,16,64"
  E2E_LIMIT="--max-seconds 150"
fi
START=$(date +%s)
step() { echo "# [$(( $(date +%s) - START ))s] $*" >&2; }

step "learner: mlp, lstm, cnn on towers $TOWERS"
"$PY" -m benchmarks.learner --out "$OUT" $SIZE $REPEATS $GPU_FLAG \
  --models mlp,lstm,cnn --towers "$TOWERS" | tee "$OUT/learner.jsonl"

step "replica engine: MirroredStrategy vs TowerStack vs bare Keras"
"$PY" -m benchmarks.replica_engine --out "$OUT" $SIZE $REPEATS $GPU_FLAG \
  --replicas "$TOWERS" --threads "2,2" | tee "$OUT/replica_engine.jsonl"

step "inference: remote compute_actions, 1..64 callers"
"$PY" -m benchmarks.inference --out "$OUT" $SIZE $DURATION --callers "$CALLERS" \
  --num-gpus "$([ "$NGPU" -gt 0 ] && echo 1 || echo 0)" | tee "$OUT/inference.jsonl"

step "sampler: one rollout worker, CartPole-v1"
"$PY" -m benchmarks.sampler --out "$OUT" $SIZE $DURATION | tee "$OUT/sampler.jsonl"

E2E_GPUS=$([ "$NGPU" -gt 0 ] && echo "0,1" || echo "0,2")
step "e2e: PPO CartPole-v1 to 450, GPUs $E2E_GPUS"
"$PY" -m benchmarks.e2e --out "$OUT" $SIZE --num-gpus "$E2E_GPUS" --runners 2 \
  $E2E_LIMIT $GPU_FLAG | tee "$OUT/e2e.jsonl"

if [ "${WITH_RLLIB:-0}" = "1" ]; then
  step "compare_rllib (RLlib's own venv)"
  "$PY" -m benchmarks.compare_rllib --out "$OUT" $SIZE | tee "$OUT/compare_rllib.jsonl"
fi
step "done: results in $OUT"
