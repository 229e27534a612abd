#!/usr/bin/env bash
# Where the time goes in data-parallel LeNet-5 on this machine: `trainlab dp compare` for every
# multi-process mode plus the DataLoader num_workers sweep, results in benchmarks/results/dp_compare.*
#
#   bash benchmarks/dp_compare.sh [--out DIR] [--force] [--device cpu] [--train-subset 20000] [--threads 1] [--epochs 1]
#   NAME=dp_compare_ring MODES=ddp,allreduce,ring bash benchmarks/dp_compare.sh ...   (other file names, modes)
#
# --out DIR (default benchmarks/results): where dp_compare.* go; existing ones are kept unless --force.
# Other arguments go to `trainlab dp compare`. On a GPU box use `--device cuda --nproc <GPUs>` and add
# `dp` to the modes (needs ≥2 GPUs). The raw log starts with the command, the machine and the versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NAME=${NAME:-dp_compare}
. benchmarks/out_args.sh
parse_out_args "$NAME.json" "$@"
MODES=${MODES:-none,ddp,allreduce,ring}
CMD=("$PY" -m trainlab dp compare --modes "$MODES" --nproc "${NPROC:-2}" --json "$OUT/$NAME.json" --md "$OUT/$NAME.md.tmp" ${ARGS[@]+"${ARGS[@]}"})
LOG="$OUT/$NAME.log"
{
  echo "\$ ${CMD[*]}"
  "$PY" - <<'PY'
from trainlab.telemetry.env import collect_env, format_header
import json
env = collect_env()
print(f"# {env['time_utc']}  {env['cpu']} ({env['cpu_count']} cores)  gpus: {env['gpus'] or 'none'}  torch {env['torch']}  python {env['python']}")
print("# shared machine: other jobs ran on the same cores, so absolute times are noisy (compare rows, not runs)")
PY
} > "$LOG.tmp"
"${CMD[@]}" 2>&1 | grep --line-buffered -v -e '^\*\*\*' -e 'OMP_NUM_THREADS' | tee -a "$LOG.tmp"
{ head -3 "$LOG.tmp" | sed '1s/^\$ \(.*\)$/Command: `\1`  /; 2,3s/^# \(.*\)$/\1  /'; echo; cat "$OUT/$NAME.md.tmp"; } > "$OUT/$NAME.md"
rm -f "$OUT/$NAME.md.tmp"
mv "$LOG.tmp" "$LOG"
echo "wrote $OUT/$NAME.{json,loaders.json,md,log}"
