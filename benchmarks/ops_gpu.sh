#!/usr/bin/env bash
# Issue 13's GPU checks in one device call (~6 min on an H100): the layer operators' GPU tests, the
# correctness table with the cuda and compiled-triton rows, the per-layer benchmark with the cuda,
# triton and naive atomic pool-backward rows, the per-layer profile on the GPU, and an interleaved
# epoch benchmark (accuracy and epoch time, aten vs own=cuda vs own=triton).
#
# On the lent machine (its python3 holds torch + triton; trainlab runs from src/):
#   OUT=/tmp/out bash benchmarks/ops_gpu.sh
# Everything is also packed into $OUT/ops_gpu.tar.gz (the device tool returns few files).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT/ops_gpu"
OUT=$(cd "$OUT" && pwd)
LOGS="$OUT/ops_gpu"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
START=$(date +%s)

run() {  # run NAME CMD...: log to $LOGS/NAME.log (first line: the command), print its tail
  local name=$1; shift
  echo "\$ $*" > "$LOGS/$name.log"
  timeout "${STEP_TIMEOUT:-240}" "$@" >> "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc at $(( $(date +%s) - START )) s"; tail -n 12 "$LOGS/$name.log"
}

(nvidia-smi; $PY -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)") > "$LOGS/versions.txt" 2>&1
run pytest_gpu $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_layers_cuda.py tests/test_ops_layers_triton.py tests/test_lenet_own_ops.py
run ops_check $PY -m trainlab ops check --impl aten --impl cuda --impl triton --batch 64 --no-gelu --out "$LOGS"
run ops_bench $PY -m trainlab ops bench --device cuda --out "$LOGS"
run profile $PY -m trainlab profile --device cuda --ops aten --ops own=cuda --ops own=triton --steps 100 --out "$LOGS/profile"
run epoch $PY benchmarks/ops_lenet_epoch.py --device cuda --ops aten,own=cuda,own=triton --epochs 3 --name "$LOGS/ops_lenet_epoch_cuda"
tar -czf "$OUT/ops_gpu.tar.gz" -C "$OUT" ops_gpu && echo "packed $OUT/ops_gpu.tar.gz"
