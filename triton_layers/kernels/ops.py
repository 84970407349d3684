"""The differentiable kernel ops, each callable with its description's inputs (2-D, last stride 1),
residual_norm's in-place serving form (eager, no autograd) and the FP8 norms (norm_fp8, and its
door norm_fp8_door, which makes it differentiable straight through)."""
from ..calls.sharding import register_rules
from .coor_descent import coor_descent
from .layer_norm import norm, residual_norm, residual_norm_in_place
from .norm_fp8 import norm_fp8, norm_fp8_door
from .softmax import softmax
from .weighted_sum import weighted_sum

# The differentiable ops: the one list of them (residual_norm_in_place runs their kernels). The
# rules below, tests/test_doors.py, tests/test_compile_analysis.py and benchmarks.dev.registers
# take their ops from it.
__all__ = ["norm", "residual_norm", "softmax", "weighted_sum", "coor_descent"]

# Each op's sharding rules, for DTensors (calls/sharding.py): registered with DTensor once,
# here, so that eager and traced calls alike find them.
for _name in __all__:
    register_rules(globals()[_name])
