#!/usr/bin/env bash
# #33's learning table where the trainer is not the bottleneck: every run's trainer on the GPU, its generator and
# sandboxed reward on 2 CPU cores of its own, outputs allowed 256 tokens (the recipe's 48 cut the tail). Eight
# runs at once on a 16-core device machine: the five policies at η = 2 (POLICIES_A), and strict, admission and
# token at η = 4 (POLICIES_B). TASKS=chains trains on the chain tasks instead (their own model and 400 tokens).
# Prepare here with `bash benchmarks/gpu/prepare.sh`, then on the device (carry: [".gpu"]):
#
#     bash benchmarks/gpu/staleness.sh                     # MINUTES=4 SEED=0 TRAINER_DEVICE=cuda by default
#     TASKS=chains POLICIES_B="strict drop recycle" bash benchmarks/gpu/staleness.sh
#     MINUTES=0.3 TRAINER_DEVICE=cpu CORES_PER_RUN=0 CORES_A=0-1 CORES_B=0-1 bash benchmarks/gpu/staleness.sh  # a try here
#
# $OUT (or ./gpu-out) receives bench.log (progress and each half's table), table.md (all eight runs) and
# runs.tgz (every run's metrics.jsonl and log: `--tabulate` rebuilds the table from them).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
runs=${RUNS:-/tmp/staleness-runs}
mkdir -p "$out" "$runs"
source benchmarks/gpu/wheels.sh
tasks=${TASKS:-code}
common=(--tasks "$tasks" --seeds "${SEED:-0}" --minutes "${MINUTES:-4}" --cores-per-run "${CORES_PER_RUN:-2}"
        --out "$runs" --set "trainer.device=${TRAINER_DEVICE:-cuda}" --set generation.device=cpu)
# the chain tasks bring their own output cap (bench_staleness_learning.TASKS)
[ "$tasks" = code ] && common+=(--set generation.max_new_tokens=256)
nvidia-smi -L > "$out/bench.log" 2>&1
# half CORES ETA PARALLEL POLICY...: one benchmark on its own cores, which it splits among its runs
half() {
  local cores=$1 eta=$2 parallel=$3
  shift 3
  timeout "${BUDGET_S:-480}" taskset -c "$cores" python3 benchmarks/bench_staleness_learning.py "${common[@]}" \
    --etas "$eta" --parallel "$parallel" --policies "$@" >> "$out/bench.log" 2>&1
}
read -ra policies_a <<< "${POLICIES_A:-strict admission drop token recycle}"
read -ra policies_b <<< "${POLICIES_B:-strict admission token}"
half "${CORES_A:-0-9}" 2 "${#policies_a[@]}" "${policies_a[@]}" &
half "${CORES_B:-10-15}" 4 "${#policies_b[@]}" "${policies_b[@]}" &
wait
python3 benchmarks/bench_staleness_learning.py --out "$runs" --tabulate > "$out/table.md" 2>&1
(cd "$runs" && tar czf - */metrics.jsonl *.log) > "$out/runs.tgz"
cat "$out/table.md"
