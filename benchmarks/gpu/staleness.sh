#!/usr/bin/env bash
# #33's learning table where the trainer is not the bottleneck: every run's trainer on the GPU, its generator and
# sandboxed reward on 2 CPU cores of its own, outputs allowed 256 tokens (the recipe's 48 cut the tail). Eight
# runs at once on a 16-core device machine: the five policies at η = 2, and strict, admission and token at η = 4.
# Prepare here with `bash benchmarks/gpu/prepare.sh`, then on the device (carry: [".gpu"]):
#
#     bash benchmarks/gpu/staleness.sh                     # MINUTES=4 SEED=0 TRAINER_DEVICE=cuda by default
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
common=(--seeds "${SEED:-0}" --minutes "${MINUTES:-4}" --cores-per-run "${CORES_PER_RUN:-2}" --out "$runs"
        --set "trainer.device=${TRAINER_DEVICE:-cuda}" --set generation.device=cpu --set generation.max_new_tokens=256)
nvidia-smi -L > "$out/bench.log" 2>&1
# half CORES ETA PARALLEL POLICY...: one benchmark on its own cores, which it splits among its runs
half() {
  local cores=$1 eta=$2 parallel=$3
  shift 3
  timeout "${BUDGET_S:-480}" taskset -c "$cores" python3 benchmarks/bench_staleness_learning.py "${common[@]}" \
    --etas "$eta" --parallel "$parallel" --policies "$@" >> "$out/bench.log" 2>&1
}
half "${CORES_A:-0-9}" 2 5 strict admission drop token recycle &
half "${CORES_B:-10-15}" 4 3 strict admission token &
wait
python3 benchmarks/bench_staleness_learning.py --out "$runs" --tabulate > "$out/table.md" 2>&1
(cd "$runs" && tar czf - */metrics.jsonl *.log) > "$out/runs.tgz"
cat "$out/table.md"
