#!/usr/bin/env bash
# GPT-2 1.6B on one GPU in ONE device call (budget 480 s of work, finished inside 9 minutes):
#   1. environment and the planner's table for this GPU (it names the SDPA kernel per dtype);
#   2. our best configuration: bf16 autocast + torch.compile + fused AdamW at the first micro-batch
#      of the sweep (checkpointing only if the planner says it does not fit without);
#   3. the handout's baseline: HF GPT2LMHeadModel, fp32 (TF32 off, stated), activation checkpointing;
#   4. planner prediction vs measured peak (torch.cuda.max_memory_allocated);
#   5. the rest of the micro-batch sweep, and our model with the baseline's settings;
#   6. one table (summary.md) of every run: tokens/s, TFLOPS (6N+attention, the handout's 8·N·B·T
#      with its N = 1,638,022,400, and 8·N·B·T with the distinct N), MFU, peak memory.
# Most valuable first: when the budget runs out, later steps are skipped and say so.
#
#   GPU:      bash benchmarks/gpt_gpu_suite.sh --out DIR            (or: gpu_suite.sh gpt --out DIR)
#   CPU dry:  bash benchmarks/gpt_gpu_suite.sh --out DIR --dry-run  (tiny preset; CI runs it)
# Files: $OUT/gpt_raw.tar.gz, gpt_suite.log, gpt_summary.md — see benchmarks/suite_lib.sh.
set -u -o pipefail
cd "$(dirname "$0")/.."
SUITE_USAGE_PART=""
. benchmarks/suite_lib.sh
suite_init gpt "$@"

if [ "$DRY" = 1 ]; then
  MODEL=tiny; DEVICE=cpu; GLOBAL=8; MICROS="4"; BASE_MICRO=4; STEPS=2; WARMUP=1; BASE_STEPS=2; COMPILE=0
else
  MODEL=gpt2-1.6b; DEVICE=cuda; GLOBAL=16; MICROS="8 16 4"; BASE_MICRO=8; STEPS=8; WARMUP=3; BASE_STEPS=4; COMPILE=1
fi
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}  # less fragmentation
R="$WORK/results"
mkdir -p "$R"

step env 60 10 sh -c "(nvidia-smi || true); $PY -c \"import json; from trainlab.telemetry.env import collect_env; print(json.dumps(collect_env('$DEVICE'), indent=2))\" | tee '$R/env.json'"
MEM=80GiB; SM=90
if [ "$DEVICE" = cuda ]; then
  MEM=$($PY -c "import torch; print(torch.cuda.get_device_properties(0).total_memory)" 2>/dev/null || echo 80GiB)
  SM=$($PY -c "import torch; a, b = torch.cuda.get_device_capability(0); print(10 * a + b)" 2>/dev/null || echo 90)
fi
step plan 60 10 sh -c "$PY -m trainlab gpt plan --model $MODEL --gpus 1 --gpu-mem $MEM --micro-batch $BASE_MICRO --optimizer fused --sm $SM \
  && $PY -m trainlab gpt plan --model $MODEL --gpus 1 --gpu-mem $MEM --micro-batch $BASE_MICRO --optimizer fused --sm $SM --json > '$R/plan.json'"

COMMON=(--model "$MODEL" --device "$DEVICE" --global-batch "$GLOBAL")
BEST_EXTRA=(--fused-optimizer)
[ "$DEVICE" = cpu ] && BEST_EXTRA=()

fits() {  # fits STRATEGY MICRO: exit 0 when the planner predicts it fits this device
  $PY - "$1" "$2" <<PYEOF
import sys
from trainlab.gpt.planner import predict_memory, usable_bytes, parse_bytes
from trainlab.gpt.model import get_preset
p = predict_memory(get_preset("$MODEL"), sys.argv[1], 1, int(sys.argv[2]), None, optimizer="fused", sm=$SM,
                   device_type="$DEVICE", accumulation_steps=max(1, $GLOBAL // int(sys.argv[2])))
sys.exit(0 if p["total_bytes"] <= usable_bytes(parse_bytes("$MEM")) else 1)
PYEOF
}

best() {  # best MICRO: our best configuration at this micro-batch (+ckpt if the planner says so)
  local b=$1 s=amp
  [ "$COMPILE" = 1 ] && s="$s+compile"
  [ "$b" -lt "$GLOBAL" ] && s="$s+accum"
  if ! fits amp "$b"; then note "planner: amp at micro-batch $b does not fit; adding ckpt"; s="$s+ckpt"; fi
  local name="best_$(echo "$s" | tr '+' '_')_b$b"
  step "$name" 200 60 $PY -m trainlab gpt bench "${COMMON[@]}" --strategy "$s" --micro-batch "$b" \
      --steps "$STEPS" --warmup "$WARMUP" "${BEST_EXTRA[@]}" --json "$R/$name.json"
  if [ $? -ne 0 ] && grep -qi "out of memory" "$WORK/$name.log" && [[ "$s" != *ckpt* ]]; then
    note "OOM at micro-batch $b without checkpointing; retrying with ckpt"
    step "${name}_ckpt" 200 60 $PY -m trainlab gpt bench "${COMMON[@]}" --strategy "$s+ckpt" --micro-batch "$b" \
        --steps "$STEPS" --warmup "$WARMUP" "${BEST_EXTRA[@]}" --json "$R/${name}_ckpt.json"
  fi
}

FIRST=${MICROS%% *}
best "$FIRST"
step baseline_hf_fp32_ckpt 150 60 $PY -m trainlab gpt bench "${COMMON[@]}" --impl hf --strategy ckpt --tf32 off \
    --micro-batch "$BASE_MICRO" --steps "$BASE_STEPS" --warmup 1 --json "$R/baseline_hf_fp32_ckpt.json"
step planner_error 120 40 $PY benchmarks/gpt_planner_error.py --model "$MODEL" --device "$DEVICE" \
    --strategies amp+ckpt,amp,none --micro-batches 2 \
    $([ "$DEVICE" = cuda ] && echo --fused) --name "gpt_planner_error_${MODEL}_${DEVICE}" --out "$R"
for B in ${MICROS#"$FIRST"}; do best "$B"; done
step ours_fp32_ckpt 120 60 $PY -m trainlab gpt bench "${COMMON[@]}" --strategy ckpt --tf32 off --micro-batch "$BASE_MICRO" \
    --steps "$BASE_STEPS" --warmup 1 --json "$R/ours_fp32_ckpt.json"

$PY benchmarks/gpt_summarize.py "$R" > "$WORK/summarize.log" 2>&1 && cp "$R/summary.md" "$WORK/summary_extra.md"
suite_done
