#!/usr/bin/env bash
# The plan fuzz's larger run (tests/test_plan_fuzz.py), on a GPU before a release: more seeds
# and longer call sequences than CI's, then the same fuzz under compute-sanitizer memcheck.
#
# Usage: bash scripts/fuzz_plans.sh [SEEDS] [STEPS] [MEMCHECK_SEEDS]   default 8 30 2
#        FUZZ_WORKERS=8 bash scripts/fuzz_plans.sh   (the first run in 8 pytest-xdist workers)
# Writes $OUT/fuzz/{fuzz,memcheck}.log and $OUT/fuzz/summary.txt (default OUT: fuzz-results).
# Exit status: 0 when the fuzz passed and memcheck found no error (0 MEMCHECK_SEEDS: no memcheck).
#
# On a machine with two GPUs the sequences also move calls to the second one. Under memcheck
# every tensor is its own cudaMalloc (torch's caching allocator off, so that an out-of-bounds
# access is not hidden inside a larger block), which leaves out the CUDA-graph setting.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/_sanitizer.sh
out="${OUT:-fuzz-results}/fuzz"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
seeds="${1:-8}" steps="${2:-30}" memcheck_seeds="${3:-2}"
fuzz=(python3 -m pytest -q -p no:cacheprovider tests/test_plan_fuzz.py -rfE)

start=$(date +%s)
TRITON_LAYERS_FUZZ_SEEDS=$seeds TRITON_LAYERS_FUZZ_STEPS=$steps "${fuzz[@]}" ${FUZZ_WORKERS:+-n "$FUZZ_WORKERS"} \
  > "$out/fuzz.log" 2>&1
status=$?
echo "fuzz ($seeds seeds x $steps steps): $(tail -n 1 "$out/fuzz.log") (exit $status, $(( $(date +%s) - start )) s)" \
  | tee -a "$summary"

if [ "$memcheck_seeds" -gt 0 ]; then
  start=$(date +%s)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 TRITON_LAYERS_FUZZ_SEEDS=$memcheck_seeds TRITON_LAYERS_FUZZ_STEPS=$steps \
    sanitized memcheck "$out/memcheck.log" "${fuzz[@]}"
  rc=$?
  echo "memcheck ($memcheck_seeds seeds x $steps steps): $(sanitizer_summary "$out/memcheck.log") | fuzz:" \
    "$(grep -E "passed|failed" "$out/memcheck.log" | tail -n 1) (exit $rc, $(( $(date +%s) - start )) s)" | tee -a "$summary"
  [ $rc -ne 0 ] && status=1
fi
exit $status
