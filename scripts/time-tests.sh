#!/usr/bin/env bash
# Times the test suite per file: every integration-test binary, and within
# each binary every top-level module (one source file each), run on its own
# with the filter `MODULE::`. Prints one line per file, slowest first, and
# the total. Builds nothing new beyond `cargo test --no-run`.
#
#   scripts/time-tests.sh [--release] [BINARY...]   (default: every binary)
#
# Wall time per file, so a file's figure includes its waits; run on an
# otherwise idle machine to compare before and after a change.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
if [[ "${1:-}" == --release ]]; then profile=(--release); shift; fi
binaries=("$@")
if [[ ${#binaries[@]} -eq 0 ]]; then
  binaries=(lib bin)
  for entry in tests/*; do
    name=$(basename "$entry" .rs)
    case "$name" in common | mcp_python) continue ;; esac
    binaries+=("$name")
  done
fi
cargo test "${profile[@]}" --no-run --quiet 2>/dev/null
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for binary in "${binaries[@]}"; do
  case "$binary" in
    lib) selector=(--lib) ;;
    bin) selector=(--bin capexec) ;;
    *) selector=(--test "$binary") ;;
  esac
  # Top-level modules, from the test names `module::...::name: test`.
  modules=$(cargo test "${profile[@]}" --quiet "${selector[@]}" -- --list 2>/dev/null \
    | sed -n 's/: test$//p' | awk -F'::' '{print (NF > 1 ? $1 : "(top)")}' | sort -u)
  for module in $modules; do
    filter=("$module::")
    [[ "$module" == "(top)" ]] && filter=(--skip "::")
    start=$(date +%s.%N)
    status=ok
    cargo test "${profile[@]}" --quiet "${selector[@]}" -- "${filter[@]}" >/dev/null 2>&1 || status=FAILED
    end=$(date +%s.%N)
    printf '%8.2f  %s/%s %s\n' "$(echo "$end - $start" | bc)" "$binary" "$module" \
      "$([[ $status == ok ]] || echo "$status")" >>"$results"
  done
done
sort -rn "$results"
awk '{total += $1} END {printf "%8.2f  total\n", total}' "$results"
