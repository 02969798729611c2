#!/usr/bin/env bash
# The learner benchmarks over the GPUs this machine has, all results (JSON + PNG)
# in one folder:
#
#   scripts/gpu_benchmarks.sh [OUT_DIR]              # default benchmarks/results/gpu-<time>
#   scripts/gpu_benchmarks.sh --fake-gpus [OUT_DIR]  # the same sweep on fake GPUs (CPU)
#   scripts/gpu_benchmarks.sh --all [OUT_DIR]        # plus inference, sampler, e2e, replica engine
#   SMOKE=1 ...        every step at its tiny CI size
#   WITH_RLLIB=1 ...   with --all: also compare_rllib.py (CPU, ~+10 min)
#   DRY_RUN=1 ...      print the commands instead of running them
#   NVIDIA_SMI=cmd     how GPUs are listed (default nvidia-smi; `-L` is passed)
#   PYTHON=path        the Python that runs the benchmarks. Without it: the project's
#                      .venv/bin/python (what `make` builds), else the python3 on PATH if
#                      it imports policy_service (a `pip install .` elsewhere); else it
#                      says so in one line and exits 2.
#
# GPUs are counted with `nvidia-smi -L`. With N of them it runs
#   1. benchmarks/learner.py --learners 1..N --accumulate 1,4: N learner actors, one
#      GPU each, gradients all-reduced (NCCL) inside the step, beside the bare
#      collective between the same processes (learner_group.json);
#   2. benchmarks/learner.py --towers 1,2,4 (capped at N): towers in one process,
#      beside the bare-Keras ceiling, MLP, LSTM and CNN (learner.json).
# With no GPU it says so and exits 0 without measuring, unless --fake-gpus: then
# the same sweep runs on fake GPUs (logical CPU devices), 2 learners unless
# MAX_LEARNERS says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
FAKE=0
ALL=0
OUT=""
for arg in "$@"; do
  case "$arg" in
    --fake-gpus) FAKE=1 ;;
    --all) ALL=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "gpu_benchmarks.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) OUT="$arg" ;;
  esac
done
OUT="${OUT:-benchmarks/results/gpu-$(date +%Y%m%d-%H%M%S)}"
export TF_CPP_MIN_LOG_LEVEL=3
export BENCH_RAY_NUM_CPUS="${BENCH_RAY_NUM_CPUS:-$(nproc)}"

NGPU=$( ("${NVIDIA_SMI:-nvidia-smi}" -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [ "$NGPU" -gt 0 ]; then
  GPU_FLAG="--real-gpus"
  MAX="${MAX_LEARNERS:-$NGPU}"
  echo "# $NGPU GPU(s) found (nvidia-smi -L): learners 1..$MAX, one GPU each" >&2
elif [ "$FAKE" = "1" ]; then
  GPU_FLAG=""
  MAX="${MAX_LEARNERS:-2}"
  echo "# no GPU found (nvidia-smi -L lists none): --fake-gpus, so the same sweep runs" \
       "on fake GPUs (logical CPU devices), learners 1..$MAX" >&2
else
  echo "gpu_benchmarks.sh: no GPU found (nvidia-smi -L lists none), so there is nothing" \
       "to measure on GPUs here; pass --fake-gpus to run the same sweep on fake GPUs" >&2
  exit 0
fi
# The Python that runs the benchmarks (see PYTHON above): the first that imports
# policy_service, as the package's own commands run on the Python they were installed in.
find_python() {
  if [ -n "${PYTHON:-}" ]; then
    if command -v "$PYTHON" >/dev/null 2>&1 && "$PYTHON" -c "import policy_service" 2>/dev/null; then
      command -v "$PYTHON"; return 0
    fi
    echo "gpu_benchmarks.sh: PYTHON=$PYTHON cannot run or cannot import policy_service;" \
         "point PYTHON at the Python the project is installed in" >&2
    return 1
  fi
  if [ -x .venv/bin/python ]; then
    echo .venv/bin/python; return 0
  fi
  if command -v python3 >/dev/null 2>&1 && python3 -c "import policy_service" 2>/dev/null; then
    command -v python3; return 0
  fi
  echo "gpu_benchmarks.sh: no Python with policy_service found (no .venv/bin/python here," \
       "and python3 on PATH cannot import it); set PYTHON=/path/to/python" >&2
  return 1
}
PY=$(find_python) || exit 2
LEARNERS=$(seq -s, 1 "$MAX")
TOWERS=""
for n in 1 2 4; do
  if [ "$n" -le "$MAX" ]; then TOWERS="${TOWERS:+$TOWERS,}$n"; fi
done
# CPUs per learner actor: the cores shared by the most learners, at least 1
CPUS_PER_LEARNER="${CPUS_PER_LEARNER:-$(( BENCH_RAY_NUM_CPUS / MAX > 0 ? BENCH_RAY_NUM_CPUS / MAX : 1 ))}"
ACCUMULATE="1,4"
if [ "${SMOKE:-0}" = "1" ]; then
  # one point per path: the most learners with accumulation, the most towers per model
  SIZE="--smoke"; REPEATS=""; DURATION=""; CALLERS="1,4"; E2E_LIMIT=""
  LEARNERS="$MAX"; ACCUMULATE="4"; TOWERS="${TOWERS%%,4}"; TOWERS="${TOWERS##*,}"
  MODELS="mlp"; TOWER_MODELS="mlp,lstm,cnn"
else
  SIZE="--rounds 2"; REPEATS="--repeats 3"; DURATION="--duration 3"; CALLERS="1,4,16,64"
  E2E_LIMIT="--max-seconds 150"; MODELS="mlp,lstm"; TOWER_MODELS="mlp,lstm,cnn"
fi
run() {
  if [ "${DRY_RUN:-0}" = "1" ]; then echo "+ $*" >&2; else "$@"; fi
}
[ "${DRY_RUN:-0}" = "1" ] || mkdir -p "$OUT"
START=$(date +%s)
step() { echo "# [$(( $(date +%s) - START ))s] $*" >&2; }

step "learner group: $MODELS, learners $LEARNERS x accumulate $ACCUMULATE, $CPUS_PER_LEARNER CPU(s) each"
run "$PY" -m benchmarks.learner --out "$OUT" $SIZE $REPEATS $GPU_FLAG --models "$MODELS" \
  --learners "$LEARNERS" --accumulate "$ACCUMULATE" --cpus-per-learner "$CPUS_PER_LEARNER" \
  | run tee "$OUT/learner_group.jsonl"

step "learner towers: $TOWER_MODELS on towers $TOWERS in one process"
run "$PY" -m benchmarks.learner --out "$OUT" $SIZE $REPEATS $GPU_FLAG \
  --models "$TOWER_MODELS" --towers "$TOWERS" | run tee "$OUT/learner.jsonl"

if [ "$ALL" = "1" ]; then
  step "replica engine: MirroredStrategy vs TowerStack vs bare Keras"
  run "$PY" -m benchmarks.replica_engine --out "$OUT" $SIZE $REPEATS $GPU_FLAG \
    --replicas "$TOWERS" --threads "2,2" | run tee "$OUT/replica_engine.jsonl"

  step "inference: remote compute_actions, 1..64 callers"
  run "$PY" -m benchmarks.inference --out "$OUT" $SIZE $DURATION --callers "$CALLERS" \
    --num-gpus "$([ "$NGPU" -gt 0 ] && echo 1 || echo 0)" | run tee "$OUT/inference.jsonl"

  step "sampler: one rollout worker, CartPole-v1"
  run "$PY" -m benchmarks.sampler --out "$OUT" $SIZE $DURATION | run tee "$OUT/sampler.jsonl"

  E2E_GPUS=$([ "$NGPU" -gt 0 ] && echo "0,1" || echo "0,2")
  step "e2e: PPO CartPole-v1 to 450, GPUs $E2E_GPUS"
  run "$PY" -m benchmarks.e2e --out "$OUT" $SIZE --num-gpus "$E2E_GPUS" --runners 2 \
    $E2E_LIMIT $GPU_FLAG | run tee "$OUT/e2e.jsonl"

  if [ "${WITH_RLLIB:-0}" = "1" ]; then
    step "compare_rllib (RLlib's own venv)"
    run "$PY" -m benchmarks.compare_rllib --out "$OUT" $SIZE | run tee "$OUT/compare_rllib.jsonl"
  fi
fi
step "done: results in $OUT"
