"""LayerNorm and RMSNorm (with the optional fused residual add) writing FP8: the norm and
its quantization in one pass over the rows, scales per tensor, per token or per 1x128
group (``triton_layers/fp8.py`` has the recipes and conventions; ``reference.norm_fp8``
the definition). The backward is the norms' own (kernels/layer_norm.py), on the gradient
of the dequantized output: straight through the quantization.

One program normalizes BLOCK_M whole rows held in registers (rows up to the forward's
``fwd_max_fused_cols``; longer ones: the chunked kernel, below). What each recipe adds to the norm:

- per token: the row's amax, its scale, the row's data (the row is in registers: no extra
  pass over memory);
- per group: the same per 128-column block of the row (the tile seen as
  ``(BLOCK_M, BLOCK_N / 128, 128)``);
- per tensor, static: the given scale, loaded once per program;
- per tensor, dynamic: one launch where one program holds every row (decode: the tile's
  amax is the tensor's); else two. The first computes every row's output and its amax,
  writing h and the statistics; the second computes the rows again from x (and the
  residual) and writes the data with the scale taken from the amaxes. The input is read
  twice: a per-tensor scale depends on every row. The first launch's programs write one
  amax each, and every program of the second (the same grid) reads them all (``AMAX_BLOCK``
  at a time): no zeroed cell, so no memset launch, which at decode sizes costs as much as a
  kernel. Past ``fp8_amax_parts_max`` programs they fold their amax into one zeroed fp32
  cell instead (``atomic_max``; ``AMAX_BLOCK`` 0). Both are order-free and exact.

The 1x128 recipe with its transposed copy (``FP8Recipe(transposed=True)``: data_t ``(N, M)``,
a scale per column and 128-row block) is two launches in the same call. A column's scale needs
the amax of 128 rows, more than a row program holds whole (128 rows of 4096 are 2 MB of fp32),
so the copy is not written in the rows' pass: the first launch is the 1x128 recipe's own, as
without the copy (data, 1x128 scales, h with a residual), storing the rows' statistics (rstd,
and the mean for LayerNorm) whether or not a backward asked for them; the second,
``_norm_fp8_t_tile_kernel``, re-reads the normalized input (x, or the h just written) in tiles
of 128 rows x ``fp8_transposed_block_n`` columns (grid ``(ceil(M / 128), ceil(N / BLOCK_N))``),
with those statistics computes y again with the first launch's operations in its order (the
same helpers: the same bits), and writes each column's 128x1 block transposed (stores along
the rows, data_t's contiguous dim) with its scale. The normalized input is read twice (2 M N
elements, against M N for the recipe without the copy), and the copy's launch adds M N bytes of
data_t and 4 N ceil(M / 128) of scale_t. The other recipes' launches are as they were.

Rows longer than ``fwd_max_fused_cols``: the same kernel with CHUNKED, the same arguments,
modes, grid (a program per BLOCK_M rows) and launches (the dynamic per-tensor scale's two, the
transposed copy's second), the rows walked in ``loop_block``-column chunks (at least 128: whole
1x128 groups), warps by ``elems_per_thread``: BLOCK_M = ``fp8_tile_elements`` / the chunk, one
row of 8,192-column chunks at 16 warps by default. Pass 1 finds the statistics (RMSNorm: the sum
of squares; LayerNorm: each chunk's mean and squared deviations, folded by Chan's pairwise update,
as exact as the whole-row kernel), writing h with a residual and the statistics where asked (the
transposed copy's launch reads them). Every later pass reads the rows again (x, or h: one tensor
where x and the residual are two) and computes y with the whole-row kernel's operations in its
order. Static per tensor, the second launch of the dynamic one, 1x128 groups (each group whole in
a chunk): pass 2 quantizes and writes. Per token, the one-program per-tensor tile, the first
launch of the dynamic one: pass 2 finds the amax, pass 3 (not the first launch's) quantizes.
Input bytes read, with E bytes an element (E_x + E_r + E_h for the first pass with a residual,
E_h after): 2 passes (static, 1x128), 3 (per token), 4 (dynamic per tensor over several
programs: two in each launch); written: M N of data and h once, as the whole-row kernel.

The FP8 cast: on a GPU Triton's conversion (``cvt.rn.satfinite``: round to nearest even,
subnormals kept), after the explicit clamp to the format's range. Triton's interpreter
converts values that are not on the FP8 grid wrongly (it flushed e4m3 subnormals and rounded
values near 2**-5 down a binade; a NaN became 384) but converts every exact FP8 value right,
so on the CPU (``EXACT_CAST``) the kernel first rounds each value to the FP8 grid itself, in
fp32 arithmetic, and writes NaN's bits directly. ``tests/test_fp8_norms.py`` checks both
against torch's own cast.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import launch_config
from ..fp8 import AMAX_FLOOR, GROUP_SIZE, FP8Activation, FP8Recipe, FP8Rows, new_scales, tma_aligned_rows
from . import _common
from ..calls import doors as _doors, eager as _eager
from ..calls.description import OpDescription
from ..calls.fast_launch import KernelCall
from . import _layer_norm_rules as _rules
from . import layer_norm as _norms
from ._norm_helpers import affine, div, load_chunk, load_input
from ._pdl import pdl_start

# (a tl.constexpr: compiled Triton reads constexpr globals only)
AMAX_FLOOR_C = tl.constexpr(AMAX_FLOOR)

# The recipes' kernel modes.
_STATIC, _AMAX, _FROM_AMAX, _PER_TOKEN, _PER_GROUP, _WHOLE = 0, 1, 2, 3, 4, 5


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _amax(y, axis: tl.constexpr, INTERPRETED: tl.constexpr):
    """max |y| along ``axis``, NaN where the values hold one (as torch's amax; tl.max drops it).
    INTERPRETED (the kernels' EXACT_CAST: Triton's interpreter): the same value from two builtin
    reductions, the max and whether any value is NaN. The interpreter runs ``tl.reduce`` with a
    combine function of ours one pair of values at a time in Python: ninety-odd percent of an
    FP8 test's time went there."""
    if INTERPRETED:  # (NaN left out of the max: the interpreter's max warns on a slice of NaN alone)
        nan = y != y
        a = tl.max(tl.where(nan, 0.0, tl.abs(y)), axis)
        return tl.where(tl.max(nan.to(tl.int32), axis) > 0, float("nan"), a)
    return tl.reduce(tl.abs(y), axis, _max_keeping_nan)


@triton.jit
def _scale_of(amax, scale_ub, FP8_MAX: tl.constexpr, HAS_UB: tl.constexpr, POW2: tl.constexpr):
    """A dynamic dequantization scale from amax (fp32, any shape): max(min(amax, ub), floor)
    / fp8_max, correctly rounded, and rounded up to a power of two with POW2 (a NaN amax, from
    a row holding NaN or inf, gives a NaN scale: its data is NaN, as the reference's)."""
    if HAS_UB:
        amax = tl.minimum(amax, scale_ub, propagate_nan=tl.PropagateNan.ALL)
    s = tl.div_rn(tl.maximum(amax, AMAX_FLOOR_C, propagate_nan=tl.PropagateNan.ALL), tl.zeros_like(amax) + FP8_MAX)
    if POW2:
        bits = s.to(tl.int32, bitcast=True)
        bits = (bits & 0x7F800000) + tl.where((bits & 0x7FFFFF) != 0, 0x800000, 0)
        s = tl.where(s != s, s, bits.to(tl.float32, bitcast=True))
    return s


@triton.jit
def _quantize(y, inv, FP8_MAX: tl.constexpr, IS_E5M2: tl.constexpr, EXACT_CAST: tl.constexpr):
    """y * inv saturated to the format's range and cast to FP8; with EXACT_CAST the FP8 bits
    as uint8, the value first clamped to the range and rounded to the FP8 grid in fp32 (see the
    top). On a GPU the conversion saturates by itself (``cvt.rn.satfinite``: beyond the range,
    infinities included, the largest finite value of the sign; NaN stays NaN), so no clamp is
    computed there: two instructions an element fewer (``test_the_fp8_cast_is_torchs`` checks
    the edge, overflow, infinities and NaN on the GPU too)."""
    v = y * inv
    if IS_E5M2:
        fp8 = tl.float8e5
        mant_bits, min_exp = 2, -14
    else:
        fp8 = tl.float8e4nv
        mant_bits, min_exp = 3, -6
    if EXACT_CAST:
        v = tl.minimum(tl.maximum(v, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_MAX,
                       propagate_nan=tl.PropagateNan.ALL)
        bits = v.to(tl.int32, bitcast=True)
        exp = tl.maximum(((bits >> 23) & 0xFF) - 127, min_exp)
        # (a + c) - c rounds a to a multiple of 2**(exp - mant_bits), to nearest even: c, 1.5
        # times 2**23 of those steps, has that step as its ulp, and a + c stays in c's binade.
        c = (((exp - mant_bits + 23 + 127) << 23) | 0x400000).to(tl.float32, bitcast=True)
        a = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
        r = ((a + c) - c).to(tl.int32, bitcast=True) | (bits & -2147483648)  # (the sign bit back)
        q = r.to(tl.float32, bitcast=True).to(fp8).to(tl.uint8, bitcast=True)
        return tl.where(v != v, 0x7F, q).to(tl.uint8)
    return v.to(fp8)


@triton.jit
def _quantize_groups(y, scale_ub, FP8_MAX: tl.constexpr, IS_E5M2: tl.constexpr, HAS_UB: tl.constexpr,
                     POW2: tl.constexpr, EXACT_CAST: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """A (BLOCK_M, BLOCK_N) tile of rows (fp32, BLOCK_N a multiple of GROUP) quantized in 1xGROUP
    groups: ``(data, scales)``, a scale per row and group (the tile seen as ``(BLOCK_M, BLOCK_N /
    GROUP, GROUP)``)."""
    y3 = tl.reshape(y, (BLOCK_M, BLOCK_N // GROUP, GROUP))
    s = _scale_of(_amax(y3, 2, EXACT_CAST), scale_ub, FP8_MAX, HAS_UB, POW2)
    inv = tl.div_rn(tl.full([BLOCK_M, BLOCK_N // GROUP], 1.0, tl.float32), s)
    return tl.reshape(_quantize(y3, inv[:, :, None], FP8_MAX, IS_E5M2, EXACT_CAST), (BLOCK_M, BLOCK_N)), s


@triton.jit
def _store_stats(Stats, M, rows, row_mask, mean, rstd, IS_RMS: tl.constexpr):
    """The rows' statistics in the norms' layout (their backward reads them): LayerNorm (mean,
    rstd) rows, RMSNorm (rstd)."""
    if IS_RMS:
        tl.store(Stats + rows, rstd, mask=row_mask)
    else:
        tl.store(Stats + rows, mean, mask=row_mask)
        tl.store(Stats + M + rows, rstd, mask=row_mask)


@triton.jit
def _fp32_scalars(eps, scale_ub, EXACT_CAST: tl.constexpr):
    """eps and scale_ub in fp32: torch.compile's launcher passes Python floats as fp64, computed
    in fp32 as eager calls are (compiled, not the interpreter, whose floats stay Python's)."""
    if not EXACT_CAST:
        eps = eps.to(tl.float32)
        scale_ub = scale_ub.to(tl.float32)
    return eps, scale_ub


@triton.jit
def _store_amax(Amax, pid, amax, AMAX_BLOCK: tl.constexpr):
    """The dynamic per-tensor scale's first launch: this program's amax, in its own cell, or
    folded into the one zeroed cell (AMAX_BLOCK 0)."""
    if AMAX_BLOCK > 0:
        tl.store(Amax + pid, amax)
    else:
        tl.atomic_max(Amax, amax, sem="relaxed")


@triton.jit
def _token_scales(Scales, rows, row_mask, stride_s_row, row_amax, scale_ub, FP8_MAX: tl.constexpr,
                  HAS_UB: tl.constexpr, POW2: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per token: the rows' scales from their amaxes, stored; their inverses, ``(BLOCK_M, 1)``."""
    s = _scale_of(row_amax, scale_ub, FP8_MAX, HAS_UB, POW2)
    tl.store(Scales + rows * stride_s_row, s, mask=row_mask)
    return tl.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), s)[:, None]


@triton.jit
def _one_scale(Scales, Amax, GivenScale, pid, tile_amax, scale_ub, MODE: tl.constexpr, FP8_MAX: tl.constexpr,
               HAS_UB: tl.constexpr, POW2: tl.constexpr, AMAX_BLOCK: tl.constexpr, EXACT_CAST: tl.constexpr):
    """One scale for every row: given (MODE 0), from the first launch's amaxes (2), from this
    program's ``tile_amax`` (5); stored by program 0. Its inverse."""
    if MODE == 2:
        if AMAX_BLOCK > 0:  # (one amax per program of the first launch: its grid is this one)
            parts = tl.arange(0, AMAX_BLOCK)
            amax = _amax(tl.load(Amax + parts, mask=parts < tl.num_programs(0), other=0.0), 0, EXACT_CAST)
        else:
            amax = tl.load(Amax)
        s = _scale_of(amax, scale_ub, FP8_MAX, HAS_UB, POW2)
    elif MODE == 5:
        s = _scale_of(tile_amax, scale_ub, FP8_MAX, HAS_UB, POW2)
    else:
        s = tl.load(GivenScale).to(tl.float32)
    if pid == 0:
        tl.store(Scales, s)
    return tl.div_rn(tl.zeros_like(s) + 1.0, s)


@triton.jit
def _store_groups(Q, Scales, y, rows, row_mask, start, cols, mask, N, stride_s_row, stride_s_group, scale_ub,
                  FP8_MAX: tl.constexpr, IS_E5M2: tl.constexpr, HAS_UB: tl.constexpr, POW2: tl.constexpr,
                  EXACT_CAST: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per group: y's tile (columns ``start + cols``, ``start`` a multiple of GROUP) quantized in
    1xGROUP groups, its data and scales stored."""
    q, s = _quantize_groups(y, scale_ub, FP8_MAX, IS_E5M2, HAS_UB, POW2, EXACT_CAST, GROUP, BLOCK_M, BLOCK_N)
    groups = start // GROUP + tl.arange(0, BLOCK_N // GROUP)
    tl.store(Scales + rows[:, None] * stride_s_row + groups[None, :] * stride_s_group, s,
             mask=row_mask[:, None] & (groups[None, :] < N // GROUP))
    tl.store(Q + rows[:, None] * N + (start + cols)[None, :], q, mask=mask)


@triton.jit
def _chunk_y(X, H, W, B, rows, x_rows, cols, col_mask, mask, stride_h_row, mean, rstd, IS_RMS: tl.constexpr,
             HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, UNIT_OFFSET: tl.constexpr,
             CAST_BEFORE_WEIGHT: tl.constexpr):
    """y (fp32, 0 outside ``mask``) of a chunk of columns on the long-row path's later passes: z
    read again (x, or the h the first pass wrote), then the whole-row kernel's operations in its
    order (the same bits for the same statistics)."""
    Z = X
    if HAS_RESIDUAL:
        Z = H
        z = tl.load(H + rows[:, None] * stride_h_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        z = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if not IS_RMS:
        z = tl.where(mask, z - mean[:, None], 0.0)
    y = affine(z * rstd[:, None], Z, W, B, cols, col_mask, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET, CAST_BEFORE_WEIGHT)
    return tl.where(mask, y, 0.0)


@triton.jit
def _norm_fp8_kernel(
    X, R, H, Q, W, B, Stats, Scales, Amax, GivenScale,
    stride_x_row, stride_r_row, stride_h_row, stride_s_row, stride_s_group, M, N, eps, scale_ub,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    UNIT_OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, STORE_H: tl.constexpr, STORE_STATS: tl.constexpr,
    MODE: tl.constexpr, FP8_MAX: tl.constexpr, IS_E5M2: tl.constexpr, HAS_UB: tl.constexpr, POW2: tl.constexpr,
    EXACT_CAST: tl.constexpr, GROUP: tl.constexpr, AMAX_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CHUNKED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """BLOCK_M rows a program: whole, in registers (the top), or with CHUNKED in BLOCK_N-column
    chunks, re-read on each pass (rows longer than a program holds). Chunked: pass 1 finds the
    statistics chunk by chunk (below), writing h with STORE_H (without it, a second launch's, it
    reads the h the first wrote); each later pass reads the rows again (x, or h) and computes y by
    :func:`_chunk_y`. Pass 2 quantizes (static scale, the first launch's amaxes, 1x128 groups:
    BLOCK_N a multiple of GROUP), or finds the rows' amax (per token, one program's tile, the
    first launch of the dynamic per-tensor scale), which pass 3 then quantizes by."""
    pdl_start(USE_PDL)
    eps, scale_ub = _fp32_scalars(eps, scale_ub, EXACT_CAST)
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_N)
    if CHUNKED:
        x_rows = rows * stride_x_row
        # pass 1: the statistics. RMSNorm: the sum of squares. LayerNorm: each chunk's mean and
        # sum of squared deviations from it, folded into the rows' (Chan et al.'s pairwise update):
        # as exact as the whole-row kernel's two passes over registers (the plain norm's shifted
        # sums were not, by up to 5 fp32 roundings in a scale where a row's first element sat far
        # from its mean).
        total = tl.zeros([BLOCK_M], dtype=tl.float32)
        run_mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            mask = row_mask[:, None] & (start + cols[None, :] < N)
            z = load_chunk(X, R, H, rows, x_rows, start + cols, mask, stride_r_row, stride_h_row, HAS_RESIDUAL,
                           STORE_H)
            if IS_RMS:
                acc2 += z * z
            else:
                n_c = tl.minimum(N - start, BLOCK_N).to(tl.float32)
                seen = start + n_c  # (columns so far, this chunk's included)
                c_sum = tl.sum(z, axis=1)
                c_mean = tl.div_rn(c_sum, tl.zeros_like(c_sum) + n_c)
                dc = tl.where(mask, z - c_mean[:, None], 0.0)
                delta = c_mean - run_mean
                run_mean += delta * (n_c / seen)
                m2 += tl.sum(dc * dc, axis=1) + delta * delta * (start * (n_c / seen))
                total += c_sum
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            rstd = 1.0 / tl.sqrt(div(tl.sum(acc2, axis=1), N) + eps)
        else:
            mean = div(total, N)
            rstd = 1.0 / tl.sqrt(div(m2, N) + eps)
        if STORE_STATS:
            _store_stats(Stats, M, rows, row_mask, mean, rstd, IS_RMS)
        if HAS_RESIDUAL:
            tl.debug_barrier()  # (the later passes read the h other threads of the program wrote)
        row_amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        if MODE == 1 or MODE == 3 or MODE == 5:  # pass 2: the amax (per row: NaN kept)
            amax_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                col_mask = start + cols < N
                y = _chunk_y(X, H, W, B, rows, x_rows, start + cols, col_mask, row_mask[:, None] & col_mask[None, :],
                             stride_h_row, mean, rstd, IS_RMS, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET,
                             CAST_BEFORE_WEIGHT)
                amax_acc = _max_keeping_nan(amax_acc, tl.abs(y))
            row_amax = _amax(amax_acc, 1, EXACT_CAST)  # (|y| already)
        if MODE == 1:
            _store_amax(Amax, pid, _amax(row_amax, 0, EXACT_CAST), AMAX_BLOCK)
        else:  # the last pass: 1x128 groups (4, a chunk's groups whole), or by the scales of the row (3) or tensor
            if MODE == 3:
                inv = _token_scales(Scales, rows, row_mask, stride_s_row, row_amax, scale_ub, FP8_MAX, HAS_UB, POW2,
                                    BLOCK_M)
            elif MODE != 4:
                inv = _one_scale(Scales, Amax, GivenScale, pid, _amax(row_amax, 0, EXACT_CAST), scale_ub,
                                 MODE, FP8_MAX, HAS_UB, POW2, AMAX_BLOCK, EXACT_CAST)
            for start in range(0, N, BLOCK_N):
                col_mask = start + cols < N
                mask = row_mask[:, None] & col_mask[None, :]
                y = _chunk_y(X, H, W, B, rows, x_rows, start + cols, col_mask, mask, stride_h_row, mean, rstd, IS_RMS,
                             HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET, CAST_BEFORE_WEIGHT)
                if MODE == 4:
                    _store_groups(Q, Scales, y, rows, row_mask, start, cols, mask, N, stride_s_row, stride_s_group,
                                  scale_ub, FP8_MAX, IS_E5M2, HAS_UB, POW2, EXACT_CAST, GROUP, BLOCK_M, BLOCK_N)
                else:
                    tl.store(Q + rows[:, None] * N + (start + cols)[None, :],
                             _quantize(y, inv, FP8_MAX, IS_E5M2, EXACT_CAST), mask=mask)
    else:
        col_mask = cols < N
        mask = row_mask[:, None] & col_mask[None, :]
        Z = X  # the normalized input, for its dtype
        if HAS_RESIDUAL:
            Z = H
        z = load_input(X, R, H, rows, rows * stride_x_row, cols, mask, stride_r_row, stride_h_row, HAS_RESIDUAL,
                       STORE_H)
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        if not IS_RMS:
            mean = div(tl.sum(z, axis=1), N)
            z = tl.where(mask, z - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(div(tl.sum(z * z, axis=1), N) + eps)
        y = affine(z * rstd[:, None], Z, W, B, cols, col_mask, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET, CAST_BEFORE_WEIGHT)
        if MODE == 1 or MODE == 5:
            # (an amax over rows: a bias leaves values in the padding rows. The other modes' amaxes
            # are a row's or a group's, whose masked columns hold zeros, and their stores are masked)
            y = tl.where(mask, y, 0.0)
        if STORE_STATS:
            _store_stats(Stats, M, rows, row_mask, mean, rstd, IS_RMS)
        if MODE == 1:  # the dynamic per-tensor scale's first launch: the amax only
            _store_amax(Amax, pid, _amax(_amax(y, 1, EXACT_CAST), 0, EXACT_CAST), AMAX_BLOCK)
        elif MODE == 4:  # per group of GROUP columns
            _store_groups(Q, Scales, y, rows, row_mask, 0, cols, mask, N, stride_s_row, stride_s_group, scale_ub,
                          FP8_MAX, IS_E5M2, HAS_UB, POW2, EXACT_CAST, GROUP, BLOCK_M, BLOCK_N)
        else:  # a scale per token (3), or one: given (0), from the first launch's amaxes (2), from this tile's (5)
            if MODE == 3:
                inv = _token_scales(Scales, rows, row_mask, stride_s_row, _amax(y, 1, EXACT_CAST), scale_ub, FP8_MAX,
                                    HAS_UB, POW2, BLOCK_M)
            else:
                tile_amax = _amax(_amax(y, 1, EXACT_CAST), 0, EXACT_CAST)
                inv = _one_scale(Scales, Amax, GivenScale, pid, tile_amax, scale_ub, MODE, FP8_MAX, HAS_UB, POW2,
                                 AMAX_BLOCK, EXACT_CAST)
            tl.store(Q + rows[:, None] * N + cols[None, :], _quantize(y, inv, FP8_MAX, IS_E5M2, EXACT_CAST), mask=mask)


@triton.jit
def _norm_fp8_t_tile_kernel(
    Z, W, B, Stats, QT, ScalesT,
    stride_z_row, M, N,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    CAST_BEFORE_WEIGHT: tl.constexpr, FP8_MAX: tl.constexpr, IS_E5M2: tl.constexpr, POW2: tl.constexpr,
    EXACT_CAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The transposed copy's launch (the top), after ``_norm_fp8_kernel``'s of the 1x128
    recipe: a program per BLOCK_M (128, or all of fewer) rows and BLOCK_N columns. It reads
    the tile of z (x, or the h the first launch wrote) and the rows' statistics that launch
    stored, computes y as that launch did (the same operations in the same order, so the
    same bits), and writes the columns' 128x1 blocks transposed: data_t at (column, row),
    scale_t at (column, block), from each column's amax over the tile's rows."""
    pdl_start(USE_PDL)
    block = tl.program_id(0)
    rows = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    z = tl.load(Z + rows[:, None] * stride_z_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if IS_RMS:
        rstd = tl.load(Stats + rows, mask=row_mask, other=0.0)
    else:
        mean = tl.load(Stats + rows, mask=row_mask, other=0.0)
        rstd = tl.load(Stats + M + rows, mask=row_mask, other=0.0)
        z = tl.where(mask, z - mean[:, None], 0.0)
    y = affine(z * rstd[:, None], Z, W, B, cols, col_mask, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET, CAST_BEFORE_WEIGHT)
    y = tl.where(mask, y, 0.0)  # (rows past M: zeros, which leave the columns' amaxes as they are)
    s = _scale_of(_amax(y, 0, EXACT_CAST), 0.0, FP8_MAX, False, POW2)
    q = _quantize(y, tl.div_rn(tl.full([BLOCK_N], 1.0, tl.float32), s)[None, :], FP8_MAX, IS_E5M2, EXACT_CAST)
    # (transposed in registers: the store's fast dim is the row, contiguous in data_t)
    tl.store(QT + cols[:, None].to(tl.int64) * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))
    tl.store(ScalesT + cols.to(tl.int64) * tl.num_programs(0) + block, s, mask=col_mask)


_MODES = {"per_token": _PER_TOKEN, "per_group": _PER_GROUP}


class _Plan(NamedTuple):
    launches: tuple  # one KernelCall, or two: the dynamic per-tensor scale (amax, then data), the transposed copy
    amax_cells: int  # the first launch's amax cells: 0 (one launch), 1 (zeroed: atomic_max), or one a program
    recipe: FP8Recipe  # (made once per signature: the run allocates the scales by it)
    stats_shape: Optional[tuple]  # None: no statistics (no backward will read them)
    residual_dtype: Optional[torch.dtype]


def _plan_forward(x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
                  residual_dtype, fp8_dtype, granularity, pow2_scales, scale_ub, column_major, with_stats,
                  transposed) -> _Plan:
    """The launches for inputs of these shapes, strides and dtypes (x and residual: rows as
    they are, ``_common.rows_as_is``); the outputs are new and contiguous."""
    cfg = launch_config.current().layer_norm
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    gpu = launch_config.GPU.of(x.device)
    block_m, block_n, whole_rows, elems_per_thread = _rules.fp8_tile(n_rows, n_cols, cfg, gpu,
                                                                     layer_norm=not rms and residual is None)
    # (whole 128-column groups: rows, or chunks (a power of 2) of at least one group)
    block_n = max(block_n, GROUP_SIZE if granularity == "per_group" else 1)
    recipe = FP8Recipe(granularity, fp8_dtype, pow2_scales, scale_ub if scale_ub > 0 else None, column_major,
                       transposed)
    strides = (_common.row_stride(x), 0 if residual is None else _common.row_stride(residual),
               0 if residual is None else n_cols)
    if granularity == "per_group" and column_major:
        scale_strides = (1, tma_aligned_rows(n_rows))
    else:
        scale_strides = (n_cols // GROUP_SIZE if granularity == "per_group" else 1, 1)
    switches = dict(IS_RMS=rms, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
                    HAS_BIAS=bias is not None, UNIT_OFFSET=unit_offset, CAST_BEFORE_WEIGHT=cast_before_weight,
                    FP8_MAX=recipe.fp8_max, IS_E5M2=fp8_dtype == torch.float8_e5m2, HAS_UB=scale_ub > 0,
                    POW2=pow2_scales, EXACT_CAST=x.device.type == "cpu", GROUP=GROUP_SIZE, BLOCK_M=block_m,
                    BLOCK_N=block_n, AMAX_BLOCK=0, CHUNKED=not whole_rows, **_common.pdl(gpu),
                    num_warps=_common.warps_for(block_m * block_n, elems_per_thread, 16))
    args = (*strides, *scale_strides, n_rows, n_cols, eps, max(scale_ub, 0.0))
    programs = _common.cdiv(n_rows, block_m)
    device = _common.device_index(x)
    amax_cells = 0
    if granularity == "per_tensor" and static_scale is None and programs > 1:
        # two launches (the top): an amax a program, or past fp8_amax_parts_max one zeroed cell
        amax_block = _common.next_power_of_2(programs) if programs <= cfg.fp8_amax_parts_max else 0
        amax_cells = programs if amax_block else 1
        switches["AMAX_BLOCK"] = amax_block
        launches = (
            KernelCall(_norm_fp8_kernel, (programs,), args,
                              dict(switches, MODE=_AMAX, STORE_H=True, STORE_STATS=with_stats), device),
            KernelCall(_norm_fp8_kernel, (programs,), args,
                              dict(switches, MODE=_FROM_AMAX, STORE_H=False, STORE_STATS=False), device))
    else:
        mode = _WHOLE if granularity == "per_tensor" and static_scale is None else _MODES.get(granularity, _STATIC)
        # (the transposed copy's launch reads the rows' statistics: stored whether or not asked)
        launches = (KernelCall(_norm_fp8_kernel, (programs,), args,
                                      dict(switches, MODE=mode, STORE_H=True, STORE_STATS=with_stats or transposed),
                               device),)
        if transposed:
            launches += (_transposed_launch(x, residual, weight, bias, rms, unit_offset, cast_before_weight, recipe,
                                            n_rows, n_cols, cfg, gpu, device),)
    stats_shape = ((1 if rms else 2), *x.shape[:-1]) if with_stats else None
    return _Plan(launches, amax_cells, recipe, stats_shape, residual_dtype if residual is not None else None)


def _transposed_launch(x, residual, weight, bias, rms, unit_offset, cast_before_weight, recipe, n_rows, n_cols,
                       cfg, gpu, device) -> KernelCall:
    """The transposed copy's launch, after the 1x128 recipe's own (the top): a program per 128
    rows (all of them, a power of two, when there are fewer) and ``fp8_transposed_block_n``
    columns."""
    block_m = min(GROUP_SIZE, _common.next_power_of_2(n_rows))
    block_n = min(cfg.fp8_transposed_block_n, _common.next_power_of_2(n_cols))
    switches = dict(IS_RMS=rms, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, UNIT_OFFSET=unit_offset,
                    CAST_BEFORE_WEIGHT=cast_before_weight, FP8_MAX=recipe.fp8_max,
                    IS_E5M2=recipe.dtype == torch.float8_e5m2, POW2=recipe.pow2_scales,
                    EXACT_CAST=x.device.type == "cpu", BLOCK_M=block_m, BLOCK_N=block_n, **_common.pdl(gpu),
                    num_warps=_common.warps_for(block_m * block_n, cfg.fp8_elems_per_thread, 16))
    # (z: x, or with a residual the h the first launch wrote, contiguous)
    args = (_common.row_stride(x) if residual is None else n_cols, n_rows, n_cols)
    return KernelCall(_norm_fp8_t_tile_kernel, (_common.cdiv(n_rows, block_m), _common.cdiv(n_cols, block_n)), args,
                      switches, device)


def _run_forward(launcher, plan: _Plan, x, residual, weight, bias, static_scale, eps, rms, unit_offset,
                 cast_before_weight, residual_dtype, fp8_dtype, granularity, pow2_scales, scale_ub, column_major,
                 with_stats, transposed) -> tuple:
    """``(data, scale, h, stats, data_t, scale_t)``: h, stats and the transposed copy empty
    where not asked (a custom op returns tensors)."""
    data = _common.new_output(x, fp8_dtype)
    scales = new_scales(plan.recipe, tuple(x.shape[:-1]), x.shape[-1], x)
    h = x.new_empty((0,)) if residual is None else _common.new_output(x, plan.residual_dtype)
    stats = x.new_empty(plan.stats_shape if plan.stats_shape else (0,), dtype=torch.float32)
    q = data.view(torch.uint8) if x.device.type == "cpu" else data  # (EXACT_CAST writes the bits)
    amax = None
    if plan.amax_cells == 1:
        amax = x.new_zeros((1,), dtype=torch.float32)
    elif plan.amax_cells:  # (one a program, each written before it is read)
        amax = x.new_empty((plan.amax_cells,), dtype=torch.float32)
    # (None for a pointer the kernel does not read: under torch.compile one tensor passed as
    # several pointers, one of them written, came back unwritten: the per-token scales, H100)
    stats_arg = stats if plan.stats_shape else None
    h_arg = h if residual is not None else None
    if not transposed:
        for kernel in plan.launches:
            kernel(launcher, x, residual, h_arg, q, weight, bias, stats_arg, scales, amax, static_scale)
        return data, scales, h, stats, x.new_empty((0,), dtype=fp8_dtype), x.new_empty((0,), dtype=torch.float32)
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    data_shape, scale_shape = plan.recipe.transposed_shapes(n_rows, n_cols)
    data_t = x.new_empty(data_shape, dtype=fp8_dtype)
    scale_t = x.new_empty(scale_shape, dtype=torch.float32)
    if stats_arg is None:  # (the statistics the copy's launch reads: not among the results)
        stats_arg = x.new_empty((1 if rms else 2, n_rows), dtype=torch.float32)
    rows, copy = plan.launches
    rows(launcher, x, residual, h_arg, q, weight, bias, stats_arg, scales, None, None)
    copy(launcher, x if residual is None else h, weight, bias, stats_arg,
         data_t.view(torch.uint8) if x.device.type == "cpu" else data_t, scale_t)
    return data, scales, h, stats, data_t, scale_t


def _no_backward(*_):
    raise RuntimeError("norm_fp8 has no backward of its own: its straight-through gradient is the norm's "
                       "(kernels/norm_fp8.py, NormFP8)")


norm_fp8 = _doors.Op(OpDescription(
    name="norm_fp8",
    inputs=(("x", Tensor), ("residual", Optional[Tensor]), ("weight", Optional[Tensor]), ("bias", Optional[Tensor]),
            ("static_scale", Optional[Tensor]), ("eps", float), ("rms", bool), ("unit_offset", bool),
            ("cast_before_weight", bool), ("residual_dtype", torch.dtype), ("fp8_dtype", torch.dtype),
            ("granularity", str), ("pow2_scales", bool), ("scale_ub", float), ("column_major", bool),
            ("with_stats", bool), ("transposed", bool)),
    outputs=("data", "scale", "h", "stats", "data_t", "scale_t"),
    residuals=(),
    plan_forward=_plan_forward,
    run_forward=_run_forward,
    saved=(),
    save=lambda inputs, results, needs: (),
    plan_backward=_no_backward,
    run_backward=_no_backward,
    differentiable=(),
    row_strided=("x", "residual"),
))
"""``norm_fp8(x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
residual_dtype, fp8_dtype, granularity, pow2_scales, scale_ub, column_major, with_stats, transposed)
-> (data, scale, h, stats, data_t, scale_t)``: the norm of 2-D rows (``x + residual`` in
``residual_dtype`` with a residual) quantized to FP8; ``scale_ub`` <= 0: none; ``with_stats``:
the norms' statistics for the backward (else an empty tensor, as h without a residual);
``transposed`` (per group only): the transposed copy (else empty tensors). No autograd of its own:
:class:`NormFP8` makes it differentiable (straight through)."""


class _StraightThrough(torch.autograd.Function):
    """norm_fp8 with the norm's backward on the gradient of the dequantized output."""

    @staticmethod
    def forward(ctx, plan, x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
                residual_dtype, out_dtype, recipe):
        data, scale, h, stats, data_t, scale_t = norm_fp8.call_planned(plan, *_op_args(
            x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight, residual_dtype,
            recipe, True))
        ctx.flags = (rms, False, unit_offset, cast_before_weight, eps)  # (the norms' saved flags; stable False)
        ctx.has_residual = residual is not None
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (x, residual, weight, bias))
        ctx.save_for_backward(x if residual is None else h, weight, stats)
        if recipe.transposed:
            ctx.mark_non_differentiable(data, scale, data_t, scale_t)
        else:
            ctx.mark_non_differentiable(data, scale)
            data_t = scale_t = None
        return (FP8Activation(data, scale, recipe.granularity, out_dtype), data, scale,
                h if ctx.has_residual else None, data_t, scale_t)

    @staticmethod
    def backward(ctx, d_activation, _d_data, _d_scale, d_h, _d_data_t, _d_scale_t):
        op = _norms.residual_norm if ctx.has_residual else _norms.norm
        x_dtype, r_dtype, _, _ = ctx.dtypes
        asked = ctx.needs_input_grad[1:5]
        needs = dict(x=asked[0], weight=asked[2], bias=asked[3])
        saved = (*op._as_saved(ctx.saved_tensors), *ctx.flags)  # (a hook may hand back another layout)
        grads = (d_activation,)
        if ctx.has_residual:
            needs["residual"] = asked[1]
            saved, grads = (*saved, x_dtype, r_dtype), (d_activation, d_h)
        plain = _eager.ready(grads)  # (the launch boundary's rule: a collective in flight is waited)
        if torch.is_grad_enabled() or plain is None:
            # create_graph=True, or a gradient of another subclass: the norm's backward in torch ops
            out = op.backward_graph(grads, needs, saved)
        else:
            out = op.planned_backward(plain, needs, saved)  # (a plan per layout, kept: not made per call)
        return (None, *[out[name].to(dtype) if need else None
                        for name, need, dtype in zip(("x", "residual", "weight", "bias"), asked, ctx.dtypes)],
                *([None] * 8))


def _op_args(x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight, residual_dtype,
             recipe, with_stats) -> tuple:
    """norm_fp8's arguments from the door's."""
    return (x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
            x.dtype if residual_dtype is None else residual_dtype, recipe.dtype, recipe.granularity,
            recipe.pow2_scales, float(recipe.scale_ub or 0.0), recipe.column_major_scales, with_stats,
            recipe.transposed)


class _DoorPlan(NamedTuple):
    op_plan: _doors.OpPlan
    autograd: bool

    def same_decisions(self, other: "_DoorPlan") -> bool:
        return self.autograd == other.autograd and self.op_plan.same_decisions(other.op_plan)


class NormFP8:
    """The functional FP8 norms' kernel door: ``(x, residual, weight, bias, static_scale, eps,
    rms, unit_offset, cast_before_weight, residual_dtype, out_dtype, recipe) ->``
    :class:`~triton_layers.fp8.FP8Rows`, the activation differentiable (straight through)
    where a gradient will flow. Planned by ``_eager.OpRouter`` as the ops of both doors are
    (:meth:`plan`, :meth:`call_planned`); a call it cannot plan (traced: the custom op) goes
    through :meth:`__call__`, with no gradient."""

    name = "norm_fp8"  # (what OpRouter's messages call it)

    def plan(self, x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
             residual_dtype, out_dtype, recipe) -> _DoorPlan:
        autograd = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                   for t in (x, residual, weight, bias))
        op_args = _op_args(x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
                           residual_dtype, recipe, autograd)
        return _DoorPlan(norm_fp8.plan(*op_args), autograd)

    def call_planned(self, plan: _DoorPlan, x, residual, weight, bias, static_scale, eps, rms, unit_offset,
                     cast_before_weight, residual_dtype, out_dtype, recipe) -> FP8Rows:
        if plan.autograd:  # (norm_fp8.call_planned makes the tensors' device current for the launch)
            activation, data, scale, h, data_t, scale_t = _StraightThrough.apply(
                plan.op_plan, x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
                residual_dtype, out_dtype, recipe)
            return FP8Rows(data, scale, h, activation, data_t, scale_t)
        data, scale, h, _, data_t, scale_t = norm_fp8.call_planned(plan.op_plan, *_op_args(
            x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight, residual_dtype,
            recipe, False))
        return _rows(recipe, data, scale, h if residual is not None else None, data_t, scale_t)

    def __call__(self, x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight,
                 residual_dtype, out_dtype, recipe) -> FP8Rows:
        data, scale, h, _, data_t, scale_t = norm_fp8(*_op_args(
            x, residual, weight, bias, static_scale, eps, rms, unit_offset, cast_before_weight, residual_dtype,
            recipe, False))
        return _rows(recipe, data, scale, h if residual is not None else None, data_t, scale_t)


def _rows(recipe: FP8Recipe, data, scale, h, data_t, scale_t) -> FP8Rows:
    """The result without a gradient (the op's empty transposed copy: None)."""
    if not recipe.transposed:
        data_t = scale_t = None
    return FP8Rows(data, scale, h, None, data_t, scale_t)


norm_fp8_door = NormFP8()
