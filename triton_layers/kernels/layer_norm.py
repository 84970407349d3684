"""LayerNorm and RMSNorm over the last dim of a 2-D tensor, with an optional fused residual
add: one family of Triton kernels (``IS_RMS`` switches; their @triton.jit helpers, each
formula once, are in _norm_helpers.py), their launchers, the autograd glue.

Input:    z = x; or, with a residual, z = h = x + residual computed in h's dtype (both cast
          to it, added in fp32, rounded once) and written out in the same pass.
Forward:  LayerNorm zhat = (z' - mean) * rstd, rstd = 1 / sqrt(var + eps);
          RMSNorm   zhat = z' * rstd,          rstd = 1 / sqrt(mean(z'^2) + eps);
          z' = z, or z / max|z| per row (detached) in stable mode.
          y = zhat * w + bias with w = weight, or 1 + weight (unit offset, Gemma); with
          cast_before_weight, zhat is rounded to z's dtype before the product (Llama).
          Statistics are fp32 and saved as the rows of one (k, M) ``stats`` tensor:
          (mean, rstd[, 1/max|z|]) for LayerNorm, (rstd[, 1/max|z|]) for RMSNorm.
Backward: with g = w * dy and the row means c1 = mean(g * zhat), c2 = mean(g) (0 for RMSNorm),
          dz = (g - zhat * c1 - c2) * rstd / max|z|, plus the gradient h got from its own
          consumers; dx = dresidual = dz, each in its input's dtype.
          dweight = sum_rows(dy * zhat) (zhat rounded as in the forward), dbias = sum_rows(dy).
The weight/bias gradients are summed per program into fp32 partials (one row of partials
per program, no atomics; weight's and bias's in one tensor) and the partials are reduced
by one more launch, each column's in a fixed order: the result does not depend on timing,
so it is bitwise identical from run to run. (Allocations and launches are few because at
small shapes the host, not the GPU, sets the pace.)
"""
from __future__ import annotations

import functools
import operator
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import reference
from .. import launch_config
from . import _common
from ..calls import doors as _doors
from ..calls.description import OpDescription, recomputed_grads
from . import _layer_norm_rules as _rules
from ..calls.fast_launch import KernelCall, current_device, direct
from ._norm_helpers import (
    STABLE_MIN_SCALE, affine, div, dz_coefficients, head_rows, load_affine, load_bwd_tile, load_chunk, load_input,
    load_weight, partial_rows, param_grads, publish, publish_sums, rounded_product, scale_shift,
    shifted_stats, stat_rows, store_dz, store_partials, wait_arrivals,
)
from ._pdl import pdl_start


@triton.jit
def _norm_fwd_kernel(
    X, R, H, Y, W, B, Stats,
    stride_x_row, stride_r_row, stride_h_row, stride_y_row, M, N, eps, x_heads, stride_x_head,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    STABLE: tl.constexpr, UNIT_OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr, STORE_STATS: tl.constexpr,
    AFFINE_FIRST: tl.constexpr, USE_PDL: tl.constexpr,
):
    # One program normalizes BLOCK_M rows: short rows still give each program enough bytes.
    # x may be heads (x_heads > 1, no residual): a strided q or k of a fused projection, read in
    # place (head_rows).
    pdl_start(USE_PDL)
    Mean, Rstd, InvScale = stat_rows(Stats, M, IS_RMS)
    Z = X  # the normalized input, for its dtype
    if HAS_RESIDUAL:
        Z = H
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_N)
    x_rows = head_rows(rows, stride_x_row, x_heads, stride_x_head)
    y_rows = Y + rows[:, None] * stride_y_row
    inv_scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SINGLE_PASS:
        mask = row_mask[:, None] & (cols[None, :] < N)
        if AFFINE_FIRST:
            # The weight (and bias) loaded before x, not after the reductions: their reads wait on
            # memory while x's do (decode-sized rows gain most). RMSNorm always; LayerNorm where
            # the grid is small (_layer_norm_rules.affine_first): holding its weight and bias
            # through two reductions costs registers, and where many programs share an SM that
            # was slower (docs/TUNING.md, "LayerNormLaunch.fwd_affine_first_programs_per_sm").
            w, b = load_affine(W, B, cols, cols < N, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET)
        z = load_input(X, R, H, rows, x_rows, cols, mask, stride_r_row, stride_h_row, HAS_RESIDUAL, True)
        if STABLE:
            inv_scale = 1.0 / tl.maximum(tl.max(tl.abs(z), axis=1), STABLE_MIN_SCALE)
            z = rounded_product(z, inv_scale[:, None], mask)
        if not IS_RMS:
            mean = div(tl.sum(z, axis=1), N)
            z = tl.where(mask, z - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(div(tl.sum(z * z, axis=1), N) + eps)
        if not AFFINE_FIRST:
            w, b = load_affine(W, B, cols, cols < N, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET)
        y = scale_shift(z * rstd[:, None], Z, w, b, HAS_WEIGHT, HAS_BIAS, CAST_BEFORE_WEIGHT)
        tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Rows longer than a block: statistics over chunks, then a second pass (a third in
        # stable mode, the first finding max|z|). With a residual, the first pass writes h and
        # the later ones read it back (load_chunk).
        if STABLE:
            amax = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                mask = row_mask[:, None] & (start + cols[None, :] < N)
                z = load_chunk(X, R, H, rows, x_rows, start + cols, mask, stride_r_row, stride_h_row,
                               HAS_RESIDUAL, True)
                amax = tl.maximum(amax, tl.abs(z))
            inv_scale = 1.0 / tl.maximum(tl.max(amax, axis=1), STABLE_MIN_SCALE)
            if HAS_RESIDUAL:
                tl.debug_barrier()
        # LayerNorm sums are shifted by (about) each row's first element: as exact as two
        # passes for data whose mean is large against its spread, with one pass over the row.
        shift = tl.zeros([BLOCK_M], dtype=tl.float32)
        if not IS_RMS:
            shift = tl.load(X + x_rows, mask=row_mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                shift += tl.load(R + rows * stride_r_row, mask=row_mask, other=0.0).to(tl.float32)
            shift = shift * inv_scale
        acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            mask = row_mask[:, None] & (start + cols[None, :] < N)
            z = load_chunk(X, R, H, rows, x_rows, start + cols, mask, stride_r_row, stride_h_row,
                           HAS_RESIDUAL, not STABLE)  # the first pass unless stable mode's came before
            d = tl.where(mask, rounded_product(z, inv_scale[:, None], mask) - shift[:, None], 0.0)
            acc1 += d
            acc2 += d * d
        mean, rstd = shifted_stats(tl.sum(acc1, axis=1), tl.sum(acc2, axis=1), shift, N, eps, IS_RMS)
        if HAS_RESIDUAL:
            tl.debug_barrier()
        for start in range(0, N, BLOCK_N):
            col_mask = start + cols < N
            mask = row_mask[:, None] & col_mask[None, :]
            z = load_chunk(X, R, H, rows, x_rows, start + cols, mask, stride_r_row, stride_h_row,
                           HAS_RESIDUAL, False)
            zhat = (rounded_product(z, inv_scale[:, None], mask) - mean[:, None]) * rstd[:, None]
            y = affine(zhat, Z, W, B, start + cols, col_mask, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET,
                        CAST_BEFORE_WEIGHT)
            tl.store(y_rows + start + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if STORE_STATS:  # (False where no backward will read them: Stats is then a placeholder)
        if STABLE:
            tl.store(InvScale + rows, inv_scale, mask=row_mask)
        if not IS_RMS:
            tl.store(Mean + rows, mean, mask=row_mask)
        tl.store(Rstd + rows, rstd, mask=row_mask)


@triton.jit
def _norm_fwd_split_kernel(
    X, R, H, Y, W, B, Stats, Sums, Arrivals,
    stride_x_row, stride_r_row, stride_h_row, stride_y_row, M, N, eps, n_chunks, rows_per_group,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    UNIT_OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr, CHUNKS_POW2: tl.constexpr, MAX_POLLS: tl.constexpr, AHEAD: tl.constexpr,
    STORE_STATS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Rows longer than a block, in one pass: _norm_fwd_kernel's loop reads each row twice
    # (statistics, then y), and with many long rows in flight the second read misses L2
    # (3 M*N element moves for 2). Here program (chunk, group) walks its group's rows holding
    # one chunk of each in registers: it publishes the chunk's shifted sums, waits at the
    # row's counter for the other chunks' and normalizes the chunk it holds. Tickets order
    # the programs' starts, as in _norm_bwd_split_kernel: no deadlock while a group's chunks
    # fit on the GPU at once; with MAX_POLLS > 0 a program that polled that often reads the
    # missing chunks itself (the interpreter, one program at a time, runs this form so).
    # One row at a time, its statistics scalars: with a (1, n) tile's row vectors instead,
    # Triton 3.6 broadcast them to the tile through 2,048 shared-memory stores a thread per
    # row, and the kernel ran many times slower than the loop (BENCHMARKS.md, the H100 notes' norms).
    pdl_start(USE_PDL)
    Mean, Rstd, _ = stat_rows(Stats, M, IS_RMS)
    ticket = tl.atomic_add(Arrivals, 1, sem="relaxed", scope="gpu")
    chunk = ticket % n_chunks
    group = (ticket // n_chunks).to(tl.int64)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    chunk_ids = tl.arange(0, CHUNKS_POW2)
    chunk_mask = chunk_ids < n_chunks
    Z = X  # the normalized input, for its dtype
    if HAS_RESIDUAL:
        Z = H
    row_start = group * rows_per_group
    row_stop = tl.minimum(row_start + rows_per_group, M)
    # Each row's chunk is loaded and its sums published one row ahead: the wait for a row's
    # other chunks overlaps the load of the next (waiting right after publishing, a program
    # spent a load's and a wait's latency on every row, in turn, and ran no faster than the
    # loop that reads x twice, on an H100: docs/TUNING.md, "LayerNormLaunch.fwd_one_pass").
    # With AHEAD 2, two rows ahead (three chunks held: z, z_next, and the newest, z_far).
    z, shift = _fwd_load_publish(X, R, H, Sums, Arrivals, row_start, row_stop, cols, col_mask, chunk, n_chunks,
                                 stride_x_row, stride_r_row, stride_h_row, IS_RMS, HAS_RESIDUAL)
    if AHEAD == 2:
        z_next, shift_next = _fwd_load_publish(X, R, H, Sums, Arrivals, row_start + 1, row_stop, cols, col_mask,
                                               chunk, n_chunks, stride_x_row, stride_r_row, stride_h_row, IS_RMS,
                                               HAS_RESIDUAL)
    for row in range(row_start, row_stop):
        z_far, shift_far = _fwd_load_publish(X, R, H, Sums, Arrivals, row + AHEAD, row_stop, cols, col_mask, chunk,
                                             n_chunks, stride_x_row, stride_r_row, stride_h_row, IS_RMS, HAS_RESIDUAL)
        rows = row + tl.arange(0, 1)
        mask = (rows[:, None] < M) & col_mask[None, :]
        arrived = wait_arrivals(Arrivals + 1 + row, n_chunks, MAX_POLLS)
        # Every program adds a row's chunk sums in the same order: the same statistics in each.
        sums = Sums + (row * n_chunks + chunk_ids) * 2
        sums_dd = tl.load(sums, mask=chunk_mask, other=0.0, cache_modifier=".cg")
        sums_d = tl.load(sums + 1, mask=chunk_mask, other=0.0, cache_modifier=".cg")
        if MAX_POLLS > 0:
            if not arrived:  # every chunk's sums from its elements, as its program computes them
                for other in range(0, n_chunks):
                    other_cols = other * BLOCK_N + tl.arange(0, BLOCK_N)
                    other_mask = (rows[:, None] < M) & (other_cols[None, :] < N)
                    d_o = tl.where(other_mask, load_input(X, R, H, rows, rows * stride_x_row, other_cols, other_mask,
                                                          stride_r_row, stride_h_row, HAS_RESIDUAL, False) - shift, 0.0)
                    sums_dd = tl.where(chunk_ids == other, tl.sum(d_o * d_o), sums_dd)
                    sums_d = tl.where(chunk_ids == other, tl.sum(d_o), sums_d)
        mean, rstd = shifted_stats(tl.sum(sums_d), tl.sum(sums_dd), shift, N, eps, IS_RMS)
        # (the weight and bias loaded for each row, from L1 or L2: held across the rows, they
        # took 30-40 more registers a thread, and an SM fit half the programs. Loaded before the
        # arithmetic: through affine(), which loads them inside it, the fused add bf16
        # 1024x131072 took 400 us in one H100 run against 389-393 in this form's sweeps)
        w, b = load_affine(W, B, cols, col_mask, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET)
        y = scale_shift((z.to(tl.float32) - mean) * rstd, Z, w, b, HAS_WEIGHT, HAS_BIAS, CAST_BEFORE_WEIGHT)
        tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        if STORE_STATS and chunk == 0:
            if not IS_RMS:
                tl.store(Mean + row, mean)
            tl.store(Rstd + row, rstd)
        if AHEAD == 2:
            z, shift, z_next, shift_next = z_next, shift_next, z_far, shift_far
        else:
            z, shift = z_far, shift_far


@triton.jit
def _fwd_load_publish(X, R, H, Sums, Arrivals, row, row_stop, cols, col_mask, chunk, n_chunks,
                      stride_x_row, stride_r_row, stride_h_row, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The one-pass forward's chunk of ``row`` (a (1, BLOCK_N) tile of z in z's own dtype, x's
    or h's; h written with a residual) and its shift (LayerNorm: the row's first element;
    RMSNorm: 0), its shifted sums published at the row's counter; zeros and nothing published
    past ``row_stop``."""
    live = row < row_stop
    rows = row + tl.arange(0, 1)
    mask = (rows[:, None] < row_stop) & col_mask[None, :]
    # LayerNorm's sums are shifted by the row's first element, as in the loop above.
    shift = 0.0
    if not IS_RMS:
        shift = tl.load(X + row * stride_x_row, mask=live, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            shift += tl.load(R + row * stride_r_row, mask=live, other=0.0).to(tl.float32)
    z = load_input(X, R, H, rows, rows * stride_x_row, cols, mask, stride_r_row, stride_h_row, HAS_RESIDUAL, True)
    d = tl.where(mask, z - shift, 0.0)
    if live:
        publish(Sums + (row * n_chunks + chunk) * 2, tl.sum(d * d), tl.sum(d), None, Arrivals + 1 + row)
    # Held until the row's statistics arrive: in z's own dtype (exact, z is a value of it),
    # half the registers of fp32 for 2-byte inputs.
    if HAS_RESIDUAL:
        z = z.to(H.dtype.element_ty)
    else:
        z = z.to(X.dtype.element_ty)
    return z, shift


# --- backward: three kernels, each formula written once in _norm_helpers ------------------


@triton.jit
def _norm_bwd_kernel(
    DY, DH, Z, W, Stats, DX, DR, Partials,
    stride_dy_row, stride_dh_row, stride_z_row, stride_dx_row, stride_dr_row, M, N, tiles_per_program,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    CAST_BEFORE_WEIGHT: tl.constexpr, HAS_DH: tl.constexpr, STORE_DR: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    WEIGHT_PER_TILE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Rows that fit one block (longer rows take the two split kernels below).
    # Each program walks a contiguous range of BLOCK_M-row tiles and owns one row of the
    # weight/bias partials: a fixed reduction order, hence bitwise-reproducible sums.
    # WEIGHT_PER_TILE: each tile loads the weight again (from L1 or L2) instead of the
    # program holding it in registers from start to end: on rows of 16,384 that frees 32
    # registers a thread for the tile's dy, zhat and the accumulators, which spilled
    # (LayerNormLaunch.bwd_long_row_weight_per_tile).
    pdl_start(USE_PDL)
    Mean, Rstd, InvScale = stat_rows(Stats, M, IS_RMS)
    pid = tl.program_id(0).to(tl.int64)
    tile_start = pid * tiles_per_program
    tile_end = tl.minimum(tile_start + tiles_per_program, tl.cdiv(M, BLOCK_M))
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = load_weight(W, cols, col_mask, HAS_WEIGHT, UNIT_OFFSET)  # (per tile: unused, dropped by the compiler)
    DW_partial, DB_partial, dw_acc, db_acc = partial_rows(Partials, pid, tl.num_programs(0), N, COMPUTE_DW, BLOCK_N)
    # NUM_STAGES > 1 prefetches the next tiles' z and dy while this one is reduced.
    for tile in tl.range(tile_start, tile_end, num_stages=NUM_STAGES):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        dy, zhat, scale = load_bwd_tile(
            Z, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_z_row, stride_dy_row, IS_RMS, STABLE,
            BLOCK_M)
        # The parameter gradients first: dy's last use is then g = w * dy, so its registers
        # hold g. In the other order dy, g, zhat, w and the accumulators were all live at
        # once, and ptxas (sm_90) spilled several times more on rows of 8,192 and 16,384
        # (the figures: BENCHMARKS.md, the H100 notes' norms, a15d6d8).
        dw_acc, db_acc = param_grads(dy, zhat, dw_acc, db_acc, Z, COMPUTE_DW, COMPUTE_DB, CAST_BEFORE_WEIGHT)
        if COMPUTE_DX:
            if WEIGHT_PER_TILE:
                w = load_weight(W, cols, col_mask, HAS_WEIGHT, UNIT_OFFSET)
            g = rounded_product(dy, w[None, :], mask)
            c1, c2 = dz_coefficients(tl.sum(zhat * g, axis=1), tl.sum(g, axis=1), N, IS_RMS)
            store_dz(DX, DR, DH, rows, cols, mask, g, zhat, c1, c2, scale, stride_dx_row, stride_dr_row,
                      stride_dh_row, HAS_DH, STORE_DR)
    store_partials(DW_partial, DB_partial, cols, col_mask, dw_acc, db_acc, COMPUTE_DW, COMPUTE_DB)


@triton.jit
def _norm_bwd_row_sums_kernel(
    DY, Z, W, Stats, Sums,
    stride_dy_row, stride_z_row, M, N, n_chunks,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Long rows, step 1: program (row, chunk) writes the chunk's share of the two row sums
    # sum(zhat * g) and sum(g) that dz needs.
    pdl_start(USE_PDL)
    Mean, Rstd, InvScale = stat_rows(Stats, M, IS_RMS)
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    row_mask = rows < M
    mask = row_mask[:, None] & col_mask[None, :]
    dy, zhat, _ = load_bwd_tile(
        Z, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_z_row, stride_dy_row, IS_RMS, STABLE, 1)
    g = rounded_product(dy, load_weight(W, cols, col_mask, HAS_WEIGHT, UNIT_OFFSET)[None, :], mask)
    out = Sums + (rows * n_chunks + chunk) * 2
    tl.store(out, tl.sum(zhat * g, axis=1), mask=row_mask)
    tl.store(out + 1, tl.sum(g, axis=1), mask=row_mask)


@triton.jit
def _norm_bwd_split_kernel(
    DY, DH, Z, W, Stats, Sums, Arrivals, DX, DR, Partials,
    stride_dy_row, stride_dh_row, stride_z_row, stride_dx_row, stride_dr_row, M, N, n_chunks, rows_per_group,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, STABLE: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    CAST_BEFORE_WEIGHT: tl.constexpr, HAS_DH: tl.constexpr, STORE_DR: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS_POW2: tl.constexpr, ONE_PASS: tl.constexpr,
    PUBLISH_AHEAD: tl.constexpr, MAX_POLLS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Long rows, step 2: program (chunk, group) owns BLOCK_N columns of a group of rows:
    # dz for them, and the group's weight/bias partials for its columns, kept in registers.
    # ONE_PASS (instead of step 1, whose z and dy reads this step repeated from DRAM: 5 M*N
    # element moves for 3): the programs of a group publish each tile's chunk sums and
    # wait at the tile's arrival counter for the other chunks'. With PUBLISH_AHEAD = 0 a
    # program waits on each tile it holds; with k > 0 it publishes k tiles, then finishes
    # them, reading them again while they are in L2: one wait per k tiles, not per tile,
    # and by then the other chunks have (mostly) published.
    # A program takes its (chunk, group) from a ticket drawn when it starts, so the
    # programs of a group start in ticket order; one that waits waits only on siblings that
    # started before it or will start once a slot frees, and the groups whose programs all
    # started run to the end and free slots: there is no deadlock while one group's
    # n_chunks programs fit on the GPU at once (the launcher asks n_chunks <= SMs). With
    # MAX_POLLS > 0 a program that has polled that often computes the missing chunk sums
    # itself with the chunks' own code: no wait is unbounded, and the Triton interpreter, which
    # runs programs one after another, can run this form. The same bits in the interpreter; on
    # an H100 one form (fp32 RMSNorm, PUBLISH_AHEAD 0) gave dx one rounding apart from run to
    # run as timing picked fallback or published sums, most likely two compiled copies of the
    # sums rounded differently (the values pass the float64 check). MAX_POLLS = 0 waits until
    # every chunk arrived, bitwise reproducible.
    pdl_start(USE_PDL)
    Mean, Rstd, InvScale = stat_rows(Stats, M, IS_RMS)
    chunk = tl.program_id(0)
    group = tl.program_id(1).to(tl.int64)
    if ONE_PASS:
        ticket = tl.atomic_add(Arrivals, 1, sem="relaxed", scope="gpu")
        chunk = ticket % n_chunks
        group = (ticket // n_chunks).to(tl.int64)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = load_weight(W, cols, col_mask, HAS_WEIGHT, UNIT_OFFSET)
    DW_partial, DB_partial, dw_acc, db_acc = partial_rows(Partials, group, tl.num_programs(1), N, COMPUTE_DW, BLOCK_N)
    row_begin = group * rows_per_group
    row_stop = tl.minimum(row_begin + rows_per_group, M)
    # The group's rows in batches: publishing ahead, batches of PUBLISH_AHEAD tiles, each
    # published first and then finished; else the group's rows as one batch, each tile
    # published (one pass) and finished in turn. (The decisions stay expressions of the
    # constexprs: a name assigned a constexpr holds a runtime value.)
    batch_rows = BLOCK_M * PUBLISH_AHEAD if ONE_PASS and PUBLISH_AHEAD > 0 else rows_per_group
    for batch in range(row_begin, row_stop, batch_rows):
        batch_stop = tl.minimum(batch + batch_rows, row_stop)
        if ONE_PASS and PUBLISH_AHEAD > 0:
            for first in range(batch, batch_stop, BLOCK_M):
                rows = first + tl.arange(0, BLOCK_M)
                row_mask = rows < row_stop
                mask = row_mask[:, None] & col_mask[None, :]
                dy, zhat, _ = load_bwd_tile(Z, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_z_row,
                                            stride_dy_row, IS_RMS, STABLE, BLOCK_M)
                publish_sums(Sums, Arrivals, rows, row_mask, first, chunk, n_chunks, zhat,
                             rounded_product(dy, w[None, :], mask))
        for first in range(batch, batch_stop, BLOCK_M):
            dw_acc, db_acc = _split_tile(
                DY, DH, Z, Stats, Sums, Arrivals, DX, DR, w, dw_acc, db_acc, first, row_stop, cols, col_mask,
                chunk, stride_dy_row, stride_dh_row, stride_z_row, stride_dx_row, stride_dr_row, M, N, n_chunks,
                W=W, PUBLISH=ONE_PASS and PUBLISH_AHEAD == 0, WAIT=ONE_PASS, IS_RMS=IS_RMS, STABLE=STABLE,
                CAST_BEFORE_WEIGHT=CAST_BEFORE_WEIGHT, HAS_DH=HAS_DH, STORE_DR=STORE_DR, COMPUTE_DX=COMPUTE_DX,
                COMPUTE_DW=COMPUTE_DW, COMPUTE_DB=COMPUTE_DB,
                BLOCK_M=BLOCK_M, CHUNKS_POW2=CHUNKS_POW2, HAS_WEIGHT=HAS_WEIGHT, UNIT_OFFSET=UNIT_OFFSET,
                BLOCK_N=BLOCK_N, MAX_POLLS=MAX_POLLS)
    store_partials(DW_partial, DB_partial, cols, col_mask, dw_acc, db_acc, COMPUTE_DW, COMPUTE_DB)


@triton.jit
def _partials_sum_kernel(Partials, Out, n_writers, N, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr,
                         USE_PDL: tl.constexpr):
    # The parameters' gradients: each column of each parameter's (n_writers, N) partials summed
    # over the writers, in the same order on every run. torch's sum over that (strided) dim
    # took a large share of the short-row backward (BENCHMARKS.md, "What the H200 parts are",
    # the parameters' partials); narrow column blocks give many programs, each with many rows
    # in flight.
    pdl_start(USE_PDL)
    param = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    Rows = Partials + param * n_writers * N
    acc = tl.zeros([BLOCK_W, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_writers, BLOCK_W):
        writers = start + tl.arange(0, BLOCK_W).to(tl.int64)  # (writers * N may pass 2**31)
        acc += tl.load(Rows + writers[:, None] * N + cols[None, :],
                       mask=(writers[:, None] < n_writers) & col_mask[None, :], other=0.0)
    tl.store(Out + param * N + cols, tl.sum(acc, axis=0).to(Out.dtype.element_ty), mask=col_mask)


@triton.jit
def _split_tile(
    DY, DH, Z, Stats, Sums, Arrivals, DX, DR, w, dw_acc, db_acc, first, row_stop, cols, col_mask, chunk,
    stride_dy_row, stride_dh_row, stride_z_row, stride_dx_row, stride_dr_row, M, N, n_chunks,
    IS_RMS: tl.constexpr, STABLE: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, HAS_DH: tl.constexpr,
    STORE_DR: tl.constexpr, COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, CHUNKS_POW2: tl.constexpr, PUBLISH: tl.constexpr, WAIT: tl.constexpr,
    W, HAS_WEIGHT: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr, MAX_POLLS: tl.constexpr,
):
    """One BLOCK_M-row tile of the split kernel: dz from the rows' chunk sums (publishing
    this chunk's first, and waiting for the others', as asked), and the parameter sums."""
    Mean, Rstd, InvScale = stat_rows(Stats, M, IS_RMS)
    rows = first + tl.arange(0, BLOCK_M)
    row_mask = rows < row_stop
    mask = row_mask[:, None] & col_mask[None, :]
    dy, zhat, scale = load_bwd_tile(
        Z, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_z_row, stride_dy_row, IS_RMS, STABLE, BLOCK_M)
    if COMPUTE_DX:
        g = rounded_product(dy, w[None, :], mask)
        if PUBLISH:
            publish_sums(Sums, Arrivals, rows, row_mask, first, chunk, n_chunks, zhat, g)
        arrived = True
        if WAIT:
            arrived = wait_arrivals(Arrivals + 1 + first, n_chunks, MAX_POLLS)
        # Every program adds a row's chunk sums in the same order: deterministic. (.cg:
        # from L2, where the other programs' sums are, not from this SM's L1.)
        chunk_ids = tl.arange(0, CHUNKS_POW2)
        sums = Sums + (rows[:, None] * n_chunks + chunk_ids[None, :]) * 2
        sums_mask = row_mask[:, None] & (chunk_ids[None, :] < n_chunks)
        if MAX_POLLS == 0:  # (each sum right after its load: the order the GPU tables measured)
            c1, c2 = dz_coefficients(
                tl.sum(tl.load(sums, mask=sums_mask, other=0.0, cache_modifier=".cg"), axis=1),
                tl.sum(tl.load(sums + 1, mask=sums_mask, other=0.0, cache_modifier=".cg"), axis=1), N, IS_RMS)
        else:
            sums_zg = tl.load(sums, mask=sums_mask, other=0.0, cache_modifier=".cg")
            sums_g = tl.load(sums + 1, mask=sums_mask, other=0.0, cache_modifier=".cg")
            if not arrived:  # compute every chunk's sums here, as their programs do
                for other in range(0, n_chunks):
                    other_cols = other * BLOCK_N + tl.arange(0, BLOCK_N)
                    other_mask = row_mask[:, None] & (other_cols[None, :] < N)
                    dy_o, zhat_o, _ = load_bwd_tile(Z, DY, Mean, Rstd, InvScale, rows, row_mask, other_cols,
                                                    other_mask, stride_z_row, stride_dy_row, IS_RMS, STABLE, BLOCK_M)
                    w_o = load_weight(W, other_cols, other_cols < N, HAS_WEIGHT, UNIT_OFFSET)
                    g_o = rounded_product(dy_o, w_o[None, :], other_mask)
                    here = chunk_ids[None, :] == other
                    sums_zg = tl.where(here, tl.sum(zhat_o * g_o, axis=1)[:, None], sums_zg)
                    sums_g = tl.where(here, tl.sum(g_o, axis=1)[:, None], sums_g)
            c1, c2 = dz_coefficients(tl.sum(sums_zg, axis=1), tl.sum(sums_g, axis=1), N, IS_RMS)
        store_dz(DX, DR, DH, rows, cols, mask, g, zhat, c1, c2, scale, stride_dx_row, stride_dr_row,
                  stride_dh_row, HAS_DH, STORE_DR)
    return param_grads(dy, zhat, dw_acc, db_acc, Z, COMPUTE_DW, COMPUTE_DB, CAST_BEFORE_WEIGHT)


# --- launchers ------------------------------------------------------------------------------


class _ForwardPlan(NamedTuple):
    kernel: KernelCall
    out_dtype: torch.dtype
    residual_dtype: Optional[torch.dtype]
    stats_shape: Optional[tuple[int, ...]]  # None: no statistics (no backward will read them)
    sums_shape: Optional[tuple[int, int, int]]  # the one-pass split's per-chunk row sums (else None)


def _plan_forward(
    x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
    rms: bool, stable: bool, unit_offset: bool, cast_before_weight: bool, out_dtype: torch.dtype,
    residual_dtype: Optional[torch.dtype], store_stats: bool = True, one_pass_allowed: bool = True,
) -> _ForwardPlan:
    """The forward's launch for inputs of these shapes, strides and dtypes. ``x`` and
    ``residual`` are rows as they are (:func:`_common.rows_as_is`), or x heads without a
    residual (:func:`_common.head_layout`); y and h are new, contiguous.
    ``store_stats=False`` (a call no gradient will flow from): no statistics are written or
    allocated. ``one_pass_allowed=False``: never the one-pass split kernel, whose programs read
    each other's chunks of x and the residual (h written over the residual must not be)."""
    cfg = launch_config.current().layer_norm
    gpu = launch_config.GPU.of(x.device)
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    max_fused = cfg.fwd_max_fused_cols if residual is None else cfg.fwd_residual_max_fused_cols
    block_m, block_n, single_pass = _rules.row_tile(n_rows, n_cols, max_fused, cfg.loop_block, cfg.tile_elements,
                                                    cfg.max_tile_rows)
    heads = _common.head_layout(x) if residual is None else None
    strides = (_common.row_stride(x) if heads is None else heads[0],
               0 if residual is None else _common.row_stride(residual), 0 if residual is None else n_cols, n_cols)
    switches = dict(IS_RMS=rms, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
                    HAS_BIAS=bias is not None, UNIT_OFFSET=unit_offset, CAST_BEFORE_WEIGHT=cast_before_weight,
                    STORE_STATS=store_stats, **_common.pdl(gpu))
    # (k, *x.shape[:-1]): the rows as x has them, so that a shard of x along a row dim is the
    # same shard of stats one dim on (the sharding rules, calls/sharding.py)
    stats_shape = ((1 if rms else 2) + int(stable), *x.shape[:-1]) if store_stats else None
    n_chunks = _common.cdiv(n_cols, cfg.fwd_one_pass_block)
    if (not single_pass and not stable and one_pass_allowed and heads is None
            and _rules.one_pass_forward(n_chunks, residual is not None, cfg, gpu)):
        # (one row at a time: no BLOCK_M)
        block = cfg.fwd_one_pass_block
        groups = _rules.row_groups(n_rows, n_chunks, 1, _rules.one_pass_forward_programs_per_sm(x.element_size(), cfg),
                                  gpu)
        kernel = KernelCall(
            _norm_fwd_split_kernel, (groups * n_chunks,),
            (*strides, n_rows, n_cols, eps, n_chunks, _common.cdiv(n_rows, groups)),
            dict(switches, BLOCK_N=block, CHUNKS_POW2=_common.next_power_of_2(n_chunks), MAX_POLLS=cfg.split_wait_polls,
                 AHEAD=cfg.fwd_one_pass_rms_fp32_ahead if rms and x.element_size() == 4 else cfg.fwd_one_pass_ahead,
                 num_warps=_rules.fwd_warps(block, x.element_size(), cfg)),
            _common.device_index(x))
        return _ForwardPlan(kernel, out_dtype, residual_dtype, stats_shape, (n_rows, n_chunks, 2))
    programs = _common.cdiv(n_rows, block_m)
    kernel = KernelCall(
        _norm_fwd_kernel, (programs,), (*strides, n_rows, n_cols, eps, *((1, 0) if heads is None else heads[1:])),
        dict(switches, STABLE=stable, BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single_pass,
             AFFINE_FIRST=single_pass and _rules.affine_first(rms, programs, cfg, gpu),
             num_warps=_rules.fwd_warps(block_m * block_n, x.element_size(), cfg, single_pass, gpu,
                                       _residual_elem_size(residual, residual_dtype), rms)),
        _common.device_index(x))
    return _ForwardPlan(kernel, out_dtype, residual_dtype, stats_shape, None)


def _residual_elem_size(residual: Optional[Tensor], residual_dtype: Optional[torch.dtype]) -> int:
    """The wider element of the residual and of h (written in ``residual_dtype``); 0 without a
    residual."""
    if residual is None:
        return 0
    return max(residual.element_size(), (residual_dtype or residual.dtype).itemsize)


def _run_forward(launcher, plan: _ForwardPlan, x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
                 bias: Optional[Tensor], *_, h_out: Optional[Tensor] = None) -> tuple[Tensor, ...]:
    """``(y, stats)``, or ``(y, h, stats)`` with a residual; stats = fp32 rows (see the top).
    y and h have x's shape; the kernel sees them as matrices (it reads pointers and row strides).
    ``h_out``: the contiguous tensor h is written into (the residual itself, in place)."""
    y = _common.new_output(x, plan.out_dtype)
    stats = None if plan.stats_shape is None else x.new_empty(plan.stats_shape, dtype=torch.float32)
    h = h_out if h_out is not None or residual is None else _common.new_output(x, plan.residual_dtype)
    stats_arg = y if stats is None else stats  # (a placeholder pointer where none are written)
    if plan.sums_shape is None:
        plan.kernel(launcher, x, residual, h, y, weight, bias, stats_arg)
    else:  # one pass: the chunks' row sums, a ticket counter and one arrival counter per row
        sums = x.new_empty(plan.sums_shape, dtype=torch.float32)
        arrivals = x.new_zeros(1 + plan.sums_shape[0], dtype=torch.int32)
        plan.kernel(launcher, x, residual, h, y, weight, bias, stats_arg, sums, arrivals)
    return (y, stats) if h is None else (y, h, stats)


class _BackwardPlan(NamedTuple):
    kernels: tuple  # (the one-pass kernel,) or (the row sums kernel or None, the split kernel)
    copy_dy: bool  # a gradient that is not rows as they are: copied first
    copy_dh: bool
    dx_dtype: Optional[torch.dtype]  # None: no dx computed
    dr_dtype: Optional[torch.dtype]  # None: dresidual is dx itself (or not asked)
    partials_shape: tuple[int, int]
    reduce: Optional[KernelCall]  # the partials' sum (None: one writer, the partials are the sums)
    sums_shape: Optional[tuple[int, int, int]]  # the split path's per-chunk row sums
    one_pass: bool
    # The dtype ``reduce`` writes the parameters' gradients in: the weight's where it is the
    # only one, so that no cast follows (a launch and an allocation fewer: the host sets the
    # pace of a tensor-parallel step's norm calls); else fp32 (the bias's dtype is not saved).
    param_grads_dtype: torch.dtype


def _plan_backward(grads: tuple, needs: dict, z: Tensor, weight: Optional[Tensor], stats: Tensor, rms: bool,
                   stable: bool, unit_offset: bool, cast_before_weight: bool, eps: float, x_dtype: torch.dtype,
                   r_dtype: Optional[torch.dtype]) -> _BackwardPlan:
    """The backward's launches for these gradients (their strides) and saved tensors."""
    cfg = launch_config.current().layer_norm
    gpu = launch_config.GPU.of(z.device)
    dy, dh = grads[0], grads[1] if len(grads) > 1 else None
    copy_dy = dy is not None and not _common.rows_as_is(dy)
    copy_dh = dh is not None and not _common.rows_as_is(dh)
    n_cols = z.shape[-1]
    n_rows = z.numel() // n_cols if n_cols else 0
    # (a missing dy is zeros, and a copied gradient, contiguous: row stride n_cols)
    dy_stride = n_cols if dy is None or copy_dy else _common.row_stride(dy)
    dh_stride = 0 if dh is None else n_cols if copy_dh else _common.row_stride(dh)
    need_x, need_r = needs["x"], needs.get("residual", False)
    compute_dx, compute_dw, compute_db = need_x or need_r, needs["weight"], needs["bias"]
    store_dr = need_x and need_r and r_dtype != x_dtype
    if rms:
        max_fused = cfg.bwd_rms_max_fused_cols
    else:
        max_fused = cfg.bwd_max_fused_cols if dh is None and not store_dr else cfg.bwd_residual_max_fused_cols
    block_m, block_n, single_pass = _rules.row_tile(n_rows, n_cols, max_fused, cfg.loop_block, cfg.tile_elements,
                                                    cfg.max_tile_rows)
    pdl = _common.pdl(gpu)
    switches = dict(IS_RMS=rms, HAS_WEIGHT=weight is not None, STABLE=stable, UNIT_OFFSET=unit_offset,
                    CAST_BEFORE_WEIGHT=cast_before_weight, HAS_DH=dh is not None, STORE_DR=store_dr,
                    COMPUTE_DX=compute_dx, COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, **pdl)
    # dx, dr: new and contiguous (row stride n_cols), in the inputs' shape.
    strides = (dy_stride, dh_stride, _common.row_stride(z), n_cols, n_cols if store_dr else 0)
    n_partials = int(compute_dw) + int(compute_db)
    device = _common.device_index(z)
    sums_shape, one_pass = None, False
    if single_pass:
        n_tiles = _common.cdiv(n_rows, block_m)
        # bytes the prefetched loads bring per element: z, dy and (with a residual) dh
        loaded = z.element_size() + (z if dy is None else dy).element_size() + (0 if dh is None else dh.element_size())
        programs, tiles_per_program = _rules.persistent_grid(
            n_tiles, gpu, _rules.bwd_programs_per_sm_for(block_m * block_n, loaded, cfg))
        long_row = block_n > cfg.bwd_long_row
        stages = cfg.bwd_long_row_stages if long_row else cfg.bwd_stages
        weight_per_tile = long_row and cfg.bwd_long_row_weight_per_tile
        # a weight loaded per tile is prefetched with the tile (a buffer per stage, as z's)
        stage_bytes = block_m * block_n * loaded + (block_n * weight.element_size()
                                                    if weight_per_tile and weight is not None else 0)
        writers = programs
        kernels = (KernelCall(
            _norm_bwd_kernel, (programs,), (*strides, n_rows, n_cols, tiles_per_program),
            dict(BLOCK_M=block_m, BLOCK_N=block_n,
                 NUM_STAGES=_rules.prefetch_stages(stages, stage_bytes, gpu, cfg.bwd_reduction_scratch_bytes),
                 WEIGHT_PER_TILE=weight_per_tile,
                 num_warps=_rules.num_warps(block_m * block_n, cfg, cfg.bwd_max_warps), **switches),
            device),)
    else:
        # Rows longer than a block: two streaming launches, so that every SM has many
        # independent chunks in flight (one program walking long rows stalls on latency).
        n_chunks = _common.cdiv(n_cols, block_n)
        sums_shape = (n_rows if compute_dx else 0, n_chunks, 2)
        one_pass = compute_dx and _rules.one_pass_split(n_chunks, rms, z.element_size(), cfg, gpu)
        row_sums = None
        if compute_dx and not one_pass:
            row_sums = KernelCall(
                _norm_bwd_row_sums_kernel, (n_rows, n_chunks), (dy_stride, _common.row_stride(z), n_rows, n_cols, n_chunks),
                dict(IS_RMS=rms, HAS_WEIGHT=weight is not None, STABLE=stable, UNIT_OFFSET=unit_offset,
                     BLOCK_N=block_n, num_warps=_rules.num_warps(block_n, cfg), **pdl),
                device)
        split_m = _rules.split_rows(block_n, z.element_size(), one_pass, cfg)
        groups = _rules.row_groups(n_rows, n_chunks, split_m, cfg.split_programs_per_sm, gpu)
        writers = groups
        kernels = (row_sums, KernelCall(
            _norm_bwd_split_kernel, (n_chunks, groups), (*strides, n_rows, n_cols, n_chunks, _common.cdiv(n_rows, groups)),
            dict(BLOCK_M=split_m, BLOCK_N=block_n, CHUNKS_POW2=_common.next_power_of_2(n_chunks),
                 ONE_PASS=one_pass, PUBLISH_AHEAD=cfg.split_publish_ahead, MAX_POLLS=cfg.split_wait_polls,
                 num_warps=_rules.num_warps(split_m * block_n, cfg), **switches),
            device))
    reduce = _partials_sum(n_partials, writers, z, pdl)
    weight_only = reduce is not None and compute_dw and not compute_db
    return _BackwardPlan(kernels, copy_dy, copy_dh, (x_dtype if need_x else r_dtype) if compute_dx else None,
                         r_dtype if store_dr else None, (n_partials, writers * n_cols), reduce, sums_shape, one_pass,
                         weight.dtype if weight_only else torch.float32)


def _partials_sum(n_partials: int, writers: int, z: Tensor, pdl: dict) -> Optional[KernelCall]:
    """The launch summing ``writers`` rows of partials for each of ``n_partials`` parameters
    (z's columns each); ``pdl``: the backward's launch options (``_common.pdl``)."""
    if not n_partials or writers == 1:
        return None
    n_cols = z.shape[-1]
    cfg = launch_config.current().layer_norm
    block_w, block_n = _rules.partials_tile(n_partials, writers, n_cols, cfg, launch_config.GPU.of(z.device))
    return KernelCall(_partials_sum_kernel, (_common.cdiv(n_cols, block_n), n_partials), (writers, n_cols),
                      dict(BLOCK_W=block_w, BLOCK_N=block_n, num_warps=cfg.partials_warps, **pdl),
                      _common.device_index(z))


def _run_backward(launcher, plan: _BackwardPlan, grads: tuple, needs: dict, z: Tensor, weight: Optional[Tensor],
                  stats: Tensor, *_) -> dict:
    """Gradients of x (and residual), weight and bias, those in ``needs``; the parameters'
    in fp32, or the weight's alone in its dtype (``plan.param_grads_dtype``). ``z`` is the
    normalized input: x, or h with a residual. One kernel pass writes dz once, as dx (and as
    dresidual when that has another dtype; else dresidual is the same tensor)."""
    dy, dh = grads[0], grads[1] if len(grads) > 1 else None
    if dy is None:  # only h has consumers
        dy = torch.zeros_like(z, memory_format=torch.contiguous_format)
    elif plan.copy_dy:
        dy = dy.contiguous()
    if plan.copy_dh:
        dh = dh.contiguous()
    compute_dx = plan.dx_dtype is not None
    dx = _common.new_output(z, plan.dx_dtype) if compute_dx else z.new_empty((0, z.shape[-1]), dtype=z.dtype)
    dr = None if plan.dr_dtype is None else _common.new_output(z, plan.dr_dtype)
    n_partials = plan.partials_shape[0]
    partials = z.new_empty(plan.partials_shape, dtype=torch.float32)
    if plan.sums_shape is None:
        plan.kernels[0](launcher, dy, dh, z, weight, stats, dx, dr, partials)
    else:
        row_sums, split = plan.kernels
        sums = z.new_empty(plan.sums_shape, dtype=torch.float32)
        # one pass: a ticket counter, then one arrival counter per row (the kernel's top)
        arrivals = z.new_zeros(1 + plan.sums_shape[0], dtype=torch.int32) if plan.one_pass else sums
        if row_sums is not None:
            row_sums(launcher, dy, z, weight, stats, sums)
        split(launcher, dy, dh, z, weight, stats, sums, arrivals, dx, dr, partials)
    # One reduction for both parameters' partials (none when one program wrote them:
    # small shapes, where the host sets the pace), each gradient a row of it taken by
    # select (H100 host, torch.profiler: unbind 8.7 us a call, select 2.3 us a row).
    if n_partials:
        param_grads = partials
        if plan.reduce is not None:
            param_grads = z.new_empty((n_partials, z.shape[-1]), dtype=plan.param_grads_dtype)
            plan.reduce(launcher, partials, param_grads)
    grads_out = {}
    need_x, need_r = needs["x"], needs.get("residual", False)
    if need_x:
        grads_out["x"] = dx
    if need_r:
        grads_out["residual"] = dx if dr is None else dr
    if needs["weight"]:
        grads_out["weight"] = param_grads.select(0, 0)
    if needs["bias"]:
        grads_out["bias"] = param_grads.select(0, n_partials - 1)
    return grads_out


def _backward_graph(grads: tuple, needs: dict, z: Tensor, weight: Optional[Tensor], stats: Tensor, rms: bool,
                    stable: bool, unit_offset: bool, cast_before_weight: bool, eps: float, *_) -> dict:
    """The backward in differentiable torch ops (``create_graph=True``): the reference's own
    gradients of y with respect to z (x, or h) and the weight, recomputed from the saved z, which
    carries its autograd history; the bias's is the sum of dy. ``stats`` is not used: the
    recomputed statistics are differentiable in z."""
    dy, dh = grads[0], grads[1] if len(grads) > 1 else None
    need_z = needs["x"] or needs.get("residual", False)
    wanted = {n: t for n, t, need in (("z", z, need_z), ("weight", weight, needs["weight"])) if need}
    found = {n: torch.zeros_like(t) for n, t in wanted.items()} if dy is None else recomputed_grads(
        lambda: reference.norm(z, weight, None, eps, rms=rms, stable=stable, unit_offset=unit_offset,
                               cast_before_weight=cast_before_weight, out_dtype=dy.dtype), wanted, dy)
    out = {}
    if need_z:
        out["x"] = out["residual"] = found["z"] if dh is None else found["z"] + dh
    if needs["weight"]:
        out["weight"] = found["weight"]
    if needs["bias"]:
        n_cols = z.shape[-1]
        out["bias"] = (z.new_zeros(n_cols, dtype=torch.float32) if dy is None
                       else dy.float().reshape(-1, n_cols).sum(0))
    return out


# --- the two ops: without and with the residual, from one description ----------------------

_FLAGS = (("eps", float), ("rms", bool), ("stable", bool), ("unit_offset", bool), ("cast_before_weight", bool))
# (eps: for the differentiable backward, which recomputes the statistics)
_SAVED_FLAGS = (("rms", bool), ("stable", bool), ("unit_offset", bool), ("cast_before_weight", bool),
                ("eps", float))
# Those flags' values from the inputs (a named tuple), in that order: one C call per save.
_saved_flags = operator.attrgetter(*(name for name, _ in _SAVED_FLAGS))


# The tensors holding rows (x and its like: every dim but the last; the statistics (k, *rows)).
_ROWS = {"x": (0, 1), "residual": (0, 1), "y": (0, 1), "h": (0, 1), "z": (0, 1), "stats": (1, 0)}


def _describe(with_residual: bool) -> OpDescription:
    """The norm op, taking (and returning) the residual stream when ``with_residual``."""
    params = (("weight", Optional[Tensor]), ("bias", Optional[Tensor]))
    if with_residual:
        return OpDescription(
            name="residual_norm",
            inputs=(("x", Tensor), ("residual", Tensor), *params, *_FLAGS, ("out_dtype", torch.dtype),
                    ("residual_dtype", torch.dtype)),
            outputs=("y", "h"),
            residuals=("stats",),
            plan_forward=_plan_forward,
            plan_forward_no_grad=functools.partial(_plan_forward, store_stats=False),
            run_forward=_run_forward,
            # The backward reads h (the normalized input) instead of x and the residual.
            saved=(("z", Tensor), ("weight", Optional[Tensor]), ("stats", Tensor), *_SAVED_FLAGS,
                   ("x_dtype", torch.dtype), ("r_dtype", torch.dtype)),
            save=lambda inputs, results, needs: (
                results.h, inputs.weight, results.stats, *_saved_flags(inputs), inputs.x.dtype,
                inputs.residual.dtype),
            plan_backward=_plan_backward,
            run_backward=_run_backward,
            differentiable=("x", "residual", "weight", "bias"),
            shared_grads=(("residual", "x"),),
            # (the backward returns one dz for both where their dtypes agree: _run_backward)
            shared_when=lambda args: args["x_dtype"] == args["r_dtype"],
            row_sharded=_ROWS,
            row_strided=("z", "x", "residual"),
            backward_graph=_backward_graph,
        )
    return OpDescription(
        name="norm",
        inputs=(("x", Tensor), *params, *_FLAGS, ("out_dtype", torch.dtype)),
        outputs=("y",),
        residuals=("stats",),
        plan_forward=lambda x, *args: _plan_forward(x, None, *args, None),
        plan_forward_no_grad=lambda x, *args: _plan_forward(x, None, *args, None, store_stats=False),
        run_forward=lambda launcher, plan, x, weight, bias, *_: _run_forward(launcher, plan, x, None, weight, bias),
        saved=(("z", Tensor), ("weight", Optional[Tensor]), ("stats", Tensor), *_SAVED_FLAGS),
        save=lambda inputs, results, needs: (
            inputs.x, inputs.weight, results.stats, *_saved_flags(inputs)),
        plan_backward=lambda grads, needs, z, *saved: _plan_backward(grads, needs, z, *saved, z.dtype, None),
        run_backward=_run_backward,
        differentiable=("x", "weight", "bias"),
        row_sharded=_ROWS,
        row_strided=("z", "x", "residual"),
        backward_graph=_backward_graph,
    )


norm = _doors.Op(_describe(with_residual=False))
"""``norm(x, weight, bias, eps, rms, stable, unit_offset, cast_before_weight, out_dtype) -> y``:
differentiable LayerNorm (``rms=False``) or RMSNorm of a 2-D ``x`` (last stride 1)."""
residual_norm = _doors.Op(_describe(with_residual=True))
"""``residual_norm(x, residual, weight, bias, eps, rms, stable, unit_offset, cast_before_weight,
out_dtype, residual_dtype) -> (y, h)``: ``h = x + residual`` in ``residual_dtype`` and ``y = norm(h)``."""


class _InPlacePlan(NamedTuple):
    forward: _ForwardPlan
    device: Optional[int]

    def same_decisions(self, other: "_InPlacePlan") -> bool:
        return self == other


class ResidualNormInPlace:
    """``residual_norm`` for serving, eager and without autograd: ``h = x + residual`` written
    into ``residual`` itself and ``y = norm(h)``, returning ``(y, residual)`` (a serving engine's
    residual buffer, as vLLM's ``fused_add_rms_norm``). The same arguments and kernels as
    ``residual_norm``, with no statistics and never the one-pass split kernel (whose programs
    read each other's chunks of the residual); ``residual`` contiguous, of ``residual_dtype``.
    Planned by ``_eager.OpRouter`` as the ops of both doors are (:meth:`plan`,
    :meth:`call_planned`); the functional route sends it only plain tensors, outside tracing,
    where no gradient flows."""

    name = "residual_norm_in_place"  # (what OpRouter's messages call it)

    def plan(self, x, residual, weight, bias, eps, rms, stable, unit_offset, cast_before_weight, out_dtype,
             residual_dtype) -> _InPlacePlan:
        forward = _plan_forward(x, residual, weight, bias, eps, rms, stable, unit_offset, cast_before_weight,
                                out_dtype, residual_dtype, store_stats=False, one_pass_allowed=False)
        return _InPlacePlan(forward, x.get_device() if x.is_cuda else None)

    def call_planned(self, plan: _InPlacePlan, x, residual, weight, bias, *_) -> tuple[Tensor, Tensor]:
        if plan.device is not None and plan.device != current_device():
            with torch.cuda.device(plan.device):  # (Triton launches on the current device)
                return self.call_planned(plan, x, residual, weight, bias)
        y, _, _ = _run_forward(direct, plan.forward, x, residual, weight, bias, h_out=residual)
        return y, residual

    def __call__(self, *args) -> tuple[Tensor, Tensor]:
        return self.call_planned(self.plan(*args), *args)


residual_norm_in_place = ResidualNormInPlace()
