"""What the compute-sanitizer driver (``scripts/sanitize.py``) gives each op's cases to build with.

Each op's bench file declares its cases, ``sanitize_cases(C) -> {kernel op: {case name: thunk}}``
for the launch config ``C`` (sizes around its limits: where a kernel changes path), each thunk
running one small case through ``fwd_bwd`` and returning its worst error as a fraction of the
bound. The driver runs every op part's cases (``benchmarks/parts.py``), named ``<kernel op>: <case>``.

The check is loose on purpose (a memory checker's driver: it catches garbage, not ulps; the
tests check accuracy): ``|ours - exact| <= LOOSE[dtype] * max|exact|`` (max|exact| at least
1e-6) against float64, with the looser of the output's and the compared tensor's dtype.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOOSE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def rand(*shape, dtype=torch.float32, sliced: bool = False, scale: float = 1.0) -> torch.Tensor:
    """Random values; ``sliced``: a view whose rows are strided (row stride = n + 3)."""
    if not sliced:
        return (scale * torch.randn(shape, device=DEVICE)).to(dtype)
    wide = (scale * torch.randn(*shape[:-1], shape[-1] + 3, device=DEVICE)).to(dtype)
    return wide[..., 1:1 + shape[-1]]


def around(limit: int) -> list[int]:
    """One below, at and one above a limit."""
    return [limit - 1, limit, limit + 1]


def _grads(fn: Callable, args: list[Any], dy):
    """fn(*args) detached and the gradients of the tensors that require one, for dy (default:
    standard normal in the output's dtype)."""
    y = fn(*args)
    wrt = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
    if dy is None:
        dy = torch.randn(y.shape, device=y.device).to(y.dtype)
    return y.detach(), list(torch.autograd.grad(y, wrt, dy.to(y.dtype))) if wrt else [], dy


def _error(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, name: str) -> float:
    """The error of ``got`` as a fraction of its loose bound; AssertionError past it."""
    assert got.shape == exact.shape, f"{name}: shape {tuple(got.shape)} != {tuple(exact.shape)}"
    assert not torch.isnan(got).any() or torch.isnan(exact).any(), f"{name}: NaN in result"
    if got.numel() == 0:
        return 0.0
    scale = exact.abs().max().item()
    bound = LOOSE[dtype] * max(scale, 1e-6)
    err = (got.double() - exact).abs().max().item()
    assert err <= bound, f"{name}: max abs error {err:.3e} > {bound:.3e} (dtype {dtype}, scale {scale:.3e})"
    return err / bound


def fwd_bwd(fn: Callable, ref: Callable, inputs: list, needs_grad: list[bool]) -> float:
    """fn and ref (in float64, on float64 copies of the floating inputs) on the same inputs: the
    output and each requested gradient within the loose bound; the worst error as a fraction of it."""
    leaves = [t.detach().requires_grad_(g) if isinstance(t, torch.Tensor) else t for t, g in zip(inputs, needs_grad)]
    y, grads, dy = _grads(fn, leaves, None)
    exact = [t.detach().double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor)
             and t.is_floating_point() else t for t in leaves]
    y64, grads64, _ = _grads(ref, exact, dy.double())
    names = ["y"] + [f"d{i}" for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
    loosest = lambda t: max(t.dtype, y.dtype, key=LOOSE.__getitem__)  # noqa: E731
    worst = max(_error(got, want, loosest(got), name) for got, want, name in zip([y, *grads], [y64, *grads64], names))
    if DEVICE == "cuda":
        torch.cuda.synchronize()  # a fault is reported against this case
    return worst
