#!/usr/bin/env bash
# Runs typegrad_data_parallel_bench on 1 and 2 ranks (one kernel thread per rank), REPEAT times
# each, with post-accumulate hooks and with hooks inside the backward, with the default 25 MB
# bucket and with 0.5 MB buckets, then the all-reduce alone. Usage:
#   benchmarks/distributed/run.sh [build dir, default build/gcc] [steps, default 50] [repeat, default 3]
# The build dir must have been configured with -DTYPEGRAD_BUILD_BENCHMARKS=ON and MPI found:
#   cmake --build build/gcc --target typegrad_data_parallel_bench
# BASE=<another build dir> runs that build's bench right before each configuration (lines
# "== base" / "== this"), for before/after pairs measured in the same minutes.
set -euo pipefail
build=${1:-build/gcc}
steps=${2:-50}
repeat=${3:-3}
bench=$build/benchmarks/typegrad_data_parallel_bench
base=${BASE:+$BASE/benchmarks/typegrad_data_parallel_bench}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
one() {  # ranks bucket_MB mode
  if [ -n "$base" ]; then
    echo "== base"
    mpirun -np "$1" "$base" "$steps" "$2" "$3"
    echo "== this"
  fi
  mpirun -np "$1" "$bench" "$steps" "$2" "$3"
}
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$repeat"); do
  for hooks in post early; do
    one 1 25 $hooks
    one 2 25 $hooks
    one 2 0.5 $hooks
  done
  mpirun -np 2 "$bench" "$steps" 25 comm
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
