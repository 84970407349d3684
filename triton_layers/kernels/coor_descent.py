"""CoLT5 coordinate descent (soft top-k with eps-scaling) over the last dim: kernels, launchers, autograd.

Definition (per row; ``valid`` = unmasked entries, e_0 = max(eps_init, eps), e_t = max(e_{t-1} * decay, eps)):
    a_0 = 0, b_0 = -s
    for t = 1..T:  L_t = LSE_valid((s + b_{t-1}) / e_{t-1});  a_t = e_{t-1} (log k - L_t);  b_t = -relu(s + a_t)
    y = exp((s + a_T + b_T) / e_T) = exp(min(s + a_T, 0) / e_T), 0 where masked.

Since s + b_{t-1} = min(s, -a_{t-1}) for t >= 2 (and = 0 for t = 1), every iteration is a
function of s and one scalar, and the row max of min(s, -a) / e is min(max s, -a) / e: one
reduction (a sum of exps) per iteration. The forward keeps one program per row (the
iterations are a chain of row reductions; splitting a row would need a launch or a grid
barrier per iteration) and stores only a_t and L_t per iteration: two scalars, nothing
row-sized.

Backward (the exact gradient of the unrolled iterations). With g = dy * y / e_T * [s + a_T <= 0]:
    da_T = sum(g);  for t = T..2: da_{t-1} = da_t * c_t,  c_t = cnt_t * exp(-a_{t-1} / e_{t-1} - L_t)
    where cnt_t = #{valid j: s_j + a_{t-1} > 0} (those entries all sit at -a_{t-1}, the softmax
    mass above the relu kink);  t = 1 has no s-dependence (s + b_0 = 0);
    ds = g - sum_{t=2..T} da_t * exp(s / e_{t-1} - L_t) * [s + a_{t-1} <= 0]
    dlog k = sum_{t=1..T} e_{t-1} da_t,  dk = dlog k / k (0 where k was clamped to 1e-20).
After one row sum and T - 1 row counts, ds is elementwise, so the backward may split rows
into chunks (a few long rows then still fill the GPU): launch 1 writes per-chunk partials
(sum g, counts), launch 2 reduces them in a fixed order (no atomics: bitwise reproducible),
runs the scalar recursion and writes its chunk of ds. A row of one chunk (many rows) takes
launch 2 alone, its program computing the row's sum and counts itself. Masked entries get
zero; fully masked rows give zeros everywhere.

Both directions are bound by latency (the chain of T reductions), and each iteration's cost
is per element: the forward's exps are taken in base 2 with the division by e folded into
one factor, and every launch holds few elements a thread (CoorDescentLaunch).
"""
from __future__ import annotations

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
from ..calls.fast_launch import KernelCall
from . import _coor_descent_rules as _rules
from ._pdl import pdl_start

# log k uses k clamped to at least this (as colt5-attention does).
K_MIN = tl.constexpr(1e-20)
LOG2E = tl.constexpr(_common.LOG2E)  # (a tl.constexpr: compiled Triton reads constexpr globals only)


@triton.jit
def _load_chunk(S, Mask, offs, N, HAS_MASK: tl.constexpr):
    """Load s (fp32) at ``offs`` of one row and whether each entry is valid (in bounds and unmasked)."""
    valid = offs < N
    if HAS_MASK:
        valid = valid & (tl.load(Mask + offs, mask=valid, other=0) != 0)
    s = tl.load(S + offs, mask=valid, other=0.0).to(tl.float32)
    return s, valid


@triton.jit
def _fwd_iteration(S, Mask, A, L, s, valid, s_max, a, e, logk, poison, t, N,
                   HAS_MASK: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr):
    """Iteration t + 1 of the forward (a = a_t, e = e_t): store a_{t+1} and L_{t+1}; return a_{t+1}."""
    lim = -a
    # max_j min(s_j, -a), reached by the row's max: every exp below is <= 1 and the sum is
    # >= 1 (on valid rows), so the log below is safe.
    top = tl.minimum(s_max, lim)
    # In base 2, the division by e folded into one factor: a subtraction, a multiply and an
    # exp2 per element (a division, a subtraction and exp's own multiply before); each
    # iteration's cost is per element. Subtracting before scaling keeps the large terms'
    # exponents as exact as the division did (x / e - top / e rounded both, then cancelled).
    c = LOG2E / e
    if SINGLE_PASS:
        total = tl.sum(tl.where(valid, tl.exp2((tl.minimum(s, lim) - top) * c), 0.0), axis=0)
    else:
        cols = tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            s_chunk, valid_chunk = _load_chunk(S, Mask, start + cols, N, HAS_MASK)
            acc += tl.where(valid_chunk, tl.exp2((tl.minimum(s_chunk, lim) - top) * c), 0.0)
        total = tl.sum(acc, axis=0)
    lse = top / e + tl.log(tl.maximum(total, 1.0))
    a = e * (logk - lse) + poison
    tl.store(A + t, a)
    tl.store(L + t, lse)
    return a


@triton.jit
def _coor_descent_fwd_kernel(
    S, Mask, K, Y, Stats, Eps,
    stride_s_row, stride_m_row, stride_k, stride_y_row, N, n_iters,
    k_value, eps, eps_init, eps_decay,
    HAS_MASK: tl.constexpr, K_PER_ROW: tl.constexpr,
    BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # k: one value a row at K (K_PER_ROW; k_value is None), or k_value for every row (K is None).
    # Inductor may hand Python floats in as fp64: pin them to fp32, so that the values the
    # loop carries keep one type (Triton refuses a loop variable that changes type).
    pdl_start(USE_PDL)
    eps = tl.cast(eps, tl.float32)
    eps_init = tl.cast(eps_init, tl.float32)
    eps_decay = tl.cast(eps_decay, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    S += row * stride_s_row
    Y += row * stride_y_row
    if HAS_MASK:
        Mask += row * stride_m_row
    A = Stats + row * 2 * n_iters  # a_1..a_T
    L = A + n_iters  # L_1..L_T
    cols = tl.arange(0, BLOCK_N)
    if K_PER_ROW:  # (k_value is None)
        k = tl.load(K + row * stride_k).to(tl.float32)
    else:  # (K is None)
        k = tl.cast(k_value, tl.float32)
    logk = tl.log(tl.maximum(k, K_MIN))

    # Row statistics that never change: number of valid entries and max of s.
    # `poison` is 0, or NaN when a valid entry (or k) is NaN or +-inf: added to every a_t and
    # to y, it makes such a row NaN as in the torch definition (whose first step computes
    # s - s). Without it the min/max below (NaN-ignoring on the GPU) would hide the NaN.
    if SINGLE_PASS:
        s, valid = _load_chunk(S, Mask, cols, N, HAS_MASK)
        n_valid = tl.sum(valid.to(tl.float32), axis=0)
        s_max = tl.max(tl.where(valid, s, float("-inf")), axis=0)
        poison = tl.sum(tl.where(valid, s * 0.0, 0.0), axis=0)
    else:
        s = tl.zeros([BLOCK_N], dtype=tl.float32)  # unused: each pass reads the row again
        valid = cols < 0
        cnt_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        max_acc = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
        poison_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            s_chunk, valid_chunk = _load_chunk(S, Mask, start + cols, N, HAS_MASK)
            cnt_acc += valid_chunk.to(tl.float32)
            max_acc = tl.maximum(max_acc, tl.where(valid_chunk, s_chunk, float("-inf")))
            poison_acc += tl.where(valid_chunk, s_chunk * 0.0, 0.0)
        n_valid = tl.sum(cnt_acc, axis=0)
        s_max = tl.max(max_acc, axis=0)
        poison = tl.sum(poison_acc, axis=0)
    poison += k * 0.0
    # A fully masked row runs on finite dummies (its output is all zeros anyway).
    s_max = tl.where(n_valid > 0, s_max, 0.0)

    # Iteration 1: s + b_0 = 0 on every valid entry, so L_1 = log(#valid).
    e = tl.maximum(eps_init, eps)
    lse = tl.log(tl.maximum(n_valid, 1.0))
    a = e * (logk - lse) + poison
    tl.store(A, a)
    tl.store(L, lse)
    for t in range(1, n_iters):
        e = tl.maximum(e * eps_decay, eps)
        a = _fwd_iteration(S, Mask, A, L, s, valid, s_max, a, e, logk, poison, t, N, HAS_MASK, BLOCK_N, SINGLE_PASS)
    e = tl.maximum(e * eps_decay, eps)  # e_T

    if SINGLE_PASS:
        y = tl.where(valid, tl.exp(tl.minimum(s + a, 0.0) / e) + poison, 0.0)
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=cols < N)
    else:
        for start in range(0, N, BLOCK_N):
            s_chunk, valid_chunk = _load_chunk(S, Mask, start + cols, N, HAS_MASK)
            y = tl.where(valid_chunk, tl.exp(tl.minimum(s_chunk + a, 0.0) / e) + poison, 0.0)
            tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=start + cols < N)
    if row == 0:  # the schedule e_0..e_T (the same fp32 operations as the chain above)
        e_i = tl.maximum(eps_init, eps)
        for i in range(0, n_iters + 1):
            tl.store(Eps + i, e_i)
            e_i = tl.maximum(e_i * eps_decay, eps)


@triton.jit
def _coor_descent_grad_out(S, Mask, DY, Stats, Eps, offs, N, n_iters, HAS_MASK: tl.constexpr):
    """s, valid and g = dy * y / e_T * [s + a_T <= 0] (0 where invalid) at ``offs`` of one row."""
    s, valid = _load_chunk(S, Mask, offs, N, HAS_MASK)
    dy = tl.load(DY + offs, mask=valid, other=0.0).to(tl.float32)
    a_last = tl.load(Stats + n_iters - 1)
    e_last = tl.load(Eps + n_iters)
    z = s + a_last
    # exp of min(z, 0) (= y): no inf computed and then discarded where z > 0.
    g = tl.where(valid & (z <= 0.0), dy * tl.exp(tl.minimum(z, 0.0) / e_last) / e_last, 0.0)
    # A row the forward made NaN (a_T is NaN) gets NaN gradients, as in the torch definition.
    g += tl.where(valid, a_last * 0.0, 0.0)
    return s, valid, g


@triton.jit
def _count_above(s, valid, a_prev):
    """#{valid j: s_j + a_{t-1} > 0} over the block."""
    return tl.sum((valid & (s + a_prev > 0.0)).to(tl.float32), axis=0)


@triton.jit
def _coor_descent_bwd_partial_kernel(
    S, Mask, DY, Stats, Eps, Partial,
    stride_s_row, stride_m_row, stride_dy_row, N, n_iters, n_chunks,
    HAS_MASK: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # Rows of several chunks, step 1: Partial[row, 0, chunk] = sum of g over the chunk;
    # Partial[row, t - 1, chunk] = #{valid j in chunk: s_j + a_{t-1} > 0} for t = 2..T.
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    S += row * stride_s_row
    DY += row * stride_dy_row
    if HAS_MASK:
        Mask += row * stride_m_row
    A = Stats + row * 2 * n_iters
    P = Partial + row * n_iters * n_chunks + chunk
    offs = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    s, valid, g = _coor_descent_grad_out(S, Mask, DY, A, Eps, offs, N, n_iters, HAS_MASK)
    tl.store(P, tl.sum(g, axis=0))
    for t in range(2, n_iters + 1):
        tl.store(P + (t - 1) * n_chunks, _count_above(s, valid, tl.load(A + t - 2)))


@triton.jit
def _bwd_iteration(A, L, Eps, P, s, valid, ds, da, dlogk, t, n_chunks, chunk_ids, in_row,
                   ONE_CHUNK: tl.constexpr):
    """Iteration t (T down to 2) of the backward: ds -= da_t * p_t below the kink, dlog k += e_{t-1} da_t;
    returns (ds, dlogk, da_{t-1})."""
    a_prev = tl.load(A + t - 2)
    lse = tl.load(L + t - 1)
    e_prev = tl.load(Eps + t - 1)
    below = valid & (s + a_prev <= 0.0)
    # p_t = softmax of min(s, -a_{t-1}) / e_{t-1}: <= 1, never inf. Not in the forward's base-2
    # form: on a row of one entry L_t = s / e_{t-1} (the same division), so p_t = 1 exactly and
    # ds = 0 exactly; exp2(x * LOG2E / e - L * LOG2E) left 1e-4 there (H100).
    p = tl.exp(tl.minimum(s, -a_prev) / e_prev - lse)
    ds -= tl.where(below, da * p, 0.0)
    dlogk += e_prev * da
    if ONE_CHUNK:
        count = _count_above(s, valid, a_prev)
    else:
        count = tl.sum(tl.load(P + (t - 1) * n_chunks + chunk_ids, mask=in_row, other=0.0), axis=0)
    return ds, dlogk, da * (count * tl.exp(-a_prev / e_prev - lse))


@triton.jit
def _coor_descent_bwd_kernel(
    S, Mask, DY, K, Stats, Eps, Partial, DS, DK,
    stride_s_row, stride_m_row, stride_dy_row, stride_k, stride_ds_row, N, n_iters, n_chunks,
    k_value,
    HAS_MASK: tl.constexpr, K_PER_ROW: tl.constexpr, COMPUTE_DK: tl.constexpr,
    ONE_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # A row of one chunk: its program computes the row's sum of g and counts itself (one
    # launch). Several chunks: every program of a row reduces the row's partials (step 1's)
    # itself, in the same fixed order.
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    S += row * stride_s_row
    DY += row * stride_dy_row
    DS += row * stride_ds_row
    if HAS_MASK:
        Mask += row * stride_m_row
    A = Stats + row * 2 * n_iters
    L = A + n_iters
    P = Partial
    chunk_ids = tl.arange(0, CHUNKS_BLOCK)
    in_row = chunk_ids < n_chunks
    offs = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    s, valid, ds = _coor_descent_grad_out(S, Mask, DY, A, Eps, offs, N, n_iters, HAS_MASK)
    if ONE_CHUNK:
        da = tl.sum(ds, axis=0)  # da_T
    else:
        P += row * n_iters * n_chunks
        da = tl.sum(tl.load(P + chunk_ids, mask=in_row, other=0.0), axis=0)
    dlogk = da * 0.0
    for i in range(0, n_iters - 1):
        ds, dlogk, da = _bwd_iteration(A, L, Eps, P, s, valid, ds, da, dlogk, n_iters - i, n_chunks, chunk_ids,
                                       in_row, ONE_CHUNK)
    tl.store(DS + offs, ds.to(DS.dtype.element_ty), mask=offs < N)
    if COMPUTE_DK:
        if chunk == 0:
            dlogk += tl.load(Eps) * da  # t = 1
            if K_PER_ROW:  # (k_value is None)
                k = tl.load(K + row * stride_k).to(tl.float32)
            else:  # (K is None; k_value is fp64 under Inductor, see the forward kernel)
                k = tl.cast(k_value, tl.float32)
            dk = tl.where(k >= K_MIN, dlogk / k, 0.0)
            tl.store(DK + row, dk)


def _k_stride(k: Optional[Tensor]) -> int:
    """The stride between rows' k: k is one value a row, 1-D (any stride, 0 for one k for all)
    or of s's leading shape and contiguous."""
    return 0 if k is None else k.stride(0) if k.dim() == 1 else 1


class _ForwardPlan(NamedTuple):
    kernel: KernelCall
    stats_shape: tuple[int, ...]
    schedule_shape: tuple[int]


def _plan_forward(s: Tensor, mask: Optional[Tensor], k: Optional[Tensor], k_value: Optional[float], n_iters: int,
                  eps: float, eps_init: float, eps_decay: float) -> _ForwardPlan:
    """The forward's launch for ``s`` (..., n) whose rows are a matrix as it is
    (:func:`_common.rows_as_is`), ``mask`` bool of s's shape or None (it reaches the kernel
    contiguous: see mask_bytes), and either ``k`` one value per row (1-D; ``k_value`` None) or
    ``k_value`` one value for every row (``k`` None)."""
    cfg = launch_config.current().coor_descent
    n_cols = s.shape[-1]
    n_rows = s.numel() // n_cols if n_cols else 0
    block, single_pass = _common.row_block(n_cols, cfg.max_fused_cols, cfg.loop_block)
    kernel = KernelCall(
        _coor_descent_fwd_kernel, (n_rows,),
        (_common.row_stride(s), 0 if mask is None else n_cols, _k_stride(k), n_cols,
         n_cols, n_iters, k_value, eps, eps_init, eps_decay),
        dict(HAS_MASK=mask is not None, K_PER_ROW=k is not None, BLOCK_N=block, SINGLE_PASS=single_pass,
             num_warps=_common.warps_for(block, cfg.fwd_elems_per_thread, cfg.fwd_max_warps),
             **_common.pdl(launch_config.GPU.of(s.device))),
        _common.device_index(s))
    # (the rows as s has them: a shard of s along a row dim is the same shard of stats)
    return _ForwardPlan(kernel, (*s.shape[:-1], 2, n_iters), (n_iters + 1,))


def _run_forward(launcher, plan: _ForwardPlan, s: Tensor, mask: Optional[Tensor], k: Optional[Tensor],
                 *_) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, stats, eps_schedule)``: y of s's shape; stats (rows, 2, n_iters) fp32 holds a_t
    and L_t; eps_schedule (n_iters + 1,) fp32 holds e_0..e_T."""
    y = _common.new_output(s)
    stats = s.new_empty(plan.stats_shape, dtype=torch.float32)
    eps_schedule = s.new_empty(plan.schedule_shape, dtype=torch.float32)
    plan.kernel(launcher, s, _common.mask_bytes(mask, launcher), k, y, stats, eps_schedule)
    return y, stats, eps_schedule


class _BackwardPlan(NamedTuple):
    partials: Optional[KernelCall]  # None: rows of one chunk, one launch
    grads: KernelCall
    copy_dy: bool
    partial_shape: tuple[int, int, int]


def _plan_backward(grads: tuple, needs: dict, s: Tensor, mask: Optional[Tensor], k: Optional[Tensor],
                   stats: Tensor, eps_schedule: Tensor, k_value: Optional[float], *_) -> _BackwardPlan:
    """The backward's launches for this gradient's layout: one when each row is one chunk,
    else a first one writing the chunks' partial sums."""
    cfg = launch_config.current().coor_descent
    dy = grads[0]
    copy_dy = not _common.rows_as_is(dy)
    n_cols = s.shape[-1]
    n_rows = s.numel() // n_cols if n_cols else 0
    n_iters = stats.shape[-1]
    block, n_chunks = _rules.split_row(n_rows, n_cols, cfg, launch_config.GPU.of(s.device))
    stride_s, stride_m = _common.row_stride(s), 0 if mask is None else n_cols
    stride_dy = n_cols if copy_dy else _common.row_stride(dy)
    warps = _common.warps_for(block, cfg.bwd_elems_per_thread)
    device = _common.device_index(s)
    pdl = _common.pdl(launch_config.GPU.of(s.device))
    partials = None
    if n_chunks > 1:
        partials = KernelCall(
            _coor_descent_bwd_partial_kernel, (n_rows, n_chunks),
            (stride_s, stride_m, stride_dy, n_cols, n_iters, n_chunks),
            dict(HAS_MASK=mask is not None, BLOCK_N=block, num_warps=warps, **pdl), device)
    grads_kernel = KernelCall(
        _coor_descent_bwd_kernel, (n_rows, n_chunks),
        (stride_s, stride_m, stride_dy, _k_stride(k), n_cols, n_cols, n_iters, n_chunks, k_value),
        dict(HAS_MASK=mask is not None, K_PER_ROW=k is not None, COMPUTE_DK=needs["k"], ONE_CHUNK=n_chunks == 1,
             BLOCK_N=block,
             CHUNKS_BLOCK=max(_common.next_power_of_2(n_chunks), 2), num_warps=warps, **pdl),
        device)
    return _BackwardPlan(partials, grads_kernel, copy_dy, (n_rows, n_iters, n_chunks))


def _run_backward(launcher, plan: _BackwardPlan, grads: tuple, needs: dict, s: Tensor, mask: Optional[Tensor],
                  k: Optional[Tensor], stats: Tensor, eps_schedule: Tensor, k_value: Optional[float], *_) -> dict:
    """Gradients of s and (fp32) of the per-row k, those in ``needs``."""
    dy = grads[0].contiguous() if plan.copy_dy else grads[0]
    ds = _common.new_output(s)
    dk = s.new_empty(k.shape, dtype=torch.float32) if needs["k"] else None  # (one a row, as k)
    mask_u8 = _common.mask_bytes(mask, launcher)
    partial = None
    if plan.partials is not None:
        partial = s.new_empty(plan.partial_shape, dtype=torch.float32)
        plan.partials(launcher, s, mask_u8, dy, stats, eps_schedule, partial)
    plan.grads(launcher, s, mask_u8, dy, k, stats, eps_schedule, partial, ds, dk)
    return {"s": ds, "k": dk}


def _backward_graph(grads: tuple, needs: dict, s: Tensor, mask: Optional[Tensor], k: Optional[Tensor],
                    stats: Tensor, eps_schedule: Tensor, k_value: Optional[float], n_iters: int, eps: float,
                    eps_init: float,
                    eps_decay: float) -> dict:
    """The backward in differentiable torch ops (``create_graph=True``): the reference's
    gradients of the unrolled iterations, recomputed from the saved s (and k), which carry
    their autograd history."""
    wanted = {n: t for n, t in (("s", s), ("k", k)) if needs[n]}
    return recomputed_grads(
        lambda: reference.coor_descent(s, n_iters, k_value if k is None else k.reshape(s.shape[:-1]), eps, eps_init,
                                       eps_decay, mask), wanted, grads[0])


coor_descent = _doors.Op(OpDescription(
    name="coor_descent",
    # (k: one value a row, or k_value: one for every row; the other is None)
    inputs=(("s", Tensor), ("mask", Optional[Tensor]), ("k", Optional[Tensor]), ("k_value", Optional[float]),
            ("n_iters", int), ("eps", float), ("eps_init", float), ("eps_decay", float)),
    outputs=("y",),
    residuals=("stats", "eps_schedule"),
    plan_forward=_plan_forward,
    run_forward=_run_forward,
    # (n_iters and the eps values: for the differentiable backward, which recomputes)
    saved=(("s", Tensor), ("mask", Optional[Tensor]), ("k", Optional[Tensor]), ("stats", Tensor),
           ("eps_schedule", Tensor), ("k_value", Optional[float]), ("n_iters", int), ("eps", float),
           ("eps_init", float), ("eps_decay", float)),
    save=lambda inputs, results, needs: (inputs.s, inputs.mask, inputs.k, results.stats,
                                         results.eps_schedule, inputs.k_value, inputs.n_iters, inputs.eps,
                                         inputs.eps_init, inputs.eps_decay),
    plan_backward=_plan_backward,
    run_backward=_run_backward,
    differentiable=("s", "k"),
    # (k, one value a row, is read by one stride when 1-D; any other layout is copied first)
    row_strided=("s",),
    backward_graph=_backward_graph,
    # Rows shard along every dim of s but the last; k (one value a row) and the statistics
    # (*rows, 2, n_iters) along the same dims; the eps schedule is replicated.
    row_sharded={"s": (0, 1), "mask": (0, 1), "k": (0, 0), "y": (0, 1), "stats": (0, 2)},
))
"""Differentiable coordinate descent of a 2-D ``s`` (last stride 1):
``coor_descent(s, mask, k, k_value, n_iters, eps, eps_init, eps_decay)``, with either ``k`` (one
value a row) or ``k_value`` (one for every row) and the other None."""
