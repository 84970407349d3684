"""Comparison helpers with tolerances by dtype (docs/ARCHITECTURE.md).

fp32 results are compared with a float64 reference at a tight tolerance. fp16/bf16
results may be off by no more than twice what torch's own computation in that dtype is
off by (against float64), plus a small absolute slack.
"""
from __future__ import annotations

import torch

FP32_RTOL = {torch.float32: 1e-5}
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_close_to_reference(
    ours: torch.Tensor,
    exact: torch.Tensor,
    torch_low_precision: torch.Tensor | None = None,
    rtol32: float = 1e-5,
    atol: float | None = None,
    name: str = "",
) -> None:
    """Compare ``ours`` with the float64 ``exact`` result.

    For fp32, |ours - exact| <= atol + rtol32 * max|exact|. For fp16/bf16, the error may
    be at most 2x the error of ``torch_low_precision`` (torch's own result in that dtype)
    plus ``atol``; without it, a dtype-based tolerance of a few ulps is used.
    """
    assert ours.shape == exact.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(exact.shape)}"
    assert not torch.isnan(ours).any() or torch.isnan(exact).any(), f"{name}: NaN in result"
    if ours.numel() == 0:
        return
    scale = exact.double().abs().max().item() or 1.0
    err = max_abs_err(ours, exact)
    dtype = ours.dtype
    atol = ATOL.get(dtype, 1e-5) * max(scale, 1.0) if atol is None else atol
    if dtype in (torch.float32, torch.float64):
        bound = atol + rtol32 * scale
    elif torch_low_precision is not None:
        bound = 2 * max_abs_err(torch_low_precision, exact) + atol
    else:
        bound = (8 * torch.finfo(dtype).eps) * scale + atol
    assert err <= bound, f"{name}: max abs error {err:.3e} > {bound:.3e} (dtype {dtype}, scale {scale:.3e})"
