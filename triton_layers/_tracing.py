"""Whether torch.compile or torch.export is tracing the caller: decided here alone.

A module of its own, importing nothing of this package, so that both the checks
(``_checks``) and the kernels' doors (``kernels/_doors``) can ask without the two
importing each other.
"""
import torch


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the caller."""
    return torch.compiler.is_compiling()
