#!/usr/bin/env bash
# Every GPU check trainlab has, in two device calls of at most 9 minutes each (budget 480 s of work):
#
#   lenet:  the GPU test suite (pytest -m gpu: CUDA/Triton GELU kernels incl. the CUDA extension
#           build, double backward, 2^31-element tensors, attention-backend and planner checks,
#           telemetry), gelu check + bench, a default LeNet-5 run (curves, gpu.csv, nvidia-smi while
#           busy), time-to-99%, the eager / compile / CUDA-graphs step benchmark
#   ops:    our conv2d / max-pool / linear operators (GPU tests, ops check/bench with the cuda and
#           Triton rows, profile, epoch benchmark)
#   gpt:    benchmarks/gpt_gpu_suite.sh (GPT-2 1.6B: planner, handout baseline vs best, planner vs
#           measured peak)
#
# On the lent machine the image's python3 holds torch (2.11 + CUDA 13 there); trainlab runs from
# src/ (PYTHONPATH), nothing is installed, nothing is downloaded. MNIST comes along as one file:
#   here:   python -m trainlab data pack .cache/mnist.npz        (.cache is git-ignored: carry it)
#   there:  bash benchmarks/gpu_suite.sh lenet --out $OUT --mnist .cache/mnist.npz
#           bash benchmarks/gpu_suite.sh gpt --out $OUT
#   CPU:    bash benchmarks/gpu_suite.sh lenet --out /tmp/s --dry-run     (what CI runs)
# Results: $OUT/<part>_raw.tar.gz (every log, JSON and run directory), <part>_suite.log,
# <part>_summary.md, repacked after every step (see benchmarks/suite_lib.sh for the contract).
set -u -o pipefail
cd "$(dirname "$0")/.."
PART=${1:-}
case "$PART" in
  lenet|ops) shift ;;
  gpt) shift; exec bash benchmarks/gpt_gpu_suite.sh "$@" ;;
  *) echo "usage: $0 lenet|ops|gpt --out DIR [--budget S] [--dry-run] [--force] [--work DIR] [--mnist PACK.npz]" >&2; exit 2 ;;
esac
SUITE_USAGE_PART="$PART "
. benchmarks/suite_lib.sh
suite_init "$PART" "$@"

if [ "$PART" = ops ]; then
  # Our conv2d / max-pool / linear operators on the GPU (issue 13): their GPU tests, the correctness
  # table with the cuda and compiled-triton rows, the per-layer benchmark (incl. the naive atomic pool
  # backward), the per-layer profile, and an interleaved epoch benchmark (accuracy and epoch time).
  if [ "$DRY" = 1 ]; then
    step env 60 10 $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.version.cuda)"
    step pytest_gpu 90 20 $PY -m pytest -q -m gpu -p no:cacheprovider --co tests/test_ops_layers_cuda.py tests/test_ops_layers_triton.py tests/test_lenet_own_ops.py
    step ops_check 90 20 $PY -m trainlab ops check --op max_pool2d --impl aten --impl python --dtype float32 --case batch1-overlap --no-gelu --out "$WORK/ops_check"
    step ops_bench 60 10 $PY -m trainlab ops bench --device cpu --quick --impl python --layer pool1 --out "$WORK/ops_bench"
    step profile 90 20 $PY -m trainlab profile --device cpu --ops aten --steps 2 --warmup 1 --train-subset 256 --batch-size 64 --out "$WORK/profile"
  else
    step env 60 10 sh -c "nvidia-smi; $PY -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name(0))'"
    step pytest_gpu 180 60 $PY -m pytest -q -m gpu -p no:cacheprovider --timeout 300 tests/test_ops_layers_cuda.py tests/test_ops_layers_triton.py tests/test_lenet_own_ops.py
    step ops_check 90 30 $PY -m trainlab ops check --impl aten --impl cuda --impl triton --batch 64 --no-gelu --out "$WORK/ops_check"
    step ops_bench 90 30 $PY -m trainlab ops bench --device cuda --out "$WORK/ops_bench"
    step profile 60 20 $PY -m trainlab profile --device cuda --ops aten --ops own=cuda --ops own=triton --steps 100 --out "$WORK/profile"
    step epoch 120 40 $PY benchmarks/ops_lenet_epoch.py --device cuda --ops aten,own=cuda,own=triton --epochs 3 --name ops_lenet_epoch_cuda --out "$WORK"
  fi
  suite_done
  exit 0
fi

if [ "$DRY" = 1 ]; then
  DEV=cpu
  step env 60 10 $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.version.cuda)"
  step data 60 10 $PY -m trainlab data verify
  step pytest_gpu 90 20 $PY -m pytest -q -m gpu -p no:cacheprovider --co tests           # collect only on CPU
  step gelu_check 60 10 sh -c "$PY -m trainlab gelu check --json --impl aten --impl python --impl cuda --dtype float32 --approximate none --n 256 > '$WORK/gelu_check.json'"
  step gelu_bench 60 10 $PY -m trainlab gelu bench --device cpu --sizes 1K --impl python --budget 0.01 --out "$WORK/gelu_bench"
  step lenet_train 90 15 $PY -m trainlab train --device cpu --epochs 1 --train-subset 2048 --test-subset 1024 --no-progress --overwrite --out "$WORK/lenet_run"
  step lenet_time_to_99 30 10 $PY benchmarks/lenet_time_to_99.py --help                 # trains to 99%: import check only
  step dp_compile 60 10 $PY benchmarks/dp_compile.py --device cpu --steps 3 --variants eager --out "$WORK/results"
else
  DEV=cuda
  step env 60 10 sh -c "nvidia-smi; $PY -c 'import sys, torch, triton; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"triton\", triton.__version__, \"gpu\", torch.cuda.get_device_name(0))'"
  step data 60 10 $PY -m trainlab data verify
  step pytest_gpu 240 60 $PY -m pytest -q -m gpu -p no:cacheprovider --timeout 300 tests
  step gelu_check 90 30 sh -c "$PY -m trainlab gelu check --json > '$WORK/gelu_check.json'"
  step gelu_bench 120 40 $PY -m trainlab gelu bench --device cuda --budget 0.2 --out "$WORK/gelu_bench"
  step lenet_train 90 30 $PY -m trainlab train --device cuda --no-progress --overwrite --out "$WORK/lenet_run"
  step lenet_time_to_99 90 30 $PY benchmarks/lenet_time_to_99.py --device cuda --loops fast,default --out "$WORK/results"
  step dp_compile 90 30 $PY benchmarks/dp_compile.py --device cuda --steps 200 --out "$WORK/results"
fi

# The headline numbers, from what finished
$PY - "$WORK" > "$WORK/summary_extra.md" 2>/dev/null <<'PYEOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
lines = []
check = work / "gelu_check.json"
if check.exists():
    doc = json.loads(check.read_text())
    rows = doc["rows"]
    ran = [r for r in rows if not r["skipped"]]
    lines.append(f"gelu check: {sum(1 for r in ran if r['ok'])}/{len(ran)} rows ok, {len(rows) - len(ran)} skipped")
summary = work / "lenet_run" / "summary.json"
if summary.exists():
    s = json.loads(summary.read_text())
    lines.append(f"LeNet-5 ({s['device_name']}): test accuracy {s['test_accuracy']:.2f} %, training {s['train_seconds']:.2f} s, "
                 f"time to 99 %: {s['time_to_99_seconds']}")
print("\n".join(f"- {l}" for l in lines))
PYEOF
suite_done
