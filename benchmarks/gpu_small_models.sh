#!/usr/bin/env bash
# Issue 40's GPU measurements in one command (about 4 minutes on one H100/H200), every result in OUT:
#   1. lenet_time_to_99_cuda.*  the `fast` preset (Muon for the hidden weight matrices, batch 192, average
#                    pooling, warm-up 0.3 epoch: 40/40 validation seeds >= 99 % on the CPU in fp32,
#                    benchmarks/results/lenet_fast_validation_r14_parts/) over 20 seeds beside
#                    `fast=fast-b128-max` (the preset before: batch 128, max-pooling, warm-up 0.2, 469 steps instead of 313:
#                    what the step count buys on a launch-bound step) and `fast=fast-adamw` (the recipe before
#                    Muon: what Muon costs per step; every optimizer step inside the CUDA graph, Muon's as one
#                    batched Newton–Schulz) and the seed-style loop (2 seeds; goal: 20/20 reach 99 %, median
#                    <= 0.2 s, >= 80x). LOOPS changes the rows: a candidate recipe of
#                    benchmarks/lenet_accuracy.py as fast=VARIANT (timed beside the preset, in one run);
#   2. gelu_bench.*  GELU fp32 at 256M elements, aten / cuda / triton beside a device copy (goal: Triton
#                    forward >= 95 % of copy);
#   3. ops_bench.*   `trainlab ops bench`: LeNet-5's layers at batch 4096, forward and backward, aten vs our
#                    CUDA rung vs the autotuned Triton rung (goal: Triton total <= 1.3x aten), and the
#                    `relu-epilogue` step total: conv1+relu, conv2+relu, fc1+relu, fc2+relu (on Triton one
#                    forward kernel each, dy masked once before the backward GEMMs: what `train --ops
#                    own=triton` runs), the pools and fc3; `stage1` is conv1+relu then the pool;
#   4. ops_check.*   the compiled Triton kernels against ATen (the autotuned configs, at batch 64), the
#                    conv2d/linear `relu-epilogue` cases included;
#   5. graph_check.console  the GPU tests of the captured step (tests/test_lenet_step.py -m gpu): graph vs
#                    eager (the `fast` preset's Muon step included), the EMA's average included, and no host
#                    sync per step with the EMA in the graph.
# Triton tunes each kernel once per shape at its first call (outside every timing: `ops bench` runs
# each rung once before timing it) and caches the choice on disk.
#
#   bash benchmarks/gpu_small_models.sh OUT                 # on a GPU
#   bash benchmarks/gpu_small_models.sh OUT --dry-run       # on a CPU: the same commands at toy sizes
#                                                           # (checks that they run; measures nothing)
set -eu
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu_small_models.sh OUT [--dry-run]}
DRY=0
[ "${2:-}" = --dry-run ] && DRY=1
[ $# -le 2 ] && { [ $# -lt 2 ] || [ $DRY = 1 ]; } || { echo "usage: gpu_small_models.sh OUT [--dry-run]" >&2; exit 2; }
PY=${PY:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
LOOPS=${LOOPS:-fast,fast=fast-b128-max,fast=fast-adamw,seed-style}  # fast-b128-max: the preset of rounds 5-6
if [ $DRY = 1 ]; then
  DEV=cpu; BATCH=8; SIZES=1K; IMPLS=(--impl cpp); BUDGET=0.05; SEEDS=0; BASE=0; EXTRA=(--train-subset 512 --max-epochs 1)
  CHECK=(env TRITON_INTERPRET=1 "$PY" -m trainlab ops check --impl triton --op relu --batch 2 --out "$OUT")
else
  DEV=cuda; BATCH=4096; SIZES=256M; IMPLS=(--impl cuda --impl triton); BUDGET=0.5
  SEEDS=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19; BASE=0,1; EXTRA=(--max-epochs 8)
  CHECK=("$PY" -m trainlab ops check --impl triton --batch 64 --out "$OUT")  # CUDA tensors where a GPU is
fi

step() {  # step NAME CMD...: run it, its console output in OUT/NAME.console, its wall time on stdout
  local name=$1; shift
  local t0=$SECONDS
  echo "\$ $*" | tee "$OUT/$name.console"
  "$@" >> "$OUT/$name.console" 2>&1 || echo "!! $name failed (exit $?): see $OUT/$name.console"
  echo "   $name: $((SECONDS - t0)) s"
}

{ echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || true) dry-run=$DRY"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"; } | tee "$OUT/machine.txt"
# time_to_99 first: on the H200 (2026-11-28) ops_bench's first Triton autotuning took 214 s of a call cut at 280 s
step time_to_99 "$PY" benchmarks/lenet_time_to_99.py --device $DEV --loops "$LOOPS" --seeds $SEEDS \
  --baseline-seeds $BASE "${EXTRA[@]}" --out "$OUT" --force
step gelu_bench "$PY" -m trainlab ops bench --op gelu --device $DEV --sizes $SIZES --dtype float32 "${IMPLS[@]}" \
  --budget $BUDGET --out "$OUT"
step ops_bench "$PY" -m trainlab ops bench --device $DEV --batch $BATCH "${IMPLS[@]}" --budget $BUDGET --out "$OUT"
step ops_check timeout $([ $DRY = 1 ] && echo 900 || echo 120) "${CHECK[@]}"
[ $DRY = 1 ] || step graph_check timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_lenet_step.py
echo "done: $OUT"
