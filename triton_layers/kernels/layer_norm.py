"""LayerNorm over the last dim of a 2-D tensor: Triton kernels, launchers, autograd.

Forward:  y = (x' - mean) * rstd * weight + bias, with x' = x, or x / max|x| per row
          (detached) in stable mode. mean, rstd (and 1/max|x|) are fp32 and saved,
          as the rows of one (2 or 3, M) ``stats`` tensor: one allocation, not three.
Backward: with xhat = (x' - mean) * rstd and g = weight * dy,
          dx' = rstd * (g - xhat * mean(g * xhat) - mean(g)),  dx = dx' / max|x|,
          dweight = sum_rows(dy * xhat), dbias = sum_rows(dy).
The weight/bias gradients are summed per program into fp32 partials (one row of
partials per program, no atomics; weight's and bias's in one tensor) and the partials
are reduced with one torch sum: the result does not depend on timing, so it is bitwise
identical from run to run. (Allocations and launches are few because at small shapes
the host, not the GPU, sets the pace.)
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from . import _doors, _launch

# Smallest divisor used for stable mode, so an all-zero row normalizes to zeros (not NaN).
# A tl.constexpr: real (non-interpreted) Triton only reads constexpr globals.
STABLE_MIN_SCALE = tl.constexpr(1e-30)


@triton.jit
def _div(row_sums, N):
    """Per-row sums / N, correctly rounded (the GPU's default fp32 division, div.full.f32,
    may be 2 ulp off; these means feed every element of the row)."""
    return tl.div_rn(row_sums, tl.zeros_like(row_sums) + N)


@triton.jit
def _rounded_product(a, b, mask):
    """a * b rounded to fp32 before any later use (0 outside ``mask``). Behind the select,
    the compiler cannot fuse the product into a following ``- mean`` as an FMA, which
    would subtract a mean of rounded products from an unrounded one: on rows of one
    element, where dx, xhat and dweight are exactly 0, that left ~1e-6 times
    rstd = 1/sqrt(eps) in them on the GPU (w * dy before mean(w * dy); x / max|x| before
    its mean in stable mode)."""
    return tl.where(mask, a * b, 0.0)


@triton.jit
def _stat_rows(Stats, M):
    """Pointers to the mean, rstd and 1/max|x| rows of the (2 or 3, M) stats tensor."""
    return Stats, Stats + M, Stats + 2 * M


@triton.jit
def _layer_norm_fwd_kernel(
    X, Y, W, B, Stats,
    stride_x_row, stride_y_row, M, N, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STABLE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    # One program normalizes BLOCK_M rows: short rows still give each program enough bytes.
    Mean, Rstd, InvScale = _stat_rows(Stats, M)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_N)
    x_rows = X + rows[:, None] * stride_x_row
    y_rows = Y + rows[:, None] * stride_y_row
    if SINGLE_PASS:
        mask = row_mask[:, None] & (cols[None, :] < N)
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if STABLE:
            inv_scale = 1.0 / tl.maximum(tl.max(tl.abs(x), axis=1), STABLE_MIN_SCALE)
            x = _rounded_product(x, inv_scale[:, None], mask)
            tl.store(InvScale + rows, inv_scale, mask=row_mask)
        mean = _div(tl.sum(x, axis=1), N)
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(_div(tl.sum(xc * xc, axis=1), N) + eps)
        y = xc * rstd[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        inv_scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if STABLE:
            amax = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                mask = row_mask[:, None] & (start + cols[None, :] < N)
                x = tl.load(x_rows + start + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.abs(x))
            inv_scale = 1.0 / tl.maximum(tl.max(amax, axis=1), STABLE_MIN_SCALE)
            tl.store(InvScale + rows, inv_scale, mask=row_mask)
        # Sums shifted by each row's first element: as exact as two passes for data whose
        # mean is large against its spread, with one pass over the row.
        shift = tl.load(X + rows * stride_x_row, mask=row_mask, other=0.0).to(tl.float32) * inv_scale
        acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            mask = row_mask[:, None] & (start + cols[None, :] < N)
            x = tl.load(x_rows + start + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, _rounded_product(x, inv_scale[:, None], mask) - shift[:, None], 0.0)
            acc1 += d
            acc2 += d * d
        s1 = tl.sum(acc1, axis=1)
        s2 = tl.sum(acc2, axis=1)
        mean = shift + _div(s1, N)
        # Clamp rounding below zero, but let a NaN variance (a row holding inf) through,
        # as torch does: fmax(NaN, 0) would give 0 and a finite rstd.
        var = tl.maximum(_div(s2 - _div(s1 * s1, N), N), 0.0, propagate_nan=tl.PropagateNan.ALL)
        rstd = 1.0 / tl.sqrt(var + eps)
        for start in range(0, N, BLOCK_N):
            col_mask = start + cols < N
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(x_rows + start + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            y = (_rounded_product(x, inv_scale[:, None], mask) - mean[:, None]) * rstd[:, None]
            if HAS_WEIGHT:
                y = y * tl.load(W + start + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            if HAS_BIAS:
                y = y + tl.load(B + start + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(y_rows + start + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + rows, mean, mask=row_mask)
    tl.store(Rstd + rows, rstd, mask=row_mask)


@triton.jit
def _load_bwd_tile(
    X, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_x_row, stride_dy_row,
    STABLE: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """dy and xhat (fp32, 0 outside ``mask``) of a tile, with the rows' rstd and 1/max|x|."""
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    inv_scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    if STABLE:
        inv_scale = tl.load(InvScale + rows, mask=row_mask, other=1.0)
    mean = tl.load(Mean + rows, mask=row_mask, other=0.0)
    rstd = tl.load(Rstd + rows, mask=row_mask, other=0.0)
    xhat = tl.where(mask, (_rounded_product(x, inv_scale[:, None], mask) - mean[:, None]) * rstd[:, None], 0.0)
    return dy, xhat, rstd, inv_scale


@triton.jit
def _partial_rows(Partials, program, n_programs, N, COMPUTE_DW: tl.constexpr):
    """This program's row of weight partials and of bias partials in ``Partials``,
    (weight's if asked, then bias's if asked) x n_programs x N."""
    DW_partial = Partials + program * N
    DB_partial = DW_partial
    if COMPUTE_DW:
        DB_partial += n_programs.to(tl.int64) * N
    return DW_partial, DB_partial


@triton.jit
def _layer_norm_bwd_kernel(
    DY, X, W, Stats, DX, Partials,
    stride_dy_row, stride_x_row, stride_dx_row, M, N, tiles_per_program,
    HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    # Rows that fit one block (longer rows take the two split kernels below).
    # Each program walks a contiguous range of BLOCK_M-row tiles and owns one row of the
    # weight/bias partials: a fixed reduction order, hence bitwise-reproducible sums.
    Mean, Rstd, InvScale = _stat_rows(Stats, M)
    pid = tl.program_id(0).to(tl.int64)
    tile_start = pid * tiles_per_program
    tile_end = tl.minimum(tile_start + tiles_per_program, tl.cdiv(M, BLOCK_M))
    cols = tl.arange(0, BLOCK_N)
    DW_partial, DB_partial = _partial_rows(Partials, pid, tl.num_programs(0), N, COMPUTE_DW)
    col_mask = cols < N
    w = tl.full([BLOCK_N], 1.0, dtype=tl.float32)
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    # NUM_STAGES > 1 prefetches the next tiles' x and dy while this one is reduced.
    for tile in tl.range(tile_start, tile_end, num_stages=NUM_STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        dy, xhat, rstd, inv_scale = _load_bwd_tile(
            X, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_x_row, stride_dy_row, STABLE, BLOCK_M
        )
        if COMPUTE_DX:
            g = _rounded_product(dy, w[None, :], mask)
            c1 = _div(tl.sum(xhat * g, axis=1), N)
            c2 = _div(tl.sum(g, axis=1), N)
            dx = (g - (xhat * c1[:, None] + c2[:, None])) * (rstd * inv_scale)[:, None]
            tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db_acc += tl.sum(dy, axis=0)
    if COMPUTE_DW:
        tl.store(DW_partial + cols, dw_acc, mask=col_mask)
    if COMPUTE_DB:
        tl.store(DB_partial + cols, db_acc, mask=col_mask)


@triton.jit
def _layer_norm_bwd_row_sums_kernel(
    DY, X, W, Stats, Sums,
    stride_dy_row, stride_x_row, M, N, n_chunks,
    HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Long rows, step 1: program (row, chunk) writes the chunk's share of the two row sums
    # sum(xhat * w * dy) and sum(w * dy) that dx needs.
    Mean, Rstd, InvScale = _stat_rows(Stats, M)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_WEIGHT:
        g = _rounded_product(g, tl.load(W + cols, mask=mask, other=0.0).to(tl.float32), mask)
    inv_scale = 1.0
    if STABLE:
        inv_scale = tl.load(InvScale + row)
    xhat = tl.where(mask, (_rounded_product(x, inv_scale, mask) - tl.load(Mean + row)) * tl.load(Rstd + row), 0.0)
    out = Sums + (row * n_chunks + chunk) * 2
    tl.store(out, tl.sum(xhat * g, axis=0))
    tl.store(out + 1, tl.sum(g, axis=0))


@triton.jit
def _layer_norm_bwd_split_kernel(
    DY, X, W, Stats, Sums, DX, Partials,
    stride_dy_row, stride_x_row, stride_dx_row, M, N, n_chunks, rows_per_group,
    HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS_POW2: tl.constexpr,
):
    # Long rows, step 2: program (chunk, group) owns BLOCK_N columns of a group of rows:
    # dx for them, and the group's weight/bias partials for its columns, kept in registers.
    Mean, Rstd, InvScale = _stat_rows(Stats, M)
    chunk = tl.program_id(0)
    group = tl.program_id(1).to(tl.int64)
    DW_partial, DB_partial = _partial_rows(Partials, group, tl.num_programs(1), N, COMPUTE_DW)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.full([BLOCK_N], 1.0, dtype=tl.float32)
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    chunk_ids = tl.arange(0, CHUNKS_POW2)
    row_begin = group * rows_per_group
    row_stop = tl.minimum(row_begin + rows_per_group, M)
    for first in range(row_begin, row_stop, BLOCK_M):
        rows = first + tl.arange(0, BLOCK_M)
        row_mask = rows < row_stop
        mask = row_mask[:, None] & col_mask[None, :]
        dy, xhat, rstd, inv_scale = _load_bwd_tile(
            X, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_x_row, stride_dy_row, STABLE, BLOCK_M
        )
        if COMPUTE_DX:
            # Every program adds a row's chunk sums in the same order: deterministic.
            sums = Sums + (rows[:, None] * n_chunks + chunk_ids[None, :]) * 2
            sums_mask = row_mask[:, None] & (chunk_ids[None, :] < n_chunks)
            c1 = _div(tl.sum(tl.load(sums, mask=sums_mask, other=0.0), axis=1), N)
            c2 = _div(tl.sum(tl.load(sums + 1, mask=sums_mask, other=0.0), axis=1), N)
            g = _rounded_product(dy, w[None, :], mask)
            dx = (g - (xhat * c1[:, None] + c2[:, None])) * (rstd * inv_scale)[:, None]
            tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db_acc += tl.sum(dy, axis=0)
    if COMPUTE_DW:
        tl.store(DW_partial + cols, dw_acc, mask=col_mask)
    if COMPUTE_DB:
        tl.store(DB_partial + cols, db_acc, mask=col_mask)


def _forward(
    launch, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float, stable: bool,
) -> tuple[Tensor, Tensor]:
    """``(y, stats)``: stats = (mean, rstd[, 1/max|x| if stable]) rows, fp32."""
    cfg = _launch.current().layer_norm
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    stats = torch.empty((3 if stable else 2, n_rows), dtype=torch.float32, device=x.device)
    block_m, block_n, single_pass = _launch.row_tile(
        n_rows, n_cols, cfg.fwd_max_fused_cols, cfg.loop_block, cfg.tile_elements)
    launch(_layer_norm_fwd_kernel)[(_launch.cdiv(n_rows, block_m),)](
        x, y, weight, bias, stats,
        x.stride(0), y.stride(0), n_rows, n_cols, eps,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, STABLE=stable,
        BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single_pass,
        num_warps=_launch.ln_fwd_warps(block_m * block_n, x.element_size()),
    )
    return y, stats


def _backward(launch, grads: tuple, needs: dict, x: Tensor, weight: Optional[Tensor], stats: Tensor,
              stable: bool) -> dict:
    """Gradients of x, weight and bias (those in ``needs``); the parameters' in fp32."""
    cfg = _launch.current().layer_norm
    dy = grads[0] if grads[0].stride(-1) == 1 else grads[0].contiguous()
    compute_dx, compute_dw, compute_db = needs["x"], needs["weight"], needs["bias"]
    n_rows, n_cols = x.shape
    block_m, block_n, single_pass = _launch.row_tile(
        n_rows, n_cols, cfg.bwd_max_fused_cols, cfg.loop_block, cfg.tile_elements)
    flags = dict(HAS_WEIGHT=weight is not None, STABLE=stable,
                 COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db)
    dx = torch.empty((n_rows, n_cols) if compute_dx else (0, n_cols), dtype=x.dtype, device=x.device)
    n_partials = int(compute_dw) + int(compute_db)
    if single_pass:
        n_tiles = _launch.cdiv(n_rows, block_m)
        programs, tiles_per_program = _launch.persistent_grid(n_tiles, x.device, cfg.bwd_programs_per_sm)
        partials = x.new_empty((n_partials, programs, n_cols), dtype=torch.float32)
        launch(_layer_norm_bwd_kernel)[(programs,)](
            dy, x, weight, stats, dx, partials,
            dy.stride(0), x.stride(0), dx.stride(0), n_rows, n_cols, tiles_per_program,
            BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=cfg.bwd_stages,
            num_warps=_launch.num_warps(block_m * block_n), **flags,
        )
    else:
        # Rows longer than a block: two streaming launches, so that every SM has many
        # independent chunks in flight (one program walking long rows stalls on latency).
        n_chunks = _launch.cdiv(n_cols, block_n)
        sums = x.new_empty((n_rows if compute_dx else 0, n_chunks, 2), dtype=torch.float32)
        if compute_dx:
            launch(_layer_norm_bwd_row_sums_kernel)[(n_rows, n_chunks)](
                dy, x, weight, stats, sums, dy.stride(0), x.stride(0), n_rows, n_cols, n_chunks,
                HAS_WEIGHT=weight is not None, STABLE=stable, BLOCK_N=block_n,
                num_warps=_launch.num_warps(block_n),
            )
        split_m = cfg.split_block_m
        groups = _launch.row_groups(n_rows, n_chunks, split_m, cfg.split_programs_per_sm, x.device)
        rows_per_group = _launch.cdiv(n_rows, groups)
        partials = x.new_empty((n_partials, groups, n_cols), dtype=torch.float32)
        launch(_layer_norm_bwd_split_kernel)[(n_chunks, groups)](
            dy, x, weight, stats, sums, dx, partials,
            dy.stride(0), x.stride(0), dx.stride(0), n_rows, n_cols, n_chunks, rows_per_group,
            BLOCK_M=split_m, BLOCK_N=block_n, CHUNKS_POW2=_launch.next_power_of_2(n_chunks),
            num_warps=_launch.num_warps(split_m * block_n), **flags,
        )
    # One reduction for both parameters' partials (none when one program wrote them:
    # small shapes, where the host sets the pace).
    param_grads = (partials[:, 0] if partials.shape[1] == 1 else partials.sum(1)) if n_partials else None
    grads_out = {"x": dx}
    if compute_dw:
        grads_out["weight"] = param_grads[0]
    if compute_db:
        grads_out["bias"] = param_grads[-1]
    return grads_out


layer_norm = _doors.build(_doors.OpDescription(
    name="layer_norm",
    inputs=(("x", Tensor), ("weight", Optional[Tensor]), ("bias", Optional[Tensor]), ("eps", float),
            ("stable", bool)),
    outputs=("y",),
    residuals=("stats",),
    forward=_forward,
    saved=(("x", Tensor), ("weight", Optional[Tensor]), ("stats", Tensor), ("stable", bool)),
    save=lambda inputs, results, needs: (inputs["x"], inputs["weight"], results["stats"], inputs["stable"]),
    backward=_backward,
    differentiable=("x", "weight", "bias"),
))
"""Differentiable LayerNorm of a 2-D ``x`` (last stride 1): ``layer_norm(x, weight, bias, eps, stable)``."""
