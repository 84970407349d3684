"""The path a norm module takes when torch.compile or torch.export traces it.

A norm that ``convert`` swapped into someone else's model sits between torch ops we do not
own: Hugging Face's decoder layer adds the residual just before it and casts just after.
Compiled, Inductor fuses those ops into its own norm kernel; an opaque custom op (ours)
stops that fusion, and the add and the casts become kernels of their own (a converted
Llama's compiled step: 484 kernels against 435, 0.98-0.99x on an H100 and an H200). So,
as vLLM's custom ops do under Inductor, such a module hands a traced call without a
residual to torch ops (the reference path, same numerics) and lets Inductor generate it;
eager calls still run the kernels. ``use_triton=True`` keeps the kernels when traced too.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from ..calls.tracing import tracing


def use_triton_for(module: nn.Module, residual: Optional[Tensor]) -> Optional[bool]:
    """``module.use_triton``, or ``False`` (torch ops) for a traced call without a residual on a
    module whose ``torch_ops_when_compiled`` is set (``convert`` sets it)."""
    if module.torch_ops_when_compiled and residual is None and module.use_triton is None and tracing():
        return False
    return module.use_triton
