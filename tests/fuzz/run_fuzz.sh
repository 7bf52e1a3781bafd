#!/usr/bin/env bash
# Runs the typegrad libFuzzer harness for a number of executions and reports count and time.
#   tests/fuzz/run_fuzz.sh <typegrad_fuzz binary> [runs=20000] [more libFuzzer flags...]
# Starts from an empty corpus in a temporary directory with a fixed seed (TYPEGRAD_FUZZ_SEED,
# default 1), so a run is repeatable. Exit status: the fuzzer's (0: no failure).
# A failing input is written as crash-* into the current directory; replay it with
#   TYPEGRAD_FUZZ_VERBOSE=1 <binary> crash-...
set -euo pipefail
fuzzer="$1"
runs="${2:-20000}"
shift $(( $# >= 2 ? 2 : 1 ))
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
start=$(date +%s.%N)
set +e
"$fuzzer" -runs="$runs" -seed="${TYPEGRAD_FUZZ_SEED:-1}" -max_len=512 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 "$@" "$work/corpus" >"$work/log" 2>&1
status=$?
set -e
end=$(date +%s.%N)
grep -E "stat::number_of_executed_units|stat::peak_rss_mb|ERROR|runtime error|property violated|Test unit written" "$work/log" || true
if [ "$status" -ne 0 ]; then
  tail -n 40 "$work/log"
fi
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
awk -v n="${execs:-?}" -v t0="$start" -v t1="$end" -v s="$status" \
  'BEGIN { printf "fuzz: %s executions in %.0f s, exit status %d\n", n, t1 - t0, s }'
exit "$status"
