#!/usr/bin/env bash
# The tensor-parallel styles matrix (tests/test_tp_styles.py, eager; then the FP8 norms on sharded
# rows, tests/test_tensor_parallel.py) on 2 GPUs over NCCL, each
# rank under compute-sanitizer (memcheck by default), torch's caching allocator off.
#
# Usage: bash scripts/sanitize_tp.sh [TOOL]        (on a machine with 2 GPUs)
# Writes $OUT/sanitize_tp/TOOL.rank{0,1}.log and prints each rank's summary line. Exit status 0
# when both ranks passed every case and the tool found no error.
set -uo pipefail
cd "$(dirname "$0")/.."
tool=${1:-memcheck}
out="${OUT:-sanitize-results}/sanitize_tp"
mkdir -p "$out"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1 SANITIZE_TP_OUT="$out" SANITIZE_TP_TOOL="$tool"
# Each rank: the sanitizer around its own Python (torchrun starts the wrapper, one per rank).
python3 -m torch.distributed.run --standalone --nproc_per_node=2 --no-python bash -c '
  source scripts/_sanitizer.sh
  sanitized "$SANITIZE_TP_TOOL" "$SANITIZE_TP_OUT/$SANITIZE_TP_TOOL.rank$LOCAL_RANK.log" python3 -m tests.test_tp_styles'
status=$?
source scripts/_sanitizer.sh
for rank in 0 1; do
  log="$out/$tool.rank$rank.log"
  echo "rank $rank: $(sanitizer_summary "$log") | $(grep -E "every case agrees|Error" "$log" | tail -n 1)"
done
exit $status
