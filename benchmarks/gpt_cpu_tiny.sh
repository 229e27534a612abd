#!/usr/bin/env bash
# CPU measurements with the tiny preset (what this 2-core, GPU-less box can do): one bench, the
# strategy matrix on 2 processes (gloo), and the planner's error against measured peaks.
# Timings on a shared machine are noisy; the point is the method, the equivalence of the losses and
# the memory figures. Everything lands in --out DIR (default benchmarks/results) as gpt_*; existing
# results there are kept unless --force.
#
#   bash benchmarks/gpt_cpu_tiny.sh [--out DIR] [--force]
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1  # one core per process, as torchrun's workers (2 threads on a busy 2-core box: 30x slower)
. benchmarks/out_args.sh
parse_out_args gpt_bench_cpu_tiny.json "$@"
[ ${#ARGS[@]} = 0 ] || { echo "usage: gpt_cpu_tiny.sh [--out DIR] [--force]" >&2; exit 2; }
R=$OUT
F=$( [ "$FORCE" = 1 ] && echo --force || true )
COMMON=(--model tiny --device cpu --global-batch 8 --micro-batch 4 --steps ${STEPS:-5} --warmup 2)

{ echo "\$ $PY -m trainlab gpt bench ${COMMON[*]} --strategy none --json $R/gpt_bench_cpu_tiny.json"
  $PY -m trainlab gpt bench "${COMMON[@]}" --strategy none --json "$R/gpt_bench_cpu_tiny.json"; } > "$R/gpt_bench_cpu_tiny.log" 2>&1

{ echo "\$ $PY -m trainlab gpt compare ${COMMON[*]} --nproc 2 --timeout 600 --out $R/gpt_compare_cpu_tiny"
  $PY -m trainlab gpt compare "${COMMON[@]}" --nproc 2 --timeout 600 --out "$R/gpt_compare_cpu_tiny"; } > "$R/gpt_compare_cpu_tiny.log" 2>&1

$PY benchmarks/gpt_planner_error.py --strategies none,amp,ckpt,ckpt-selective,amp+ckpt,amp+ckpt-selective \
    --micro-batches 2,8,32 --name gpt_planner_error_cpu_tiny --out "$R" $F
# SDPA's math path (what fp32 with head width 50 runs on a GPU), forced on CPU: the s×s scores term
$PY benchmarks/gpt_planner_error.py --strategies none,ckpt,ckpt-selective --micro-batches 2,8,32 --attention math \
    --name gpt_planner_error_cpu_tiny_math --out "$R" $F

$PY -m trainlab gpt plan --model gpt2-1.6b --gpus 1 --gpu-mem 80GiB --micro-batch 8 > "$R/gpt_plan_1.6b_1x80GiB.txt"
$PY -m trainlab gpt plan --model gpt2-1.6b --gpus 1 --gpu-mem 80GiB --micro-batch 8 --json "$R/gpt_plan_1.6b_1x80GiB.json" > /dev/null
$PY -m trainlab gpt plan --model gpt2-1.6b --gpus 2 --gpu-mem 80GiB --micro-batch 8 > "$R/gpt_plan_1.6b_2x80GiB.txt"
echo done
