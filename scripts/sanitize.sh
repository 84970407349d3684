#!/usr/bin/env bash
# Run every kernel (scripts/sanitize.py) under compute-sanitizer on a GPU.
#
# Usage: bash scripts/sanitize.sh [TOOL ...]     default: memcheck racecheck
#        e.g. bash scripts/sanitize.sh memcheck racecheck initcheck synccheck
#        SANITIZE_ARGS="-k softmax" bash scripts/sanitize.sh   (arguments for the driver)
# Writes $OUT/sanitize/{plain,TOOL}.log and $OUT/sanitize/summary.txt: the driver's own
# result line and each tool's ERROR/RACECHECK SUMMARY line and exit status.
# Exit status: 0 when the driver passed alone and under every tool with no error.
#
# memcheck: out-of-bounds and misaligned accesses. racecheck: shared-memory hazards (every
# Triton reduction goes through shared memory, so it runs on all kernels). initcheck:
# reads of uninitialised global memory. compute-sanitizer works on the Firecracker GPU
# machines; on gVisor ones it refuses the device ("Device not supported").
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-sanitize-results}/sanitize"
mkdir -p "$out"
tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck)
source scripts/_sanitizer.sh

# Every tensor its own cudaMalloc, sized exactly: torch's caching allocator would hand out
# slices of larger blocks, inside which an out-of-bounds access is invisible to memcheck.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
export PYTHONUNBUFFERED=1
summary="$out/summary.txt"
: > "$summary"

# First alone: compiles every kernel into Triton's cache and checks the results.
driver=(python3 scripts/sanitize.py ${SANITIZE_ARGS:-})
"${driver[@]}" > "$out/plain.log" 2>&1
status=$?
echo "plain: $(tail -n 1 "$out/plain.log") (exit $status)" | tee -a "$summary"

for tool in "${tools[@]}"; do
  start=$(date +%s)
  sanitized "$tool" "$out/$tool.log" "${driver[@]}"
  rc=$?
  echo "$tool: $(sanitizer_summary "$out/$tool.log") | driver: $(grep -E "passed, [0-9]+ failed" "$out/$tool.log" | tail -n 1)" \
    "(exit $rc, $(( $(date +%s) - start )) s)" | tee -a "$summary"
  [ $rc -ne 0 ] && status=1
done
exit $status
