"""Weighted sum over the last dim of a 2-D tensor: Triton kernels, launchers, autograd.

Forward:  y[m] = sum_d x[m, d] * w[d] (+ b), accumulated in fp32, written in x's dtype.
Backward: dx[m, d] = dy[m] * w[d],  dw[d] = sum_m dy[m] * x[m, d],  db = sum_m dy[m].

Both kernels stream x in 2-D tiles of BLOCK_M rows x BLOCK_D columns (``_weighted_sum_rules.tile_2d``)
and read (or write) every element of x exactly once:
- forward: a grid of (row blocks, column ranges). With enough rows each program owns
  whole rows and writes y directly; with few long rows the columns are split into ranges
  too, each program writes fp32 partial sums, and a second small kernel adds the ranges
  in a fixed order (plus the bias).
- backward: one pass over x for dx and dw together, or, on large inputs, two launches of
  the same kernel, one writing dx and one reading x for dw (see ``bwd_two_pass_min_bytes``).
  A grid of (column blocks, row ranges); each program walks its row range, writes dx and/or
  keeps an fp32 accumulator of dy * x, stored as one row of partials. The partials are
  reduced with torch: no atomics, the reduction order is fixed by the launch, so dw is
  bitwise identical from run to run (and the same in one launch or two).
  dx is skipped when x needs no gradient, and x is not read when the weight needs none.
  db = sum(dy) in fp32 comes from the same pass: one partial per row range, written by the
  programs of the first column block (torch sums them when there are several).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from .. import launch_config
from . import _common
from ..calls import doors as _doors
from ..calls.description import OpDescription
from ..calls.fast_launch import KernelCall
from . import _weighted_sum_rules as _rules
from ._pdl import pdl_start

@triton.jit
def _store_rows(Y, B, rows, mask, y, HAS_BIAS: tl.constexpr):
    """y (fp32 row sums) + bias, written in Y's dtype."""
    if HAS_BIAS:
        y += tl.load(B).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _weighted_sum_fwd_kernel(
    X, W, B, Y, Partial,
    stride_x_row, M, D, cols_per_program,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_start(USE_PDL)
    pid_m = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    x_rows = X + rows[:, None] * stride_x_row
    cols = tl.arange(0, BLOCK_D)
    col_start = pid_d * cols_per_program
    col_end = tl.minimum(col_start + cols_per_program, D)
    # A 2-D accumulator: the cross-lane reduction happens once, after the loop.
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # NUM_STAGES (None: Triton's default) > 1 prefetches the next column blocks of long rows.
    for start in tl.range(col_start, col_end, BLOCK_D, num_stages=NUM_STAGES):
        col_mask = start + cols < col_end
        w = tl.load(W + start + cols, mask=col_mask, other=0.0).to(tl.float32)
        x = tl.load(x_rows + start + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += x.to(tl.float32) * w[None, :]
    y = tl.sum(acc, axis=1)
    if SPLIT:
        tl.store(Partial + pid_d * M + rows, y, mask=row_mask)
    else:
        _store_rows(Y, B, rows, row_mask, y, HAS_BIAS)


@triton.jit
def _weighted_sum_fwd_reduce_kernel(
    Partial, B, Y, M, n_splits,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Adds the column ranges' partial sums of each row in a fixed order.
    pdl_start(USE_PDL)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = rows < M
    y = tl.zeros([BLOCK_M], dtype=tl.float32)
    # s * M stays far below 2**31: a split happens only when rows are few (< 8 tiles per SM).
    for s in range(0, n_splits):
        y += tl.load(Partial + s * M + rows, mask=mask, other=0.0)
    _store_rows(Y, B, rows, mask, y, HAS_BIAS)


@triton.jit
def _weighted_sum_bwd_kernel(
    DY, X, W, DX, DW_partial, DB_partial,
    stride_dy, stride_x_row, stride_dx_row, M, D, rows_per_program,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Program (pid_d, pid_m) owns columns [pid_d * BLOCK_D, +BLOCK_D) of the rows
    # [pid_m * rows_per_program, +rows_per_program) and row pid_m of the partials.
    pdl_start(USE_PDL)
    pid_d = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1).to(tl.int64)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < D
    row_start = pid_m * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    offs_m = tl.arange(0, BLOCK_M)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    # NUM_STAGES (None: Triton's default) > 1 prefetches the next row tiles' dy and x.
    for start in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):
        rows = start + offs_m
        # Rows past row_end belong to the next program: they must not enter its partials.
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        dy = tl.load(DY + rows * stride_dy, mask=row_mask, other=0.0).to(tl.float32)
        db_acc += dy
        if COMPUTE_DX:
            dx = dy[:, None] * w[None, :]
            tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
            acc += x.to(tl.float32) * dy[:, None]
    if COMPUTE_DW:
        tl.store(DW_partial + pid_m * D + cols, tl.sum(acc, axis=0), mask=col_mask)
    # The bias's partial, from the programs of the first column block: at small shapes the
    # whole db, without the separate reduction kernel (a launch's host time) it once took.
    if COMPUTE_DB:
        if pid_d == 0:
            tl.store(DB_partial + pid_m, tl.sum(db_acc, axis=0))


class _ForwardPlan(NamedTuple):
    y_shape: tuple
    partial_shape: Optional[tuple[int, int]]  # split columns: per-split row sums (else None)
    kernel: KernelCall
    reduce: Optional[KernelCall]  # the split sums' reduction


def _plan_forward(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> _ForwardPlan:
    """The forward's launches: ``x`` (..., D) whose rows are a matrix as it is
    (:func:`_common.rows_as_is`), ``weight`` (D,) contiguous, ``bias`` 0-dim or None."""
    cfg = launch_config.current().weighted_sum
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    aligned = _rules.rows_aligned(_common.matrix(x), n_cols)
    wide = x.element_size() >= 4  # fp32 keeps its own forward tile and loop (see the knobs)
    block_m, block_d, warps = _rules.tile_2d(n_rows, n_cols, x.element_size(), cfg, aligned,
                                              cfg.fwd_tile_bytes_4byte if wide else None)
    row_blocks = _common.cdiv(n_rows, block_m)
    wanted = _common.cdiv(launch_config.GPU.of(x.device).sm_count * cfg.fwd_programs_per_sm, row_blocks)
    cols_per_program, splits = _rules.split_range(n_cols, block_d, wanted)
    device = _common.device_index(x)
    pdl = _common.pdl(launch_config.GPU.of(x.device))
    kernel = KernelCall(
        _weighted_sum_fwd_kernel, (row_blocks, splits), (_common.row_stride(x), n_rows, n_cols, cols_per_program),
        dict(HAS_BIAS=bias is not None, SPLIT=splits > 1, BLOCK_M=block_m, BLOCK_D=block_d,
             NUM_STAGES=cfg.fwd_stages_4byte if wide else cfg.fwd_stages, num_warps=warps, **pdl),
        device)
    reduce = None
    if splits > 1:
        block = min(cfg.reduce_block, _common.next_power_of_2(n_rows))
        reduce = KernelCall(_weighted_sum_fwd_reduce_kernel, (_common.cdiv(n_rows, block),), (n_rows, splits),
                            dict(HAS_BIAS=bias is not None, BLOCK_M=block, num_warps=cfg.reduce_warps, **pdl),
                            device)
    # (no buffer, not even an empty one, where it is not written: each allocation costs host time)
    return _ForwardPlan(tuple(x.shape[:-1]), (splits, n_rows) if splits > 1 else None, kernel, reduce)


def _run_forward(launcher, plan: _ForwardPlan, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple[Tensor]:
    """``(y,)``, y of shape x.shape[:-1] (contiguous) in x's dtype."""
    y = x.new_empty(plan.y_shape)
    partial = None if plan.partial_shape is None else x.new_empty(plan.partial_shape, dtype=torch.float32)
    plan.kernel(launcher, x, weight, bias, y, partial)
    if plan.reduce is not None:
        plan.reduce(launcher, partial, bias, y)
    return (y,)


class _BackwardPlan(NamedTuple):
    kernel: Optional[KernelCall]  # None: only the bias needs a gradient (a sum of dy)
    dw_kernel: Optional[KernelCall]  # two passes: the one reading x for dw (else None)
    copy_dy: bool
    dx_shape: tuple
    programs: int  # rows of the parameter gradients' partial sums


def _plan_backward(grads: tuple, needs: dict, x: Optional[Tensor], weight: Tensor,
                   x_dtype: torch.dtype) -> _BackwardPlan:
    """The backward's launch for this gradient's layout. ``x`` as the forward took it, or
    None when the weight needs no gradient."""
    cfg = launch_config.current().weighted_sum
    dy = grads[0]
    compute_dx, compute_dw, compute_db = needs["x"], needs["weight"], needs["bias"]
    dx_shape = (*dy.shape, weight.shape[0])
    if not (compute_dx or compute_dw):
        return _BackwardPlan(None, None, False, dx_shape, 0)
    # dy read as one column of rows: by its stride when 1-D, else contiguous (a copy if need be)
    copy_dy = dy.dim() > 1 and not dy.is_contiguous()
    dy_stride = dy.stride(0) if dy.dim() == 1 else 1
    n_rows, n_cols = dy.numel(), weight.shape[0]
    elem_size = torch.finfo(x_dtype).bits // 8
    aligned = _rules.rows_aligned(_common.matrix(x) if compute_dw else None, n_cols)
    block_m, block_d, warps = _rules.tile_2d(n_rows, n_cols, elem_size, cfg, aligned)
    col_blocks = _common.cdiv(n_cols, block_d)
    wanted = _common.cdiv(launch_config.GPU.of(dy.device).sm_count * cfg.bwd_programs_per_sm, col_blocks)
    rows_per_program, programs = _rules.split_range(n_rows, block_m, wanted)
    two_pass = compute_dx and compute_dw and n_rows * n_cols * elem_size >= cfg.bwd_two_pass_min_bytes

    def launch(dx: bool, dw: bool, db: bool, stages: Optional[int]) -> KernelCall:
        return KernelCall(
            _weighted_sum_bwd_kernel, (col_blocks, programs),
            (dy_stride, _common.row_stride(x) if dw else 0, n_cols, n_rows, n_cols, rows_per_program),
            dict(COMPUTE_DX=dx, COMPUTE_DW=dw, COMPUTE_DB=db, BLOCK_M=block_m, BLOCK_D=block_d, NUM_STAGES=stages,
                 num_warps=warps, **_common.pdl(launch_config.GPU.of(dy.device))),
            _common.device_index(dy))

    if two_pass:  # dx (and db, from the dy it reads anyway), then dw
        return _BackwardPlan(launch(True, False, compute_db, cfg.bwd_stages),
                             launch(False, True, False, cfg.bwd_dw_stages), copy_dy, dx_shape, programs)
    return _BackwardPlan(launch(compute_dx, compute_dw, compute_db, cfg.bwd_stages), None, copy_dy, dx_shape,
                         programs)


def _run_backward(launcher, plan: _BackwardPlan, grads: tuple, needs: dict, x: Optional[Tensor], weight: Tensor,
                  x_dtype: torch.dtype) -> dict:
    """Gradients of x, weight (fp32) and bias (fp32), those in ``needs``; dx comes out contiguous."""
    dy = grads[0]
    compute_dx, compute_dw, compute_db = needs["x"], needs["weight"], needs["bias"]
    if plan.kernel is None:
        return {"bias": dy.sum(dtype=torch.float32)} if compute_db else {}
    if plan.copy_dy:
        dy = dy.contiguous()
    programs, n_cols = plan.programs, weight.shape[0]
    dx = dy.new_empty(plan.dx_shape, dtype=x_dtype) if compute_dx else None
    dw_partial = dy.new_empty((programs, n_cols), dtype=torch.float32) if compute_dw else None
    db_partial = dy.new_empty(programs, dtype=torch.float32) if compute_db else None
    plan.kernel(launcher, dy, x, weight, dx, dw_partial, db_partial)
    if plan.dw_kernel is not None:
        plan.dw_kernel(launcher, dy, x, weight, dx, dw_partial, db_partial)
    out = {"x": dx} if compute_dx else {}
    if compute_dw:
        out["weight"] = dw_partial[0] if programs == 1 else dw_partial.sum(0)
    if compute_db:
        out["bias"] = db_partial[0] if programs == 1 else db_partial.sum()
    return out


def _backward_graph(grads: tuple, needs: dict, x: Optional[Tensor], weight: Tensor, x_dtype: torch.dtype) -> dict:
    """The backward in differentiable torch ops (``create_graph=True``), in fp32: dx = dy w,
    dweight = the rows' sum of dy x, dbias = the sum of dy."""
    dy = grads[0].float().unsqueeze(-1)
    out = {}
    if needs["x"]:
        out["x"] = dy * weight.float()
    if needs["weight"]:
        out["weight"] = (dy * x.float()).reshape(-1, weight.shape[0]).sum(0)
    if needs["bias"]:
        out["bias"] = dy.sum()
    return out


weighted_sum = _doors.Op(OpDescription(
    name="weighted_sum",
    inputs=(("x", Tensor), ("weight", Tensor), ("bias", Optional[Tensor])),
    outputs=("y",),
    residuals=(),
    plan_forward=_plan_forward,
    run_forward=_run_forward,
    # x is needed only for the weight's gradient: not kept alive otherwise.
    saved=(("x", Optional[Tensor]), ("weight", Tensor), ("x_dtype", torch.dtype)),
    save=lambda inputs, results, needs: (inputs.x if needs["weight"] else None, inputs.weight,
                                         inputs.x.dtype),
    plan_backward=_plan_backward,
    run_backward=_run_backward,
    differentiable=("x", "weight", "bias"),
    row_strided=("x",),
    backward_graph=_backward_graph,
    # Rows shard along every dim of x but the last (the summed one), y along the same dims.
    row_sharded={"x": (0, 1), "y": (0, 0)},
))
"""Differentiable weighted sum of a 2-D ``x`` (last stride 1): ``weighted_sum(x, weight, bias)``."""
