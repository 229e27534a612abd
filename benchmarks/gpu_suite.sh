#!/usr/bin/env bash
# Every GPU check trainlab has, planned as few device calls (each ≤ 10 min), raw logs kept.
#
#   part lenet: pytest -m gpu (CUDA loader, GELU CUDA/Triton kernels, compile, NCCL-free paths),
#               gelu check + bench (≥85% of copy bandwidth target), LeNet time-to-99% on the GPU
#               with GPU telemetry, default training run (curves + gpu.csv), dp compile/graphs benchmark
#   part gpt:   benchmarks/gpt_gpu_suite.sh (GPT-2 1.6B baseline vs best, planner vs measured peak)
#
# On the lent machine the image's python3 holds torch; trainlab runs from src/ (no install, no network):
#   OUT=/tmp/out bash benchmarks/gpu_suite.sh lenet     # then: … gpu_suite.sh gpt
# Everything is also packed into $OUT/gpu_suite_<part>.tar.gz (the device tool returns ≤8 files).
set -u -o pipefail
cd "$(dirname "$0")/.."
PART=${1:-lenet}
OUT=${OUT:-benchmarks/results/gpu}
LOGS="$OUT/gpu_suite_$PART"
mkdir -p "$LOGS"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
export PY
START=$(date +%s)

run() {  # run NAME CMD...: log to $LOGS/NAME.log (first line: the command), print its tail
  local name=$1; shift
  echo "\$ $*" > "$LOGS/$name.log"
  timeout "${STEP_TIMEOUT:-240}" "$@" >> "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc at $(( $(date +%s) - START )) s"; tail -n 12 "$LOGS/$name.log"
}

(nvidia-smi; $PY -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)") > "$LOGS/versions.txt" 2>&1
case "$PART" in
  lenet)
    run pytest_gpu $PY -m pytest -q -m gpu -p no:cacheprovider tests
    run gelu_check $PY -m trainlab gelu check --json
    run gelu_bench $PY -m trainlab gelu bench --device cuda --out "$LOGS"
    run lenet_time_to_99 $PY benchmarks/lenet_time_to_99.py --device cuda --loops fast,default
    run lenet_train $PY -m trainlab train --device cuda --no-progress --out "$LOGS/lenet_run"
    run dp_compile $PY benchmarks/dp_compile.py --device cuda
    ;;
  gpt)
    OUT="$LOGS" PY=$PY bash benchmarks/gpt_gpu_suite.sh
    ;;
  *) echo "usage: gpu_suite.sh lenet|gpt" >&2; exit 2 ;;
esac
tar -czf "$OUT/gpu_suite_$PART.tar.gz" -C "$OUT" "gpu_suite_$PART"
echo "packed $OUT/gpu_suite_$PART.tar.gz"
