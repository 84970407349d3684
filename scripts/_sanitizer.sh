# Sourced by scripts/sanitize.sh and scripts/fuzz_plans.sh: how a command runs under
# compute-sanitizer here, in one place.
#
#   sanitized TOOL LOG COMMAND...   COMMAND under the tool, its output in LOG; exit status 97
#                                   where the tool found an error, else the command's
#   sanitizer_summary LOG           the tool's summary line in LOG ("no summary line" if none)
san="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"

sanitized() {
  local tool=$1 log=$2
  shift 2
  # application-only: the Python process, not Triton's compiler subprocesses.
  # --report-api-errors no: CUDA API calls that fail on purpose (driver probes by torch
  # and Triton) are not kernel errors; --error-exitcode makes a real one fail the run.
  "$san" --tool "$tool" --target-processes application-only --report-api-errors no \
    --print-limit 100 --error-exitcode 97 "$@" > "$log" 2>&1
}

sanitizer_summary() {
  local line
  line=$(grep -E "(ERROR|RACECHECK|LEAK) SUMMARY" "$1" | tail -n 1)
  echo "${line:-no summary line}"
}
