#!/bin/bash
# Before/after in one run: each side is its own checkout (e.g. a git worktree of an
# older commit) running its own benchmark code; rounds alternate the sides, and the
# order rotates every round so no side always runs first on a warm or cold machine.
#
#   git worktree add --detach /tmp/before 44d1771
#   benchmarks/ab.sh /tmp/ab 3 "before=/tmp/before after=$PWD" "--models mlp --towers 1,2"
#   benchmarks/ab.sh /tmp/ab_inf 2 "before=/tmp/before after=$PWD" "--callers 16" benchmarks.inference
#
# Each run writes OUT/SIDE/rROUND/{stdout.jsonl,stderr.txt} and the benchmark's JSON.
set -u
out=$1; rounds=$2; read -r -a sides <<< "$3"; args=$4; module=${5:-benchmarks.learner}
python=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  n=${#sides[@]}
  for i in $(seq 0 $((n - 1))); do
    side=${sides[$(( (i + r) % n ))]}; name=${side%%=*}; path=${side#*=}
    dir="$out/$name/r$r"; mkdir -p "$dir"
    echo "$(date +%T) round $r $name" >> "$out/log.txt"
    # shellcheck disable=SC2086  # args are the benchmark's own flags, split on purpose
    (cd "$path" && TF_CPP_MIN_LOG_LEVEL=3 PYTHONPATH="$path" "$python" -m "$module" $args \
        --rounds 1 --out "$dir" > "$dir/stdout.jsonl" 2> "$dir/stderr.txt")
  done
done
echo "$(date +%T) done" >> "$out/log.txt"
