"""Softmax over the last dim of a 2-D tensor with a fused scale, causal and key-padding masks.

Rows are the flattened (..., Nq, Nk) score matrices. Row ``r`` is query ``q = r % Nq``,
which may see keys ``j < limit = q + 1 + Nk - Nq`` (bottom-right aligned causal mask;
``limit = Nk`` without causal), and, with a key padding mask, only keys whose mask byte
in batch ``r // rows_per_batch`` is 0.

Forward:  y = exp(s*x - m) / sum(exp(s*x - m)) over the visible keys, 0 elsewhere, with
          m the row max; computed in fp32 (as exp2 of x * s*log2(e)). A row with no
          visible key is all zeros.
Backward: dx = s * y * (dy - sum(y * dy)), from the saved output y alone.
Causal rows read only their visible prefix [0, limit) and write zeros past it, so a
causal softmax reads about half of what a plain one does.

Rows up to ``SoftmaxLaunch.max_fused_cols`` (triton_layers/launch_config.py) are held in registers whole, several short
rows per program; longer rows take one program each and are walked in chunks (an online
max/sum pass, then an output pass re-reading the row, mostly from L2).
"""
from __future__ import annotations

from typing import Callable, Optional

import triton
import triton.language as tl
from torch import Tensor
from .. import launch_config
from . import _common
from ..calls import doors as _doors
from ..calls.description import OpDescription
from ..calls.fast_launch import KernelCall
from . import _softmax_rules as _rules
from ._pdl import pdl_start



@triton.jit
def _visible_limit(rows, n_cols, n_q, CAUSAL: tl.constexpr):
    """Number of visible keys of each row: a prefix, bottom-right aligned when causal."""
    if CAUSAL:
        limit = rows % n_q + 1 + (n_cols - n_q)
        return tl.minimum(tl.maximum(limit, 0), n_cols)
    else:
        return tl.zeros_like(rows) + n_cols


@triton.jit
def _program_tile(CAUSAL: tl.constexpr):
    """This program's tile of rows (a row on the looped path). Causal rows read a prefix that
    grows with the query but write whole, and programs start in about launch order: in
    launch order the first tiles only write and the last mostly read (rows of 32,768: the
    causal forward took 0.97x of the plain one's time for 0.75x of its bytes, H100). So
    causal programs take tiles from both ends in turn (0, n-1, 1, n-2, ...): equal work for
    each pair, and reads and writes mixed throughout."""
    pid = tl.program_id(0).to(tl.int64)
    if CAUSAL:
        last = tl.num_programs(0).to(tl.int64) - 1
        pid = tl.where(pid % 2 == 0, pid // 2, last - pid // 2)
    return pid


@triton.jit
def _row_tile(pid, n_rows, n_cols, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program ``pid``'s (BLOCK_M x BLOCK_N) tile of whole rows: row and column indices,
    which entries are visible keys, which to read, and which are in bounds (to write).

    Reads cover the visible prefix rounded up to 16 columns: a mask bounded by a multiple
    of 16 lets Triton emit 16-byte vector loads, where a per-row bound such as the causal
    limit gives scalar ones (seen in the sm_90 PTX: 16 scalar loads a thread instead of 2
    vectors). The few extra columns read are discarded through ``visible``."""
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    limit = _visible_limit(rows, n_cols, n_q, CAUSAL)
    visible = (cols[None, :] < limit[:, None]) & row_ok[:, None]
    in_bounds = (cols[None, :] < n_cols) & row_ok[:, None]
    to_read = (cols[None, :] < ((limit + 15) // 16 * 16)[:, None]) & in_bounds
    return rows[:, None], cols[None, :], visible, to_read, in_bounds


@triton.jit
def _load_scores(X, PadMask, x_offs, mask_offs, visible, to_read, scale_log2, HAS_MASK: tl.constexpr):
    """``x * scale * log2(e)`` in fp32 at visible, unpadded keys, -inf elsewhere; only the
    entries in ``to_read`` (the visible ones, or a vector-aligned superset) are read."""
    if HAS_MASK:
        pad = tl.load(PadMask + mask_offs, mask=to_read, other=1)
        visible = visible & (pad == 0)
    x = tl.load(X + x_offs, mask=to_read, other=0.0)
    return tl.where(visible, x.to(tl.float32) * scale_log2, float("-inf"))


@triton.jit
def _store_zeros_past(Row, limit, n_cols, BLOCK_N: tl.constexpr):
    """Zeros in the chunks of a looped row after its last visible chunk (nothing is read)."""
    cols = tl.arange(0, BLOCK_N)
    zeros = tl.zeros([BLOCK_N], dtype=Row.dtype.element_ty)
    for start in range(tl.cdiv(limit, BLOCK_N) * BLOCK_N, n_cols, BLOCK_N):
        tl.store(Row + start + cols, zeros, mask=start + cols < n_cols)


@triton.jit
def _tile_top_limit(pid, n_rows, n_cols, n_q, BLOCK_M: tl.constexpr, PREFIX_SPLITS: tl.constexpr):
    """The longest causal prefix among the tile's rows (0 without prefix splits: every tile
    then takes the first branch, the whole row, and the others compile to nothing)."""
    if PREFIX_SPLITS == 1:
        return 0
    else:
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        return tl.max(tl.where(rows < n_rows, _visible_limit(rows, n_cols, n_q, True), 0), axis=0)


@triton.jit
def _store_zero_columns(Out, rows, stride_row, n_rows, n_cols, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """Zeros in columns [WIDTH, n_cols) of the tile's rows (nothing is read or computed)."""
    zeros = tl.zeros([BLOCK_M, WIDTH], dtype=Out.dtype.element_ty)
    for part in tl.static_range(1, BLOCK_N // WIDTH):  # WIDTH-wide parts: powers of 2
        cols = part * WIDTH + tl.arange(0, WIDTH)[None, :]
        tl.store(Out + rows * stride_row + cols, zeros, mask=(cols < n_cols) & (rows < n_rows))


@triton.jit
def _softmax_rows(X, Y, PadMask, pid, stride_x_row, stride_y_row, stride_mask_row, n_rows, n_cols, n_q,
                  rows_per_batch, scale_log2, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr,
                  WIDTH: tl.constexpr, BLOCK_N: tl.constexpr):
    """The forward of a tile of whole rows whose visible keys all lie in the first WIDTH
    columns: the softmax over those, zeros written past them."""
    rows, cols, visible, to_read, in_bounds = _row_tile(pid, n_rows, n_cols, n_q, CAUSAL, BLOCK_M, WIDTH)
    mask_offs = (rows // rows_per_batch) * stride_mask_row + cols
    z = _load_scores(X, PadMask, rows * stride_x_row + cols, mask_offs, visible, to_read, scale_log2, HAS_MASK)
    m = tl.max(z, axis=1)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row with no visible key
    e = tl.exp2(z - m[:, None])
    denom = tl.sum(e, axis=1)
    # No visible key: e == 0, y == 0. (A NaN denominator, from a NaN or +inf score,
    # must stay NaN: `denom > 0` would have replaced it with 1 and left e unnormalized.)
    inv = 1.0 / tl.where(denom == 0.0, 1.0, denom)
    y = e * inv[:, None]
    tl.store(Y + rows * stride_y_row + cols, y.to(Y.dtype.element_ty), mask=in_bounds)
    _store_zero_columns(Y, rows, stride_y_row, n_rows, n_cols, BLOCK_M, WIDTH, BLOCK_N)


@triton.jit
def _grad_tile(DY, Y, y_offs, dy_offs, visible, to_read, CAUSAL: tl.constexpr, EVICT: tl.constexpr):
    """A tile of y and dy in fp32, 0 past the visible keys, read with L2 eviction policy
    EVICT ("evict_last": keep them for a second read; "evict_first"; "": no hint)."""
    y = tl.load(Y + y_offs, mask=to_read, other=0.0, eviction_policy=EVICT)
    dy = tl.load(DY + dy_offs, mask=to_read, other=0.0, eviction_policy=EVICT)
    y = y.to(tl.float32)
    dy = dy.to(tl.float32)
    if CAUSAL:
        # Reads reach up to 15 hidden keys past the limit: y is 0 there, but dy may be
        # anything (even NaN), so zero both. Without causal, to_read is exact.
        y = tl.where(visible, y, 0.0)
        dy = tl.where(visible, dy, 0.0)
    return y, dy


@triton.jit
def _softmax_grad_rows(DY, Y, DX, pid, stride_dy_row, stride_y_row, stride_dx_row, n_rows, n_cols, n_q, scale,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr,
                       RELOAD: tl.constexpr):
    """The backward of a tile of whole rows whose visible keys all lie in the first WIDTH
    columns (y is 0 past them, so dx is too). RELOAD reads y and dy again after the row sums
    instead of holding them through the reduction: held, rows of 32,768 need 64 fp32 values a
    thread at 32 warps (all of a thread's registers) and spill; reloaded, the second read
    comes from L2 (the first read asked to keep them there), as Inductor's kernel does
    (SoftmaxLaunch.bwd_reload_min_cols says where, and what it gained)."""
    rows, cols, visible, to_read, in_bounds = _row_tile(pid, n_rows, n_cols, n_q, CAUSAL, BLOCK_M, WIDTH)
    y_offs = rows * stride_y_row + cols
    dy_offs = rows * stride_dy_row + cols
    if RELOAD:
        y, dy = _grad_tile(DY, Y, y_offs, dy_offs, visible, to_read, CAUSAL, "evict_last")
    else:
        y, dy = _grad_tile(DY, Y, y_offs, dy_offs, visible, to_read, CAUSAL, "")
    dot = tl.sum(y * dy, axis=1)
    if RELOAD:
        y, dy = _grad_tile(DY, Y, y_offs, dy_offs, visible, to_read, CAUSAL, "evict_first")
    dx = (scale * y) * (dy - dot[:, None])
    tl.store(DX + rows * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=in_bounds)
    _store_zero_columns(DX, rows, stride_dx_row, n_rows, n_cols, BLOCK_M, WIDTH, BLOCK_N)


@triton.jit
def _softmax_fwd_kernel(
    X, Y, PadMask,
    stride_x_row, stride_y_row, stride_mask_row,
    n_rows, n_cols, n_q, rows_per_batch, scale_log2,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr, PREFIX_SPLITS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # PREFIX_SPLITS (causal, single pass): 2 or 4 = a tile whose rows all see at most 1/2
    # (1/4) of the columns computes on that part only: the causal tiles' arithmetic bounded by
    # their visible prefix, not the row length (see prefix_splits in _softmax_rules).
    pdl_start(USE_PDL)
    scale_log2 = tl.cast(scale_log2, tl.float32)  # Inductor may pass Python floats as fp64
    pid = _program_tile(CAUSAL)
    if SINGLE_PASS:
        top = _tile_top_limit(pid, n_rows, n_cols, n_q, BLOCK_M, PREFIX_SPLITS)
        if top <= BLOCK_N // PREFIX_SPLITS:  # always true without splits: the whole row
            _softmax_rows(X, Y, PadMask, pid, stride_x_row, stride_y_row, stride_mask_row, n_rows, n_cols, n_q,
                          rows_per_batch, scale_log2, CAUSAL, HAS_MASK, BLOCK_M, BLOCK_N // PREFIX_SPLITS, BLOCK_N)
        elif top <= BLOCK_N // 2:  # reached with 4 splits only
            _softmax_rows(X, Y, PadMask, pid, stride_x_row, stride_y_row, stride_mask_row, n_rows, n_cols, n_q,
                          rows_per_batch, scale_log2, CAUSAL, HAS_MASK, BLOCK_M, BLOCK_N // 2, BLOCK_N)
        else:
            _softmax_rows(X, Y, PadMask, pid, stride_x_row, stride_y_row, stride_mask_row, n_rows, n_cols, n_q,
                          rows_per_batch, scale_log2, CAUSAL, HAS_MASK, BLOCK_M, BLOCK_N, BLOCK_N)
    else:
        row = pid
        cols = tl.arange(0, BLOCK_N)
        x_row = X + row * stride_x_row
        y_row = Y + row * stride_y_row
        if HAS_MASK:
            PadMask += (row // rows_per_batch) * stride_mask_row
        limit = _visible_limit(row, n_cols, n_q, CAUSAL)
        # Online max and sum over the visible prefix, one chunk at a time.
        m = float("-inf")
        denom = 0.0
        for start in range(0, limit, BLOCK_N):
            z = _load_scores(x_row, PadMask, start + cols, start + cols, start + cols < limit, start + cols < limit,
                             scale_log2, HAS_MASK)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            denom = denom * tl.exp2(m - m_use) + tl.sum(tl.exp2(z - m_use), axis=0)
            m = m_new
        m = tl.where(m == float("-inf"), 0.0, m)
        # No visible key: e == 0, y == 0. (A NaN denominator, from a NaN or +inf score,
        # must stay NaN: `denom > 0` would have replaced it with 1 and left e unnormalized.)
        inv = 1.0 / tl.where(denom == 0.0, 1.0, denom)
        for start in range(0, limit, BLOCK_N):
            z = _load_scores(x_row, PadMask, start + cols, start + cols, start + cols < limit, start + cols < limit,
                             scale_log2, HAS_MASK)
            y = tl.exp2(z - m) * inv
            tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=start + cols < n_cols)
        if CAUSAL:
            _store_zeros_past(y_row, limit, n_cols, BLOCK_N)


@triton.jit
def _softmax_fwd_class_kernel(
    X, Y, PadMask,
    stride_x_row, stride_y_row, stride_mask_row,
    n_rows, n_cols, n_q, rows_per_batch, scale_log2, q_lo, q_count,
    HAS_MASK: tl.constexpr, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # The causal forward of long rows held whole, as one launch per class of rows: the rows of
    # queries q_lo .. q_lo + q_count - 1 of every score matrix, one a program, see at most
    # WIDTH columns and are computed over those (zeros written past them). In the one launch
    # above every program is sized for the widest row: at 32,768 columns one program of 1,024
    # threads fills an SM, and a row that reads a short prefix still spends a whole load's
    # latency alone there. A launch of the short rows' class, with half the warps, fits two
    # programs an SM (docs/TUNING.md, "SoftmaxLaunch.causal_class_min_cols").
    pdl_start(USE_PDL)
    scale_log2 = tl.cast(scale_log2, tl.float32)  # Inductor may pass Python floats as fp64
    pid = _program_tile(True)  # (both ends in turn: the class's rows still grow with q)
    row = (pid // q_count) * n_q + q_lo + pid % q_count
    _softmax_rows(X, Y, PadMask, row, stride_x_row, stride_y_row, stride_mask_row, n_rows, n_cols, n_q,
                  rows_per_batch, scale_log2, True, HAS_MASK, 1, WIDTH, BLOCK_N)


@triton.jit
def _softmax_bwd_kernel(
    DY, Y, DX,
    stride_dy_row, stride_y_row, stride_dx_row,
    n_rows, n_cols, n_q, scale,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr, PREFIX_SPLITS: tl.constexpr,
    RELOAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # y is 0 at every masked key, so dx is too: only the causal prefix needs reading.
    pdl_start(USE_PDL)
    scale = tl.cast(scale, tl.float32)  # Inductor may pass Python floats as fp64
    pid = _program_tile(CAUSAL)
    if SINGLE_PASS:
        top = _tile_top_limit(pid, n_rows, n_cols, n_q, BLOCK_M, PREFIX_SPLITS)
        if top <= BLOCK_N // PREFIX_SPLITS:  # always true without splits: the whole row
            _softmax_grad_rows(DY, Y, DX, pid, stride_dy_row, stride_y_row, stride_dx_row, n_rows, n_cols, n_q, scale,
                               CAUSAL, BLOCK_M, BLOCK_N // PREFIX_SPLITS, BLOCK_N, RELOAD and PREFIX_SPLITS == 1)
        elif top <= BLOCK_N // 2:  # reached with 4 splits only
            _softmax_grad_rows(DY, Y, DX, pid, stride_dy_row, stride_y_row, stride_dx_row, n_rows, n_cols, n_q, scale,
                               CAUSAL, BLOCK_M, BLOCK_N // 2, BLOCK_N, False)
        else:
            _softmax_grad_rows(DY, Y, DX, pid, stride_dy_row, stride_y_row, stride_dx_row, n_rows, n_cols, n_q, scale,
                               CAUSAL, BLOCK_M, BLOCK_N, BLOCK_N, RELOAD)
    else:
        row = pid
        cols = tl.arange(0, BLOCK_N)
        y_row = Y + row * stride_y_row
        dy_row = DY + row * stride_dy_row
        dx_row = DX + row * stride_dx_row
        limit = _visible_limit(row, n_cols, n_q, CAUSAL)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, limit, BLOCK_N):
            visible = start + cols < limit
            y = tl.load(y_row + start + cols, mask=visible, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + start + cols, mask=visible, other=0.0).to(tl.float32)
            acc += y * dy
        dot = tl.sum(acc, axis=0)
        for start in range(0, limit, BLOCK_N):
            visible = start + cols < limit
            y = tl.load(y_row + start + cols, mask=visible, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + start + cols, mask=visible, other=0.0).to(tl.float32)
            dx = (scale * y) * (dy - dot)
            tl.store(dx_row + start + cols, dx.to(DX.dtype.element_ty), mask=start + cols < n_cols)
        if CAUSAL:
            _store_zeros_past(dx_row, limit, n_cols, BLOCK_N)


def _plan(y_like: Tensor, causal: bool) -> tuple:
    """``(grid, BLOCK_M, BLOCK_N, single_pass, num_warps, PREFIX_SPLITS)`` for rows like ``y_like``'s."""
    n_cols = y_like.shape[-1] if y_like.dim() else 1
    n_rows = y_like.numel() // n_cols if n_cols else 0
    block_m, block_n, single_pass, warps, prefix_splits = _rules.tile(
        n_rows, n_cols, launch_config.current().softmax, causal)
    return n_rows, n_cols, (_common.cdiv(n_rows, block_m),), dict(
        BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single_pass, PREFIX_SPLITS=prefix_splits, num_warps=warps,
        **_common.pdl(launch_config.GPU.of(y_like.device)))


def _local_counts(x: Tensor, key_padding_mask: Optional[Tensor], n_q: int, rows_per_batch: int,
                  causal: bool) -> tuple[int, int]:
    """``(n_q, rows_per_batch)``, each from x's shape where given as 0 (see :func:`_plan_forward`)."""
    if n_q == 0:
        n_q = x.shape[-2] if causal else 1
    if rows_per_batch == 0:
        n_cols = x.shape[-1] if x.dim() else 1
        rows_per_batch = max(1, x.numel() // n_cols // x.shape[0]) if key_padding_mask is not None and n_cols else 1
    return n_q, rows_per_batch


def _plan_forward(x: Tensor, key_padding_mask: Optional[Tensor], n_q: int, rows_per_batch: int, causal: bool,
                  scale: float) -> tuple[KernelCall, ...]:
    """The forward's launches for ``x`` (..., Nk) whose rows are a matrix as it is
    (:func:`_common.rows_as_is`). ``key_padding_mask`` is bool (B, Nk), True = padding; row
    ``r`` uses its row ``r // rows_per_batch``. ``n_q`` is the number of queries per score
    matrix (rows ``r % n_q``), used when ``causal``. Either 0: taken from x's own shape (x as
    given, (B, [H,] Nq, Nk)): so a DTensor's local shard, with fewer heads or batch entries
    than the whole, plans for what it holds."""
    n_q, rows_per_batch = _local_counts(x, key_padding_mask, n_q, rows_per_batch, causal)
    n_rows, n_cols, grid, tile = _plan(x, causal)
    # (y is new and contiguous; the mask reaches the kernel contiguous: see mask_bytes)
    strides = (_common.row_stride(x), n_cols, 0 if key_padding_mask is None else key_padding_mask.shape[-1])
    args = (*strides, n_rows, n_cols, n_q, rows_per_batch, scale * _common.LOG2E)
    has_mask, device = key_padding_mask is not None, _common.device_index(x)
    classes = _rules.causal_classes(n_cols, n_q, x.element_size(), tile["BLOCK_N"], tile["SINGLE_PASS"], causal,
                                   launch_config.current().softmax)
    if classes:
        n_matrices = n_rows // n_q
        return tuple(KernelCall(_softmax_fwd_class_kernel, (n_matrices * count,), (*args, q_lo, count),
                                       dict(HAS_MASK=has_mask, WIDTH=width, BLOCK_N=tile["BLOCK_N"], num_warps=warps,
                                            **_common.pdl(launch_config.GPU.of(x.device))),
                                       device)
                     for q_lo, count, width, warps in classes)
    return (KernelCall(_softmax_fwd_kernel, grid, args, dict(CAUSAL=causal, HAS_MASK=has_mask, **tile),
                              device),)


def _run_forward(launcher: Callable, kernels: tuple[KernelCall, ...], x: Tensor,
                 key_padding_mask: Optional[Tensor], *_) -> tuple[Tensor]:
    """``(y,)``, y of x's shape."""
    y = _common.new_output(x)
    mask = _common.mask_bytes(key_padding_mask, launcher)
    for kernel in kernels:
        kernel(launcher, x, y, mask)
    return (y,)


def _plan_backward(grads: tuple, needs: dict, y: Tensor, n_q: int, causal: bool, scale: float) -> tuple:
    """``(launch, whether dy is copied first)`` for this gradient's layout."""
    dy = grads[0]
    copy_dy = not _common.rows_as_is(dy)
    n_q = _local_counts(y, None, n_q, 1, causal)[0]
    n_rows, n_cols, grid, tile = _plan(y, causal)
    reload = _rules.bwd_reload(tile["BLOCK_N"], tile["SINGLE_PASS"], launch_config.current().softmax)
    kernel = KernelCall(
        _softmax_bwd_kernel, grid,
        (n_cols if copy_dy else _common.row_stride(dy), n_cols, n_cols, n_rows, n_cols, n_q, scale),
        dict(CAUSAL=causal, RELOAD=reload, **tile), _common.device_index(y))
    return kernel, copy_dy


def _run_backward(launcher: Callable, plan: tuple, grads: tuple, needs: dict, y: Tensor, *_) -> dict:
    """``dx`` from the saved output ``y`` (new, contiguous) and ``dy``."""
    kernel, copy_dy = plan
    dy = grads[0].contiguous() if copy_dy else grads[0]
    dx = _common.new_output(y)
    kernel(launcher, dy, y, dx)
    return {"x": dx}


def _backward_graph(grads: tuple, needs: dict, y: Tensor, n_q: int, causal: bool, scale: float) -> dict:
    """The backward in differentiable torch ops (``create_graph=True``): dx = scale * y * (dy -
    sum(dy * y)) from the saved output y, whose history leads back through this op. Masked
    entries have y = 0, so their dx is 0, as the kernel's."""
    dy, yf = grads[0].float(), y.float()
    return {"x": scale * yf * (dy - (dy * yf).sum(-1, keepdim=True))}


softmax = _doors.Op(OpDescription(
    name="softmax",
    inputs=(("x", Tensor), ("key_padding_mask", Optional[Tensor]), ("n_q", int), ("rows_per_batch", int),
            ("causal", bool), ("scale", float)),
    outputs=("y",),
    residuals=(),
    plan_forward=_plan_forward,
    run_forward=_run_forward,
    saved=(("y", Tensor), ("n_q", int), ("causal", bool), ("scale", float)),
    save=lambda inputs, results, needs: (results.y, inputs.n_q, inputs.causal, inputs.scale),
    plan_backward=_plan_backward,
    run_backward=_run_backward,
    differentiable=("x",),
    row_strided=("x",),
    backward_graph=_backward_graph,
    # Rows shard along every dim but the last; the mask (B, Nk) along the batch dim alone; a
    # causal mask needs each query's index in its matrix: not along the queries' dim.
    row_sharded={"x": (0, 1), "key_padding_mask": (0, 1), "y": (0, 1)},
    unshardable_rows=lambda args, n_rows: (n_rows - 1,) if args["causal"] else (),
))
"""Differentiable masked softmax of a 2-D ``x`` (last stride 1):
``softmax(x, key_padding_mask, n_q, rows_per_batch, causal, scale)``."""
