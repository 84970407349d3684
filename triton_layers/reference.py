"""Pure-torch definitions of every op: the CPU fallback and the tests' oracle.

Each function takes the same 2-D (rows x columns) layout as the kernels, computes its
statistics in fp32 (or in float64 when given float64; a float64 parameter multiplies in
float64) and returns the input's dtype. It is the only path for float64 (the kernels compute
in fp32), so it takes every dtype torch's layers take.
They are written for clarity, not speed, and are differentiable with torch autograd.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# The ops' own value checker: a bad value gets here the error it gets from the op or module.
from ._values import check_flag, check_int, check_k_within_row, check_number
from .fp8 import AMAX_FLOOR, GROUP_SIZE, FP8Recipe, new_scales

# Same floor as the kernels: an all-zero row is divided by this, not by zero.
STABLE_MIN_SCALE = 1e-30


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def norm(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
    *,
    rms: bool = False,
    stable: bool = False,
    unit_offset: bool = False,
    cast_before_weight: bool = False,
    residual: Optional[Tensor] = None,
    residual_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
):
    """LayerNorm (or RMSNorm with ``rms``) over the last dim: ``y``, or ``(y, h)`` with a residual.

    - ``residual``: ``h = x.to(d) + residual.to(d)`` with d = ``residual_dtype`` (default the
      residual's dtype), and ``y`` normalizes ``h``.
    - ``stable``: each row is first divided by its max |value| (detached).
    - ``unit_offset``: multiply by ``1 + weight`` (Gemma); ``cast_before_weight``: round the
      normalized value to the input's dtype before multiplying by the weight (Llama).
    - ``y`` has ``out_dtype`` (default the normalized input's dtype).
    """
    check_number(eps, "eps", minimum=0)
    check_flag(stable, "stable")
    check_flag(unit_offset, "unit_offset")
    h = None
    if residual is not None:
        d = residual_dtype or residual.dtype
        h = x = x.to(d) + residual.to(d)
    xf = x.to(_compute_dtype(x))
    if stable:
        scale = xf.detach().abs().amax(dim=-1, keepdim=True).clamp_min(STABLE_MIN_SCALE)
        xf = xf / scale
    if rms:
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    else:
        mean = xf.mean(dim=-1, keepdim=True)
        var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)
        y = (xf - mean) * torch.rsqrt(var + eps)
    if cast_before_weight:
        y = y.to(x.dtype).to(xf.dtype)
    # A parameter multiplies (adds) in the statistics' dtype, or in float64 where it is float64
    # (y rounded to x's dtype after, as torch's rms_norm does with a float64 weight).
    if weight is not None:
        w = weight.to(torch.promote_types(y.dtype, weight.dtype))
        y = y.to(w.dtype) * (1.0 + w if unit_offset else w)
    if bias is not None:
        b = bias.to(torch.promote_types(y.dtype, bias.dtype))
        y = y.to(b.dtype) + b
    y = y.to(out_dtype or x.dtype)
    return y if h is None else (y, h)



def norm_fp8(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
    recipe: FP8Recipe,
    scale: Optional[Tensor] = None,
    *,
    rms: bool = False,
    unit_offset: bool = False,
    cast_before_weight: bool = False,
    residual: Optional[Tensor] = None,
    residual_dtype: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor, Optional[Tensor], Tensor]:
    """The norm, then FP8 by ``recipe`` (``triton_layers/fp8.py`` has the conventions):
    ``(data, scale, h, y)`` with ``y`` the norm's output in fp32 before quantization
    (differentiable) and ``h`` the residual sum or None. ``scale`` (a one-element tensor):
    the static per-tensor scale. (``recipe.transposed``'s copy: :func:`quantize_fp8_transposed`
    of ``y``.)"""
    out = norm(x, weight, bias, eps, rms=rms, unit_offset=unit_offset, cast_before_weight=cast_before_weight,
               residual=residual, residual_dtype=residual_dtype, out_dtype=torch.float32)
    y, h = out if residual is not None else (out, None)
    data, scales = quantize_fp8(y.detach(), recipe, scale)
    return data, scales, h, y


def quantize_fp8(y: Tensor, recipe: FP8Recipe, scale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``(data, scale)``: fp32 ``y`` (rows of its last dim) quantized by ``recipe``; ``scale``
    given: the static per-tensor scale."""
    y = y.to(torch.float32)
    fp8_max = recipe.fp8_max
    lead, n_cols = y.shape[:-1], y.shape[-1]
    if recipe.granularity == "per_group":
        values = y.reshape(*lead, n_cols // GROUP_SIZE, GROUP_SIZE)
        amax = values.abs().amax(dim=-1, keepdim=True)
    elif recipe.granularity == "per_token":
        values, amax = y, y.abs().amax(dim=-1, keepdim=True)
    else:
        values, amax = y, y.abs().amax() if y.numel() else y.new_zeros(())
    if scale is not None:
        s = scale.to(torch.float32).reshape(())
    else:
        if recipe.scale_ub is not None:
            amax = amax.clamp_max(recipe.scale_ub)
        s = amax.clamp_min(AMAX_FLOOR) / fp8_max
        if recipe.pow2_scales:
            s = pow2_ceil(s)
    data = (values * (1.0 / s)).clamp(-fp8_max, fp8_max).to(recipe.dtype).reshape(y.shape)
    if recipe.column_major_scales:
        scales = new_scales(recipe, tuple(lead), n_cols, y)
        return data, scales.copy_(s.reshape(-1, n_cols // GROUP_SIZE))
    # (the scales as computed, not copied into a new tensor: a DTensor's keep its rows' sharding)
    scales = s.reshape(recipe.scale_shape(tuple(lead), n_cols))
    return data, scales.clone() if scale is not None else scales  # (a given scale: never aliased)


def quantize_fp8_transposed(y: Tensor, recipe: FP8Recipe) -> tuple[Tensor, Tensor]:
    """``(data_t, scale_t)``: the transposed copy of ``FP8Recipe(transposed=True)``. fp32 ``y``'s
    rows (its leading dims flattened: M of them, H columns) seen as ``y.T`` (H x M) and
    quantized in 1x128 blocks along M: a scale per column of ``y`` and block of 128 rows, the
    last block ragged (its ``M % 128`` rows only), with the recipe's dtype and ``pow2_scales``.
    ``data_t`` ``(H, M)`` and ``scale_t`` ``(H, ceil(M / 128))``, both contiguous."""
    y = y.to(torch.float32)
    n_cols = y.shape[-1]
    n_rows = 1
    for d in y.shape[:-1]:
        n_rows *= d
    (_, _), (_, blocks) = recipe.transposed_shapes(n_rows, n_cols)
    fp8_max = recipe.fp8_max
    # (zeros pad the last block: they leave every amax as it is, and are cut off after)
    yt = torch.nn.functional.pad(y.reshape(n_rows, n_cols).t(), (0, blocks * GROUP_SIZE - n_rows))
    values = yt.reshape(n_cols, blocks, GROUP_SIZE)
    s = values.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR) / fp8_max
    if recipe.pow2_scales:
        s = pow2_ceil(s)
    data = (values * (1.0 / s)).clamp(-fp8_max, fp8_max).to(recipe.dtype).reshape(n_cols, blocks * GROUP_SIZE)
    return data[:, :n_rows].contiguous(), s.reshape(n_cols, blocks)


def pow2_ceil(s: Tensor) -> Tensor:
    """The smallest power of two >= each (positive, normal) fp32 ``s``: from the bits (the
    exponent, raised by one where any mantissa bit is set), so exact where ``ceil(log2(s))``
    can round the wrong way."""
    s = s.to(torch.float32).contiguous()
    bits = s.view(torch.int32)
    up = torch.where((bits & 0x7FFFFF) != 0, 0x800000, 0).to(torch.int32)
    return torch.where(s.isnan(), s, ((bits & 0x7F800000) + up).view(torch.float32))  # (NaN stays NaN)

def layer_norm(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float, stable: bool
) -> Tensor:
    """LayerNorm over the last dim; ``stable`` first divides each row by its max |x| (detached)."""
    return norm(x, weight, bias, eps, stable=stable)


def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float, unit_offset: bool = False) -> Tensor:
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * weight`` (``* (1 + weight)``
    with ``unit_offset``), computed in fp32 and rounded once to x's dtype."""
    return norm(x, weight, None, eps, rms=True, unit_offset=unit_offset)


def weighted_sum(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``(x * weight).sum(-1) + bias`` over the last dim, in fp32 (float64 where any is float64)."""
    ct = _compute_dtype(x)
    for t in (weight, bias):
        if t is not None:
            ct = torch.promote_types(ct, t.dtype)
    y = (x.to(ct) * weight.to(ct)).sum(dim=-1)
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(x.dtype)


def coor_descent(
    s: Tensor,
    n_iters: int,
    k: float | Tensor,
    eps: float,
    eps_init: Optional[float],
    eps_decay: float,
    mask: Optional[Tensor],
) -> Tensor:
    """CoLT5 coordinate descent (soft top-k with eps-scaling) over the last dim.

    ``k``: a number at most ``s.shape[-1]`` (a ValueError above: scores lie in [0, 1]) or
    a tensor with one value per row (shape ``s.shape[:-1]``, not checked against the row
    length); log k uses k clamped to >= 1e-20. ``mask`` (bool, True = valid) excludes entries; they
    score 0, and a fully masked row is all zeros with zero gradients. The epsilon
    schedule is the Python-float one of colt5-attention's ``coor_descent``.
    """
    import math  # local: keeps this op's additions to the module in one place

    check_int(n_iters, "n_iters", minimum=1)
    check_number(eps, "eps", positive=True)
    check_number(eps_init, "eps_init", positive=True, allow_none=True)
    check_number(eps_decay, "eps_decay", positive=True)
    if not isinstance(k, Tensor):
        check_number(k, "k", positive=True)
        check_k_within_row(k, s.shape)
    dt = _compute_dtype(s)
    sf = s.to(dt)
    if isinstance(k, Tensor):
        logk = k.to(dt).clamp_min(1e-20).log().unsqueeze(-1)
    else:
        logk = math.log(max(float(k), 1e-20))
    if mask is not None:
        # Fully masked rows run on all their entries and are zeroed at the end.
        mask = mask.to(torch.bool)
        live = mask | ~mask.any(dim=-1, keepdim=True)
        # Masked entries are never used: zeroed, so a NaN or inf there reaches no gradient.
        sf = sf.masked_fill(~mask, 0.0)
    e = max(eps if eps_init is None else eps_init, eps)
    a = torch.zeros_like(sf[..., :1])
    b = -sf
    for _ in range(n_iters):
        z = (sf + b) / e
        if mask is not None:
            z = z.masked_fill(~live, float("-inf"))
        a = e * (logk - z.logsumexp(dim=-1, keepdim=True))
        b = -torch.relu(sf + a)
        e = max(e * eps_decay, eps)
    y = ((sf + a + b) / e).exp()
    if mask is not None:
        y = y.masked_fill(~mask, 0.0)
    return y.to(s.dtype)


def softmax(
    x: Tensor,
    causal: bool = False,
    scale: Optional[float] = None,
    key_padding_mask: Optional[Tensor] = None,
) -> Tensor:
    """Masked softmax of ``scale * x`` over the last dim; masked keys and fully masked rows give 0.

    Unlike the other references it takes ``x`` in its own shape (..., Nq, Nk), because the
    masks depend on the last two dims: with ``causal``, query i sees keys
    j <= i + (Nk - Nq) (bottom-right aligned); ``key_padding_mask`` is bool (B, Nk),
    True = padding, for ``x`` of shape (B, Nq, Nk) or (B, H, Nq, Nk).
    """
    check_flag(causal, "causal")
    check_number(scale, "scale", allow_none=True)
    z = x.to(_compute_dtype(x)) * (1.0 if scale is None else scale)
    keep = torch.ones(x.shape[-1:], dtype=torch.bool, device=x.device)
    if causal:
        n_q, n_k = x.shape[-2], x.shape[-1]
        q = torch.arange(n_q, device=x.device)[:, None]
        keep = torch.arange(n_k, device=x.device)[None, :] <= q + (n_k - n_q)
    if key_padding_mask is not None:
        pad = key_padding_mask.reshape(x.shape[0], *([1] * (x.dim() - 2)), x.shape[-1])
        keep = keep & ~pad
    keep = keep.expand(x.shape)
    z = z.masked_fill(~keep, float("-inf"))
    # Rows with no visible key, or whose visible scores are all -inf (an additive mask),
    # go through softmax as zeros (finite, no NaN) and are zeroed: the kernels' result.
    empty_row = (z == float("-inf")).all(dim=-1, keepdim=True)
    z = z.masked_fill(empty_row, 0.0)
    y = torch.softmax(z, dim=-1).masked_fill(~keep | empty_row, 0.0)
    return y.to(x.dtype)
