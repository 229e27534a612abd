# Sourced by the benchmark shell scripts: `--out DIR` (default benchmarks/results) and `--force`;
# every other argument is kept in ARGS. Refuses (exit 2) when DIR already holds the script's result
# file MARKER and --force was not given: committed results are never overwritten by accident.
#   parse_out_args MARKER "$@"     → OUT, FORCE (0/1), ARGS (array)
parse_out_args() {
  local marker=$1; shift
  OUT=benchmarks/results; FORCE=0; ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) OUT=${2:?--out needs a directory}; shift 2 ;;
      --force) FORCE=1; shift ;;
      *) ARGS+=("$1"); shift ;;
    esac
  done
  if [ "$FORCE" = 0 ] && [ -e "$OUT/$marker" ]; then
    echo "$(basename "$0"): error: $OUT/$marker exists; pass --force to overwrite it, or --out DIR" >&2
    exit 2
  fi
  mkdir -p "$OUT"
}
