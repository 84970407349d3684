"""Pure-torch definitions of every op: the CPU fallback and the tests' oracle.

Each function takes the same 2-D (rows x columns) layout as the kernels, computes its
statistics in fp32 (or in float64 when given float64) and returns the input's dtype.
They are written for clarity, not speed, and are differentiable with torch autograd.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# Same floor as the kernels: an all-zero row is divided by this, not by zero.
STABLE_MIN_SCALE = 1e-30


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def layer_norm(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float, stable: bool
) -> Tensor:
    """LayerNorm over the last dim; ``stable`` first divides each row by its max |x| (detached)."""
    xf = x.to(_compute_dtype(x))
    if stable:
        scale = xf.detach().abs().amax(dim=-1, keepdim=True).clamp_min(STABLE_MIN_SCALE)
        xf = xf / scale
    mean = xf.mean(dim=-1, keepdim=True)
    var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


def weighted_sum(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``(x * weight).sum(-1) + bias`` over the last dim, in fp32 (float64 for float64 x)."""
    ct = _compute_dtype(x)
    y = (x.to(ct) * weight.to(ct)).sum(dim=-1)
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(x.dtype)
