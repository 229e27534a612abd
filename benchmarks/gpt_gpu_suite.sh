#!/usr/bin/env bash
# GPT-2 1.6B on one GPU, in ONE call of at most ~9 minutes (the device tool's per-command limit is 10):
#   1. environment (nvidia-smi, versions) and the planner's table for this GPU;
#   2. the handout's baseline: HF GPT2LMHeadModel, fp32, gradient checkpointing (--impl hf --strategy ckpt);
#   3. our best configuration: bf16 autocast + torch.compile + fused AdamW, micro-batch sweep
#      (checkpointing only if the planner says the micro-batch does not fit without it);
#   4. planner prediction vs measured peak (torch.cuda.max_memory_allocated);
#   5. one summary table (summary.md) of every run.
# Every command, its raw log and its JSON land in $OUT/raw, packed after every run into
# $OUT/gpt_gpu_suite_raw.tar.gz (the device tool returns at most 8 files from $OUT); $OUT/suite.log
# and $OUT/summary.md stay beside it. Later items are skipped (and say so) when the time budget runs
# out, so the call always returns what it measured.
#
#   GPU:      OUT=/some/dir bash benchmarks/gpt_gpu_suite.sh       (device tool: run with timeout_s 600;
#             the image's python3 has torch + transformers; trainlab is used from src/ via PYTHONPATH)
#   CPU dry:  MODEL=tiny DEVICE=cpu GLOBAL=8 MICROS="4 2" STEPS=2 WARMUP=1 BASE_STEPS=2 COMPILE=0 \
#             OUT=/tmp/gpt_suite bash benchmarks/gpt_gpu_suite.sh
set -u
cd "$(dirname "$0")/.."
MODEL=${MODEL:-gpt2-1.6b}
DEVICE=${DEVICE:-cuda}
GLOBAL=${GLOBAL:-16}            # sequences per optimizer step, identical for every run
MICROS=${MICROS:-"8 16 4"}      # micro-batch sweep of the best configuration, most promising first
BASE_MICRO=${BASE_MICRO:-8}     # the handout's dataloader batch size
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-3}             # compile happens here (excluded from timing)
BASE_STEPS=${BASE_STEPS:-4}
COMPILE=${COMPILE:-1}
BUDGET_S=${BUDGET_S:-540}
TOP=${OUT:-benchmarks/results/gpt_gpu_suite}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}  # less fragmentation
OUT="$TOP/raw"
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
note() { echo "$*" | tee -a "$TOP/suite.log"; }
pack() { tar czf "$TOP/gpt_gpu_suite_raw.tar.gz.tmp" -C "$TOP" raw && mv "$TOP/gpt_gpu_suite_raw.tar.gz.tmp" "$TOP/gpt_gpu_suite_raw.tar.gz"; }

# run NAME CMD...: raw log in $OUT/NAME.log (starting with the command), skipped when out of time
run() {
  local name=$1; shift
  local t; t=$(left)
  if [ "$t" -lt 45 ]; then note "SKIPPED $name: time budget spent"; return 99; fi
  echo "\$ $*" > "$OUT/$name.log"
  timeout "$t" "$@" >> "$OUT/$name.log" 2>&1
  local rc=$?
  note "$name rc=$rc at $(( $(date +%s) - START )) s"
  grep -E "^summary|planner predicted|rank 0:|error|Error" "$OUT/$name.log" | tail -4 | tee -a "$TOP/suite.log"
  pack
  return $rc
}

note "gpt_gpu_suite: MODEL=$MODEL DEVICE=$DEVICE GLOBAL=$GLOBAL MICROS='$MICROS' STEPS=$STEPS WARMUP=$WARMUP COMPILE=$COMPILE $(date -u +%FT%TZ)"
(nvidia-smi || true) > "$OUT/nvidia-smi.txt" 2>&1
$PY -c "import json; from trainlab.telemetry.env import collect_env; print(json.dumps(collect_env('$DEVICE'), indent=2))" > "$OUT/env.json"

MEM=80GiB
if [ "$DEVICE" = cuda ]; then
  MEM=$($PY -c "import torch; print(torch.cuda.get_device_properties(0).total_memory)")
fi
run plan $PY -m trainlab gpt plan --model "$MODEL" --gpus 1 --gpu-mem "$MEM" --micro-batch "$BASE_MICRO" --optimizer fused
$PY -m trainlab gpt plan --model "$MODEL" --gpus 1 --gpu-mem "$MEM" --micro-batch "$BASE_MICRO" --optimizer fused --json > "$OUT/plan.json"

COMMON=(--model "$MODEL" --device "$DEVICE" --global-batch "$GLOBAL")

# 2. the handout's baseline (HF model, fp32, checkpointing, plain AdamW)
run baseline_hf_fp32_ckpt $PY -m trainlab gpt bench "${COMMON[@]}" --impl hf --strategy ckpt \
    --micro-batch "$BASE_MICRO" --steps "$BASE_STEPS" --warmup 1 --json "$OUT/baseline_hf_fp32_ckpt.json"

# 3. our best configuration, micro-batch sweep; checkpointing only when the planner says it is needed
fits() {  # fits STRATEGY MICRO -> exit 0 when the planner predicts it fits this device
  $PY - "$1" "$2" <<PYEOF
import sys
from trainlab.gpt.planner import predict_memory, usable_bytes, parse_bytes
from trainlab.gpt.model import get_preset
p = predict_memory(get_preset("$MODEL"), sys.argv[1], 1, int(sys.argv[2]), None, optimizer="fused",
                   accumulation_steps=max(1, $GLOBAL // int(sys.argv[2])))
sys.exit(0 if p["total_bytes"] <= usable_bytes(parse_bytes("$MEM")) else 1)
PYEOF
}
BEST_EXTRA=(--fused-optimizer)
[ "$DEVICE" = cpu ] && BEST_EXTRA=()
for B in $MICROS; do
  S=amp
  [ "$COMPILE" = 1 ] && S="$S+compile"
  [ "$B" -lt "$GLOBAL" ] && S="$S+accum"
  if ! fits "amp" "$B"; then note "planner: amp with micro-batch $B does not fit; adding ckpt"; S="$S+ckpt"; fi
  NAME="best_$(echo "$S" | tr '+' '_')_b$B"
  run "$NAME" $PY -m trainlab gpt bench "${COMMON[@]}" --strategy "$S" --micro-batch "$B" \
      --steps "$STEPS" --warmup "$WARMUP" "${BEST_EXTRA[@]}" --json "$OUT/$NAME.json"
  if [ $? -ne 0 ] && grep -qi "out of memory" "$OUT/$NAME.log" && [[ "$S" != *ckpt* ]]; then
    note "OOM at micro-batch $B without checkpointing; retrying with ckpt"
    run "${NAME}_ckpt" $PY -m trainlab gpt bench "${COMMON[@]}" --strategy "$S+ckpt" --micro-batch "$B" \
        --steps "$STEPS" --warmup "$WARMUP" "${BEST_EXTRA[@]}" --json "$OUT/${NAME}_ckpt.json"
  fi
  if [ "$B" = "$(echo $MICROS | cut -d' ' -f1)" ]; then
    # 4. planner vs measured right after the first sweep point (most important when time runs short)
    run planner_error $PY benchmarks/gpt_planner_error.py --model "$MODEL" --device "$DEVICE" \
        --strategies amp+ckpt,amp --micro-batches 4 $( [ "$DEVICE" = cuda ] && echo --fused ) \
        --seq "$($PY -c "from trainlab.gpt.model import get_preset; print(get_preset('$MODEL').n_positions)")" \
        --name "gpt_planner_error_${MODEL}_${DEVICE}"
    cp benchmarks/results/gpt_planner_error_${MODEL}_${DEVICE}.* "$OUT/" 2>/dev/null
  fi
done

# our model with the baseline's settings (fp32 + ckpt): isolates model implementation from precision/compile
run ours_fp32_ckpt $PY -m trainlab gpt bench "${COMMON[@]}" --strategy ckpt --micro-batch "$BASE_MICRO" \
    --steps "$BASE_STEPS" --warmup 1 --json "$OUT/ours_fp32_ckpt.json"

# 5. one table
$PY benchmarks/gpt_summarize.py "$OUT" > "$OUT/summary.log" 2>&1
cp "$OUT/summary.md" "$TOP/summary.md" 2>/dev/null
cat "$TOP/summary.md" 2>/dev/null
note "done in $(( $(date +%s) - START )) s"
cp "$TOP/suite.log" "$OUT/suite.log"
pack
rm -rf "$OUT"   # everything is in the archive; the tool returns at most 8 files
