"""Whether torch.compile or torch.export is tracing the caller: decided here alone.

A module of its own, importing nothing of this package, so that both the checks
(``_checks``) and the kernels' doors (``calls/doors``) can ask without the two
importing each other.
"""
import torch


# Whether torch.compile or torch.export is tracing the caller: torch's own function, not a
# wrapper of it (one Python frame less on every eager call; Dynamo evaluates this very
# function to True while it traces).
tracing = torch.compiler.is_compiling
