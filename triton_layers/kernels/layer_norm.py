"""LayerNorm over the last dim of a 2-D tensor: Triton kernels, launchers, autograd.

Forward:  y = (x' - mean) * rstd * weight + bias, with x' = x, or x / max|x| per row
          (detached) in stable mode. mean, rstd (and 1/max|x|) are fp32 and saved.
Backward: with xhat = (x' - mean) * rstd and g = weight * dy,
          dx' = rstd * (g - xhat * mean(g * xhat) - mean(g)),  dx = dx' / max|x|,
          dweight = sum_rows(dy * xhat), dbias = sum_rows(dy).
The weight/bias gradients are summed per program into fp32 partials (one row of
partials per program, no atomics) and the partials are reduced with torch: the
result does not depend on timing, so it is bitwise identical from run to run.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from . import _launch

# Smallest divisor used for stable mode, so an all-zero row normalizes to zeros (not NaN).
STABLE_MIN_SCALE = 1e-30


@triton.jit
def _layer_norm_fwd_kernel(
    X, Y, W, B, Mean, Rstd, InvScale,
    stride_x_row, stride_y_row, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STABLE: tl.constexpr,
    BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x_row
    Y += row * stride_y_row
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:
        mask = cols < N
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        if STABLE:
            inv_scale = 1.0 / tl.maximum(tl.max(tl.abs(x), axis=0), STABLE_MIN_SCALE)
            x = x * inv_scale
            tl.store(InvScale + row, inv_scale)
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(mask, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        y = xc * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        inv_scale = 1.0
        if STABLE:
            amax = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                x = tl.load(X + start + cols, mask=start + cols < N, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.abs(x))
            inv_scale = 1.0 / tl.maximum(tl.max(amax, axis=0), STABLE_MIN_SCALE)
            tl.store(InvScale + row, inv_scale)
        # Sums shifted by the row's first element: as exact as two passes for data whose
        # mean is large against its spread, with one pass over the row.
        shift = tl.load(X).to(tl.float32) * inv_scale
        acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            mask = start + cols < N
            x = tl.load(X + start + cols, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, x * inv_scale - shift, 0.0)
            acc1 += d
            acc2 += d * d
        s1 = tl.sum(acc1, axis=0)
        s2 = tl.sum(acc2, axis=0)
        mean = shift + s1 / N
        var = tl.maximum((s2 - s1 * s1 / N) / N, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)
        for start in range(0, N, BLOCK_N):
            mask = start + cols < N
            x = tl.load(X + start + cols, mask=mask, other=0.0).to(tl.float32)
            y = (x * inv_scale - mean) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(B + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def _layer_norm_bwd_kernel(
    DY, X, W, Mean, Rstd, InvScale, DX, DW_partial, DB_partial,
    stride_dy_row, stride_x_row, stride_dx_row, M, N, rows_per_program,
    HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    # Each program walks a contiguous range of rows and owns one row of the partials.
    pid = tl.program_id(0).to(tl.int64)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK_N)
    DW_partial += pid * N
    DB_partial += pid * N
    if SINGLE_PASS:
        mask = cols < N
        w = 1.0
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for row in range(row_start, row_end):
            x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(tl.float32)
            inv_scale = 1.0
            if STABLE:
                inv_scale = tl.load(InvScale + row)
            mean = tl.load(Mean + row)
            rstd = tl.load(Rstd + row)
            xhat = tl.where(mask, (x * inv_scale - mean) * rstd, 0.0)
            if COMPUTE_DX:
                g = w * dy
                c1 = tl.sum(xhat * g, axis=0) / N
                c2 = tl.sum(g, axis=0) / N
                dx = (g - (xhat * c1 + c2)) * (rstd * inv_scale)
                tl.store(DX + row * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=mask)
            if COMPUTE_DW:
                dw_acc += dy * xhat
            if COMPUTE_DB:
                db_acc += dy
        if COMPUTE_DW:
            tl.store(DW_partial + cols, dw_acc, mask=mask)
        if COMPUTE_DB:
            tl.store(DB_partial + cols, db_acc, mask=mask)
    else:
        # Rows longer than a block: a first pass over the row for the two row sums, a
        # second (served mostly from L2) for dx; the partials are zero-initialised
        # rows in memory that only this program reads and writes.
        for row in range(row_start, row_end):
            x_row = X + row * stride_x_row
            dy_row = DY + row * stride_dy_row
            inv_scale = 1.0
            if STABLE:
                inv_scale = tl.load(InvScale + row)
            mean = tl.load(Mean + row)
            rstd = tl.load(Rstd + row)
            c1 = 0.0
            c2 = 0.0
            if COMPUTE_DX:
                acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
                acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
                for start in range(0, N, BLOCK_N):
                    mask = start + cols < N
                    x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    dy = tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    g = dy
                    if HAS_WEIGHT:
                        g = dy * tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
                    xhat = tl.where(mask, (x * inv_scale - mean) * rstd, 0.0)
                    acc1 += xhat * g
                    acc2 += g
                c1 = tl.sum(acc1, axis=0) / N
                c2 = tl.sum(acc2, axis=0) / N
            for start in range(0, N, BLOCK_N):
                mask = start + cols < N
                x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                xhat = tl.where(mask, (x * inv_scale - mean) * rstd, 0.0)
                if COMPUTE_DX:
                    g = dy
                    if HAS_WEIGHT:
                        g = dy * tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
                    dx = (g - (xhat * c1 + c2)) * (rstd * inv_scale)
                    tl.store(DX + row * stride_dx_row + start + cols, dx.to(DX.dtype.element_ty), mask=mask)
                if COMPUTE_DW:
                    dw = tl.load(DW_partial + start + cols, mask=mask, other=0.0)
                    tl.store(DW_partial + start + cols, dw + dy * xhat, mask=mask)
                if COMPUTE_DB:
                    db = tl.load(DB_partial + start + cols, mask=mask, other=0.0)
                    tl.store(DB_partial + start + cols, db + dy, mask=mask)


def _empty_f32(n: int, like: Tensor) -> Tensor:
    return torch.empty(n, dtype=torch.float32, device=like.device)


@triton_op("triton_layers::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float, stable: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Forward launcher: ``x`` is 2-D with last stride 1. Returns ``(y, mean, rstd, inv_scale)``.

    ``inv_scale`` (1 / max|x| per row) is filled only in stable mode, else it is empty.
    """
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean, rstd = _empty_f32(n_rows, x), _empty_f32(n_rows, x)
    inv_scale = _empty_f32(n_rows if stable else 0, x)
    block, single_pass = _launch.row_block(n_cols)
    wrap_triton(_layer_norm_fwd_kernel)[(n_rows,)](
        x, y, weight, bias, mean, rstd, inv_scale,
        x.stride(0), y.stride(0), n_cols, eps,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, STABLE=stable,
        BLOCK_N=block, SINGLE_PASS=single_pass, num_warps=_launch.num_warps(block),
    )
    return y, mean, rstd, inv_scale


@triton_op("triton_layers::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(
    dy: Tensor, x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor, inv_scale: Tensor,
    stable: bool, compute_dx: bool, compute_dw: bool, compute_db: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Backward launcher. Returns ``(dx, dweight, dbias)``; those not asked for are empty."""
    n_rows, n_cols = x.shape
    block, single_pass = _launch.row_block(n_cols)
    programs, rows_per_program = _launch.persistent_grid(n_rows, x.device)
    dx = torch.empty((n_rows, n_cols) if compute_dx else (0, n_cols), dtype=x.dtype, device=x.device)
    # The looped kernel adds into its partials, so they must start at zero.
    alloc = torch.empty if single_pass else torch.zeros
    dw_partial = alloc((programs if compute_dw else 0, n_cols), dtype=torch.float32, device=x.device)
    db_partial = alloc((programs if compute_db else 0, n_cols), dtype=torch.float32, device=x.device)
    wrap_triton(_layer_norm_bwd_kernel)[(programs,)](
        dy, x, weight, mean, rstd, inv_scale, dx, dw_partial, db_partial,
        dy.stride(0), x.stride(0), dx.stride(0), n_rows, n_cols, rows_per_program,
        HAS_WEIGHT=weight is not None, STABLE=stable,
        COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
        BLOCK_N=block, SINGLE_PASS=single_pass, num_warps=_launch.num_warps(block),
    )
    dweight = dw_partial.sum(0) if compute_dw else dw_partial.new_empty(0)
    dbias = db_partial.sum(0) if compute_db else db_partial.new_empty(0)
    return dx, dweight, dbias


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _eps, stable = inputs
    _y, mean, rstd, inv_scale = output
    ctx.save_for_backward(x, weight, mean, rstd, inv_scale)
    ctx.stable = stable
    ctx.weight_dtype = None if weight is None else weight.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, dy, _dmean, _drstd, _dinv_scale):
    x, weight, mean, rstd, inv_scale = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if dy.stride(-1) != 1:
        dy = dy.contiguous()
    dx, dweight, dbias = layer_norm_bwd(
        dy, x, weight, mean, rstd, inv_scale, ctx.stable, need_dx, need_dw, need_db
    )
    return (
        dx if need_dx else None,
        dweight.to(ctx.weight_dtype) if need_dw else None,
        dbias.to(ctx.bias_dtype) if need_db else None,
        None,
        None,
    )


layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float, stable: bool) -> Tensor:
    """Differentiable LayerNorm of a 2-D ``x`` (last stride 1) through the kernels."""
    return layer_norm_fwd(x, weight, bias, eps, stable)[0]
