#!/usr/bin/env bash
# Issue 38's GPU rows in one command (about 3 minutes on one H100/H200), every result in OUT:
#   1. async.*          `trainlab async --device cuda`: queued vs finished (eager and CUDA-graph LeNet step),
#                       t1 + N·t2 + t3 with measured t1/t2/t3, one stream vs two, a pinned and a pageable
#                       copy beside compute, CPU and GPU at once — each row with what the overlap bought;
#   2. mp_<P>.json      GPT-2 1.6B (HF, ckpt, fp32 weights) at --matmul-precision highest / high / medium;
#   3. pytest.log       the GPU tests of the mixed CPU+GPU world and the async experiments.
# The offload rows and the mesh rows need more time or more GPUs: benchmarks/gpu_lease.md lists them.
#
#   bash benchmarks/gpu_seeds_rows.sh OUT
set -eu
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu_seeds_rows.sh OUT}
PY=${PY:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
run() {  # run NAME CMD...: console output in OUT/NAME.console; a failed row is kept and the next runs
  local name=$1; shift
  echo "\$ $*" | tee "$OUT/$name.console"
  "$@" 2>&1 | tee -a "$OUT/$name.console" || echo "$name: exit $?" | tee -a "$OUT/$name.console"
}
run async "$PY" -m trainlab async --device cuda --json "$OUT/async.json" --md "$OUT/async.md"
for P in highest high medium; do
  run "mp_$P" timeout 120 "$PY" -m trainlab gpt bench --model gpt2-1.6b --impl hf --strategy ckpt \
    --global-batch 16 --micro-batch 8 --steps 4 --warmup 1 --device cuda --matmul-precision "$P" --json "$OUT/mp_$P.json"
done
run pytest "$PY" -m pytest -q -m gpu tests/test_lenet_async.py tests/test_lenet_mixed_world.py
