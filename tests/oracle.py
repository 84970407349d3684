"""The test oracle of every op: ours against float64, torch's own low-precision error as the bar.

Testing a new op (say RMSNorm) needs no harness of its own: build the inputs, then one
call runs ours, runs the definition in float64 (and, with ``lowp=True``, in ours' dtype
too), draws a random upstream gradient and compares the output and the gradient of every
input that requires one::

    import torch.nn.functional as TF
    from triton_layers import functional as F
    from .conftest import DTYPES          # parametrize dtype over it; the `looped` fixture
    from .oracle import check             # (conftest) runs a test on the long-row paths

    x = (2 * torch.randn(9, 1000, device=device)).to(dtype).requires_grad_()
    w = (1 + 0.5 * torch.randn(1000, device=device)).to(dtype).requires_grad_()
    check(lambda x, weight: F.rms_norm(x, weight),             # ours
          lambda x, weight: TF.rms_norm(x, (1000,), weight),  # the definition, in torch
          dict(x=x, weight=w),            # called positionally, in this order
          lowp=True,                      # torch's own result in x's dtype sets the fp16/bf16 bar
          summed=dict(weight=9))          # dweight sums over 9 rows: its fp32 bound grows

``check`` returns a :class:`Result` (ours and float64: output and gradients by name) for
any further assertion. ``compare`` checks one tensor against its float64 value;
``agree`` checks one against the same values computed another way in the same dtype
(the reference path, torch's op), elementwise.

The bound (one table, ``TOLERANCES``, keyed by the dtype of the tensor compared; s is
max|exact|, S = max(s, 1)):

- fp32: ``|ours - exact| <= rtol * s * growth + atol * S``, with
  ``growth = max(1, sqrt(rows / 64))`` for a value summed over ``rows`` rows (weight
  gradients: ``summed``; quack's rule).
- fp16 / bf16: ``<= 2 * |low - exact| + atol * S``, where ``low`` is torch's own result in
  that dtype (``lowp=True``, or passed to ``compare``) and otherwise the exact result
  rounded to the dtype (the best any computation can store).
- A ``low`` of the same dtype passed for an fp32 result adds its ``2 * |low - exact|`` too
  (coor_descent, whose exp(s / eps) amplifies fp32 rounding).

``rtol=`` (fp32 results only) / ``atol=`` (absolute) override the table for one call;
say why where you do.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Union

import torch


class Tolerance(NamedTuple):
    # compare(): against float64
    rtol: float  # x max|exact| (x growth for sums over rows); 0 for fp16/bf16, whose bar is torch's own error
    atol: float  # x max(1, max|exact|)
    # agree(): against another computation in the same dtype, elementwise
    agree_rtol: float  # x |other|
    agree_atol: float


TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=1e-5, agree_rtol=1e-5, agree_atol=1e-6),
    torch.float16: Tolerance(rtol=0.0, atol=1e-3, agree_rtol=2e-3, agree_atol=1e-5),
    torch.bfloat16: Tolerance(rtol=0.0, atol=1e-2, agree_rtol=1.6e-2, agree_atol=1e-5),
}
ROWS_PER_GROWTH = 64  # sums over up to this many rows keep the base fp32 rtol


def growth(rows: float) -> float:
    """How much the fp32 rtol grows for a value summed over ``rows`` rows."""
    return max(1.0, math.sqrt(rows / ROWS_PER_GROWTH))


def roundings_apart(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, roundings: int,
                    floor: float = 0.0) -> torch.Tensor:
    """Where ``got`` is within ``roundings`` roundings to ``dtype`` (its eps of ``|want|`` each,
    plus ``floor``) of ``want``: the bound of the norms' bit-level comparisons (a GPU kernel
    that rounds as the reference does: one; the interpreter, which truncates each bf16
    rounding: two)."""
    return (got.float() - want.float()).abs() <= roundings * torch.finfo(dtype).eps * want.float().abs() + floor


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def compare(
    ours: torch.Tensor,
    exact: torch.Tensor,
    *,
    low: Optional[torch.Tensor] = None,
    rows: float = 1,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    slack: float = 0.0,
    name: str = "",
) -> float:
    """Assert ``ours`` is within the bound of the module docstring of the float64 ``exact``.

    ``low``: torch's own result in ours' dtype (default for fp16/bf16: ``exact`` rounded).
    ``rows``: rows summed into each value. ``slack``: an absolute allowance added to the
    bound, derived by the test (say how). Returns the error as a fraction of the bound.
    """
    assert ours.shape == exact.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(exact.shape)}"
    assert not torch.isnan(ours).any() or torch.isnan(exact).any(), f"{name}: NaN in result"
    if ours.numel() == 0:
        return 0.0
    dtype = ours.dtype
    scale = exact.double().abs().max().item()
    err = max_abs_err(ours, exact)
    tol = TOLERANCES[dtype]
    if low is None and dtype != torch.float32:
        low = exact.to(dtype)
    bound = (tol.rtol if rtol is None or dtype != torch.float32 else rtol) * scale * growth(rows)
    bound += tol.atol * max(scale, 1.0) if atol is None else atol
    if low is not None and low.dtype == dtype:
        bound += 2 * max_abs_err(low, exact)
    bound += slack
    assert err <= bound, f"{name}: max abs error {err:.3e} > {bound:.3e} (dtype {dtype}, scale {scale:.3e})"
    return err / bound if bound else 0.0


def agree(
    ours: torch.Tensor,
    other: torch.Tensor,
    *,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    equal_nan: bool = False,
    name: str = "",
) -> None:
    """Assert ``ours`` matches ``other``, the same values computed another way in the same
    dtype (the reference path, torch's own op), elementwise: ``|ours - other| <= agree_atol
    + agree_rtol * |other|`` (about 2 ulps for fp16/bf16)."""
    tol = TOLERANCES[ours.dtype]
    torch.testing.assert_close(
        ours, other, rtol=tol.agree_rtol if rtol is None else rtol, atol=tol.agree_atol if atol is None else atol,
        equal_nan=equal_nan, msg=(lambda m: f"{name}: {m}") if name else None,
    )


class Result(NamedTuple):
    y: torch.Tensor  # ours (detached)
    grads: dict  # input name -> ours' gradient, for the inputs that require one
    y64: torch.Tensor
    grads64: dict
    worst: float  # the largest error, as a fraction of its bound


def _by_name(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, Mapping) else value


def _copy(t: Any, dtype: torch.dtype) -> Any:
    """A fresh leaf of a floating tensor in ``dtype`` (requiring grad as ``t`` does); others as they are."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().to(dtype).requires_grad_(t.requires_grad)
    return t


def run(fn: Callable, inputs: Mapping[str, Any], dy: Optional[torch.Tensor] = None):
    """``fn(*inputs.values())`` and the gradients of the inputs that require one, for ``dy``
    (default: standard normal in the output's dtype): (y detached, name -> gradient, dy)."""
    y = fn(*inputs.values())
    wrt = {k: t for k, t in inputs.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    if dy is None:
        dy = torch.randn(y.shape, device=y.device).to(y.dtype)
    grads = torch.autograd.grad(y, list(wrt.values()), dy.to(y.dtype)) if wrt else ()
    return y.detach(), dict(zip(wrt, grads)), dy


def check(
    ours: Callable,
    reference: Callable,
    inputs: Mapping[str, Any],
    *,
    dy: Optional[torch.Tensor] = None,
    lowp: Union[bool, Callable] = False,
    summed: Optional[Mapping[str, float]] = None,
    rtol: Union[None, float, Mapping[str, float]] = None,
    atol: Union[None, float, Mapping[str, float]] = None,
    slack: Union[float, Mapping[str, float]] = 0.0,
    name: str = "",
) -> Result:
    """Ours and ``reference`` (float64) on ``inputs``: the output and every gradient compared.

    ``inputs``: name -> argument, passed positionally in order; ours gets them as they are
    (views and strides included), the reference float64 copies of the floating tensors.
    The gradient of each tensor that requires one is compared, named ``d<name>``.
    ``dy``: the upstream gradient (default: standard normal in ours' dtype).
    ``lowp``: for an fp16/bf16 output, also run ``reference`` (or this callable: torch's own
    op where the reference is not) on copies in ours' dtype: torch's error there is the bar.
    ``summed``: name (``"y"`` for the output) -> rows summed into each value of its gradient.
    ``rtol``, ``atol``, ``slack``: as ``compare``, for all, or by name (``"y"``, input names).
    """
    summed = summed or {}
    y, grads, dy = run(ours, inputs, dy)
    dtype = y.dtype
    y64, grads64, _ = run(reference, {k: _copy(t, torch.float64) for k, t in inputs.items()}, dy.double())
    y_lp, grads_lp = None, {}
    if lowp and dtype != torch.float32:
        lp_fn = reference if lowp is True else lowp
        y_lp, grads_lp, _ = run(lp_fn, {k: _copy(t, dtype) for k, t in inputs.items()}, dy)
    prefix = f"{name} " if name else ""
    worst = 0.0
    results = [("y", y, y64, y_lp)] + [(k, g, grads64[k], grads_lp.get(k)) for k, g in grads.items()]
    for k, got, exact, low in results:
        worst = max(worst, compare(
            got, exact, low=low, rows=summed.get(k, 1), rtol=_by_name(rtol, k), atol=_by_name(atol, k),
            slack=_by_name(slack, k) or 0.0,
            name=prefix + ("y" if k == "y" else f"d{k}"),
        ))
    return Result(y, grads, y64, grads64, worst)
