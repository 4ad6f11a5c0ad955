#!/usr/bin/env bash
# The GPU suite on a lent GPU machine, in one call of the device tool (its image has torch and transformers
# but not pyzmq, pydantic, bubblewrap or math-verify: those travel as wheels in .gpu/wheels). Prepare here:
#
#     bash benchmarks/gpu/prepare.sh            # .gpu/wheels, size checked
#
# then on the device (carry: [".gpu"]):
#
#     bash benchmarks/gpu/run.sh                # the gpu-marked tests, then every section of the suite
#     GPU_SUITE_SECTIONS=recipe,weights GPU_TESTS=0 bash benchmarks/gpu/run.sh   # a rerun of two sections
#     GPU_TESTS=tests/engines/test_cuda.py bash benchmarks/gpu/run.sh            # one test file, every section
#
# Everything lands in $OUT (or ./gpu-out): env.txt, gpu_tests.log, suite.log, results.json, tables.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
out=${OUT:-gpu-out}
budget=${GPU_SUITE_BUDGET_S:-570}   # the tests (~110 s on the H200) and the suite together: call with timeout_s 600
mkdir -p "$out"
source benchmarks/gpu/wheels.sh
{
  nvidia-smi
  python3 -c "import sys, torch, transformers, zmq, pydantic; print(sys.version); print('torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('transformers', transformers.__version__, \
'pyzmq', zmq.__version__, 'pydantic', pydantic.__version__)"
  python3 -c "from areal.rewards import sandbox_report; print(sandbox_report())"
} > "$out/env.txt" 2>&1
status=0
if [ "${GPU_TESTS:-all}" != 0 ]; then
  # only the files that hold gpu tests (or those GPU_TESTS names): a module of an extra this image lacks must not
  # stop the collection
  if [ "${GPU_TESTS:-all}" = all ]; then
    mapfile -t files < <(grep -rl "pytest.mark.gpu" tests --include="test_*.py")
  else
    read -ra files <<< "$GPU_TESTS"
  fi
  timeout 170 python3 -m pytest "${files[@]}" -m gpu -q -p no:cacheprovider --timeout 150 -rs \
    --continue-on-collection-errors > "$out/gpu_tests.log" 2>&1 || status=1
  tail -3 "$out/gpu_tests.log"
fi
python3 -m benchmarks.gpu.suite --out "$out" --budget-s $((budget - (SECONDS - start))) \
  --sections "${GPU_SUITE_SECTIONS:-}" || status=1
exit $status
