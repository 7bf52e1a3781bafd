#!/usr/bin/env bash
# One command for the whole runtime suite: configure + build typegrad_bench (Release,
# -march=native), run every benchmark with 5 repetitions, write results/latest.json, then
# results/table.md and results/expmul.png via make_table.py.
#
# Environment knobs:
#   BUILD_DIR  build directory (default: <repo>/build-bench)
#   JOBS       build parallelism (default 1: the machine is shared)
#   MIN_TIME   minimum seconds per repetition (default 0.2; Google Benchmark's own default is 0.5)
#   FILTER     benchmark regex (default: all), e.g. FILTER='^expmul/'
#   CXX        compiler, honoured on the first configure of BUILD_DIR
#   COMPILE_TIME=1  afterwards also run compile_time/measure.py (graphs of 10..1000 nodes with g++
#              and clang++, plus a clean build of the unit tests): results in compile_time/results.md.
#              CT_ARGS passes extra options to it (e.g. CT_ARGS='--sizes 10,100 --timeout 240').
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${BUILD_DIR:-$root/build-bench}
results=$here/results

# A generator can only be chosen when the build directory is new.
generator=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then
    generator=(-G Ninja)
fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTYPEGRAD_NATIVE=ON \
    -DTYPEGRAD_BUILD_BENCHMARKS=ON -DTYPEGRAD_BUILD_TESTS=OFF -DTYPEGRAD_BUILD_EXAMPLES=OFF
cmake --build "$build" --target typegrad_bench -j "${JOBS:-1}"

bench=$build/benchmarks/typegrad_bench
filter=${FILTER:-.}
min_time=${MIN_TIME:-0.2}
count=$("$bench" --benchmark_filter="$filter" --benchmark_list_tests=true | wc -l)
minutes=$(awk -v c="$count" -v t="$min_time" 'BEGIN { printf "%.0f", c * (8 * t + 0.4) / 60 + 0.5 }')
echo "run_all.sh: $count benchmarks x 5 repetitions, min $min_time s each: roughly $minutes min"

# Every implementation runs on one thread; BLAS/OpenMP pools must not add hidden workers.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}

mkdir -p "$results"
# Written to a temporary file first so an interrupted run keeps the previous results.
"$bench" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_format=json > "$results/latest.json.tmp"
mv "$results/latest.json.tmp" "$results/latest.json"
echo "run_all.sh: wrote $results/latest.json"

python3 "$here/make_table.py" "$results/latest.json" "$results/table.md"

if [[ ${COMPILE_TIME:-0} == 1 ]]; then
    # shellcheck disable=SC2086  # CT_ARGS is a list of options
    python3 "$here/compile_time/measure.py" --tests ${CT_ARGS:-}
fi
