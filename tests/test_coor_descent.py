"""coor_descent: kernels vs the float64 definition, the reference vs independent definitions.

fp32 inputs are rounded to their dtype first and the float64 oracle runs on the rounded
values, so only the computation's error is measured. With eps = 0.03 the exponent is
s / 0.03, which amplifies fp32 rounding: torch's own fp32 result is ~1e-5 off, and ours
may be off by at most twice that plus 1e-5 (forward) / 1e-4 (gradients, relative).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triton_layers import functional as F
from triton_layers import reference

from .conftest import DEVICE, FUSED_N, LOW_DTYPES
from . import bad_inputs as bad
from .big_tensors import cols, randn, rows_past, sample_rows
from .fake_timer import fake_gpu_timer
from .nonfinite import INF, NAN, SILENT, VALUES, close, grads, poisoned
from .oracle import check, compare, max_abs_err, run
from .strategies import bounded, common, drawn, layouts, rows_of

ROUTER = dict(eps=0.03, eps_init=4.0, eps_decay=0.7)  # CoLT5's router settings


def _definition(s, n_iters, k, eps, eps_init, eps_decay, mask):
    """Independent float64 definition: one row at a time, masked entries dropped by indexing."""
    rows, n = s.shape
    out = torch.zeros_like(s)
    for r in range(rows):
        valid = torch.ones(n, dtype=torch.bool) if mask is None else mask[r].cpu()
        if not valid.any():
            continue
        x = s[r][valid.to(s.device)]
        logk = torch.log((k[r] if torch.is_tensor(k) else torch.tensor(float(k), dtype=s.dtype)).clamp_min(1e-20))
        a, b = torch.zeros((), dtype=s.dtype), -x
        e = max(eps if eps_init is None else eps_init, eps)
        for _ in range(n_iters):
            a = e * (logk - torch.logsumexp((x + b) / e, dim=0))
            b = -(x + a).clamp_min(0)
            e = max(e * eps_decay, eps)
        out[r, valid.to(s.device)] = torch.exp((x + a + b) / e)
    return out


def _scores(rows, n, dtype, device, scale=1.5):
    return (scale * torch.randn(rows, n, device=device)).to(dtype)


def _random_mask(rows, n, device, p=0.3):
    mask = torch.rand(rows, n, device=device) > p
    mask[:, 0] = True  # rows stay partly valid; fully masked rows have their own test
    return mask


def _check_forward(ours, s, n_iters, k, kw, mask, name=""):
    """ours vs float64 of the same (rounded) inputs; fp32 bound: 2x torch fp32's error + 1e-5."""
    k64 = k.double() if torch.is_tensor(k) else k
    exact = reference.coor_descent(s.double(), n_iters, k64, mask=mask, **kw)
    # fp16/bf16: the bar is the exact result rounded to the dtype (compare's default).
    torch32 = reference.coor_descent(s, n_iters, k, mask=mask, **kw) if s.dtype == torch.float32 else None
    compare(ours, exact, low=torch32, atol=0.0 if torch32 is not None else None, name=name)
    return exact


# --- the reference against independent definitions -------------------------------------


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (2, 127), (4, 64)])
@pytest.mark.parametrize("masked", [False, True])
def test_reference_matches_definition(rows, n, masked):
    s = _scores(rows, n, torch.float64, "cpu")
    k = torch.rand(rows, dtype=torch.float64) * n / 2 + 0.5
    mask = _random_mask(rows, n, "cpu") if masked else None
    if masked and rows > 1:
        mask[1] = False
    for n_iters in (1, 7):
        ours = reference.coor_descent(s, n_iters, k, mask=mask, **ROUTER)
        torch.testing.assert_close(ours, _definition(s, n_iters, k, mask=mask, **ROUTER), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_reference_matches_colt5(masked):
    colt5 = pytest.importorskip("colt5_attention.coor_descent")
    s = _scores(5, 300, torch.float64, "cpu")
    k = torch.rand(5, dtype=torch.float64) * 50 + 1
    mask = _random_mask(5, 300, "cpu") if masked else None
    for kk in (k, 37.5):
        ours = reference.coor_descent(s, 20, kk, mask=mask, **ROUTER)
        theirs = colt5.coor_descent(s, n_iters=20, k=kk, mask=mask, **ROUTER)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
        gs_ours, = torch.autograd.grad(reference.coor_descent(s.requires_grad_(), 20, kk, mask=mask, **ROUTER).sum(), s)
        gs_theirs, = torch.autograd.grad(colt5.coor_descent(s, n_iters=20, k=kk, mask=mask, **ROUTER).sum(), s)
        torch.testing.assert_close(gs_ours, gs_theirs, rtol=1e-8, atol=1e-10)
        s = s.detach()


# --- kernels: forward --------------------------------------------------------------------


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (2, 127), (4, 1000), (2, 3000), (5, 256), (1, 1024)])
@pytest.mark.parametrize("masked", [False, True])
def test_forward_fp32(device, rows, n, masked):
    s = _scores(rows, n, torch.float32, device)
    mask = _random_mask(rows, n, device) if masked else None
    k = max(n / 8 * 9 / 8, 1.0)
    y = F.coor_descent(s, n_iters=20, k=k, mask=mask, **ROUTER)
    assert y.dtype == s.dtype and y.shape == s.shape
    _check_forward(y, s, 20, k, ROUTER, mask, name=f"{rows}x{n}")
    if mask is not None:
        assert (y[~mask] == 0).all()


@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("rows,n", [(3, 7), (4, 1000), (2, 3000)])
def test_forward_low_precision(device, dtype, rows, n):
    s = _scores(rows, n, dtype, device)
    mask = _random_mask(rows, n, device)
    y = F.coor_descent(s, n_iters=20, k=n / 7, mask=mask, **ROUTER)
    assert y.dtype == dtype
    _check_forward(y, s, 20, n / 7, ROUTER, mask, name=str(dtype))


@pytest.mark.parametrize("n_iters", [1, 2, 5, 37])
@pytest.mark.parametrize("eps,eps_init,eps_decay", [(0.1, None, 1.0), (0.03, 4.0, 0.7), (0.5, 0.2, 0.9), (0.05, 2.0, 1.3)])
def test_forward_schedules(device, n_iters, eps, eps_init, eps_decay):
    s = _scores(3, 200, torch.float32, device)
    kw = dict(eps=eps, eps_init=eps_init, eps_decay=eps_decay)
    y = F.coor_descent(s, n_iters=n_iters, k=20.0, **kw)
    _check_forward(y, s, n_iters, 20.0, kw, None, name=f"{n_iters} {kw}")


def test_forward_matches_colt5(device):
    colt5 = pytest.importorskip("colt5_attention.coor_descent")
    s = _scores(6, 500, torch.float32, device)
    mask = _random_mask(6, 500, device)
    k = torch.rand(6, device=device) * 60 + 4
    y = F.coor_descent(s, n_iters=20, k=k, mask=mask, **ROUTER)
    theirs = colt5.coor_descent(s, n_iters=20, k=k, mask=mask, **ROUTER)
    exact = colt5.coor_descent(s.double(), n_iters=20, k=k.double(), mask=mask, **ROUTER)
    assert max_abs_err(y, exact) <= 2 * max_abs_err(theirs, exact) + 1e-5


def test_scores_sum_to_k(device):
    # Converged coordinate descent puts about k units of mass on each row.
    s = _scores(4, 512, torch.float32, device)
    k = torch.tensor([8.0, 30.0, 100.0, 256.0], device=device)
    y = F.coor_descent(s, n_iters=60, k=k, eps=0.1, eps_init=2.0, eps_decay=0.8)
    torch.testing.assert_close(y.sum(-1), k, rtol=0.02, atol=0.0)
    assert y.min() >= 0 and y.max() <= 1


# --- kernels: backward -------------------------------------------------------------------


def _fp32_atol(s, rtol):
    """1e-7; ``rtol`` on rows of one element, whose exact ds is 0 (the score is k whatever s
    is): the fp32 iterations leave ~1e-5 there on the GPU (seen on an H100)."""
    return rtol if s.shape[-1] == 1 else 1e-7


def _check_grads(s, k, mask, n_iters, kw, rtol=1e-4):
    """Output and gradients of s (and of k when a tensor) vs float64 autograd of the
    definition; fp32 within ``rtol`` (relative) + 1e-7, fp16/bf16 by the oracle's default."""
    inputs = dict(s=s.detach().requires_grad_(), k=k.detach().requires_grad_() if torch.is_tensor(k) else k)
    res = check(lambda s, k: F.coor_descent(s, n_iters=n_iters, k=k, mask=mask, **kw),
                lambda s, k: reference.coor_descent(s, n_iters, k, mask=mask, **kw), inputs,
                **(dict(rtol=rtol, atol=_fp32_atol(s, rtol)) if s.dtype == torch.float32 else {}))
    for name, g in res.grads.items():
        assert g.dtype == inputs[name].dtype, name
    if mask is not None:
        assert (res.grads["s"][~mask] == 0).all()


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (2, 127), (4, 1000), (2, 3000)])
@pytest.mark.parametrize("n_iters", [1, 2, 20])
def test_backward_fp32(device, rows, n, n_iters):
    s = _scores(rows, n, torch.float32, device)
    k = torch.rand(rows, device=device) * n / 4 + 0.5
    mask = _random_mask(rows, n, device) if n > 1 else None
    _check_grads(s, k, mask, n_iters, ROUTER)


@pytest.mark.parametrize("n_iters", [3, 20])
def test_backward_scalar_k_no_mask(device, n_iters):
    s = _scores(3, 500, torch.float32, device)
    _check_grads(s, 60.0, None, n_iters, ROUTER)
    _check_grads(s, 60.0, None, n_iters, dict(eps=0.1, eps_init=None, eps_decay=1.0))


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_backward_low_precision(device, dtype):
    s = _scores(3, 700, dtype, device)
    k = torch.rand(3, device=device, dtype=dtype) * 80 + 2
    _check_grads(s, k, _random_mask(3, 700, device), 20, ROUTER)


def test_grad_only_for_k(device):
    s = _scores(2, 100, torch.float32, device)
    k = (torch.rand(2, device=device) * 10 + 1).requires_grad_()
    F.coor_descent(s, n_iters=10, k=k, **ROUTER).sum().backward()
    k64 = k.detach().double().requires_grad_()
    reference.coor_descent(s.double(), 10, k64, mask=None, **ROUTER).sum().backward()
    torch.testing.assert_close(k.grad.double(), k64.grad, rtol=1e-4, atol=1e-6)


def test_k_below_clamp_has_zero_grad(device):
    s = _scores(2, 50, torch.float32, device)
    k = torch.tensor([1e-30, 5.0], device=device, requires_grad=True)
    y = F.coor_descent(s, n_iters=5, k=k, **ROUTER)
    y.sum().backward()
    assert k.grad[0] == 0 and k.grad[1] != 0
    assert torch.isfinite(y).all()


# --- long rows: looped forward, many chunks in the backward -------------------------------


@pytest.mark.parametrize("rows,n", [(2, 1000), (1, 3000), (3, 257)])
@pytest.mark.parametrize("looped", ["medium"], indirect=True)
def test_long_rows_looped(device, looped, rows, n):
    s = _scores(rows, n, torch.float32, device)
    mask = _random_mask(rows, n, device)
    k = torch.rand(rows, device=device) * n / 8 + 1
    y = F.coor_descent(s, n_iters=20, k=k, mask=mask, **ROUTER)
    _check_forward(y, s, 20, k, ROUTER, mask)
    _check_grads(s, k, mask, 20, ROUTER)


def test_very_long_row(device):
    # Longer than the 131,072-column cap of the seed and of colt5-attention's Triton version.
    n = 262144 + 3
    s = _scores(1, n, torch.float32, device)
    k = torch.tensor([n / 8.0], device=device)
    y = F.coor_descent(s, n_iters=3, k=k, **ROUTER)
    _check_forward(y, s, 3, k, ROUTER, None)
    _check_grads(s, k, None, 3, ROUTER)


# --- masks, shapes, layouts -------------------------------------------------------------


def test_fully_masked_rows(device):
    s = _scores(4, 300, torch.float32, device)
    mask = _random_mask(4, 300, device)
    mask[1] = False
    mask[3] = False
    k = (torch.rand(4, device=device) * 20 + 1).requires_grad_()
    s_ = s.clone().requires_grad_()
    y = F.coor_descent(s_, n_iters=20, k=k, mask=mask, **ROUTER)
    assert torch.isfinite(y).all()
    assert (y[1] == 0).all() and (y[3] == 0).all()
    y.backward(torch.randn_like(y))
    assert torch.isfinite(s_.grad).all() and torch.isfinite(k.grad).all()
    assert (s_.grad[1] == 0).all() and (s_.grad[3] == 0).all()
    assert k.grad[1] == 0 and k.grad[3] == 0
    _check_grads(s, k, mask, 20, ROUTER)


def test_leading_dims_and_k_broadcast(device):
    s = _scores(6, 90, torch.float32, device).reshape(2, 3, 90)
    k_full = torch.rand(2, 3, device=device) * 10 + 2
    for k in (k_full, k_full[:, :1], torch.tensor(7.0, device=device), 7.0):
        y = F.coor_descent(s, n_iters=10, k=k, **ROUTER)
        k_rows = k.expand(2, 3).double() if torch.is_tensor(k) else k
        exact = reference.coor_descent(s.double(), 10, k_rows, mask=None, **ROUTER)
        assert y.shape == s.shape
        assert max_abs_err(y, exact) < 1e-4
    k = torch.tensor(7.0, device=device, requires_grad=True)
    F.coor_descent(s, n_iters=10, k=k, **ROUTER).sum().backward()
    k64 = torch.tensor(7.0, dtype=torch.float64, device=device, requires_grad=True)
    reference.coor_descent(s.double(), 10, k64.expand(2, 3), mask=None, **ROUTER).sum().backward()
    torch.testing.assert_close(k.grad.double(), k64.grad, rtol=1e-4, atol=1e-6)


def test_non_contiguous(device):
    base = _scores(4, 600, torch.float32, device)
    s_view = base[:, 100:400]  # last stride 1, row stride 600: no copy
    s_t = _scores(300, 4, torch.float32, device).t()  # last stride 4: copied
    mask_t = _random_mask(300, 4, device).t()
    for s, mask in ((s_view, None), (s_t, mask_t), (s_view, mask_t)):
        assert not s.is_contiguous()
        y = F.coor_descent(s, n_iters=20, k=30.0, mask=mask, **ROUTER)
        _check_forward(y, s.contiguous(), 20, 30.0, ROUTER, None if mask is None else mask.contiguous())
        _check_grads(s, 30.0, mask, 20, ROUTER)
    # A non-contiguous gradient of the output.
    s = s_view.detach().requires_grad_()
    dy = torch.randn(300, 4, device=device).t()
    F.coor_descent(s, n_iters=5, k=30.0).backward(dy)
    s2 = s_view.detach().requires_grad_()
    F.coor_descent(s2, n_iters=5, k=30.0).backward(dy.contiguous())
    assert torch.equal(s.grad, s2.grad)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4)])
def test_empty(device, shape):
    s = torch.randn(shape, device=device).requires_grad_()
    y = F.coor_descent(s, n_iters=3, k=2.0)
    assert y.shape == s.shape
    y.sum().backward()
    assert s.grad.shape == s.shape


def test_reference_path_matches_kernels(device):
    s = _scores(3, 400, torch.float32, device)
    mask = _random_mask(3, 400, device)
    y_k = F.coor_descent(s, n_iters=20, k=40.0, mask=mask, use_triton=True, **ROUTER)
    y_r = F.coor_descent(s, n_iters=20, k=40.0, mask=mask, use_triton=False, **ROUTER)
    torch.testing.assert_close(y_k, y_r, rtol=0, atol=1e-4)


def test_bitwise_reproducible(device):
    s = _scores(3, 1000, torch.float32, device)
    k = torch.rand(3, device=device) * 100 + 1
    dy = torch.randn_like(s)
    fn = lambda s, k: F.coor_descent(s, n_iters=20, k=k, **ROUTER)  # noqa: E731
    (y1, g1, _), (y2, g2, _) = (run(fn, dict(s=s.clone().requires_grad_(), k=k.clone().requires_grad_()), dy)
                                for _ in range(2))
    assert torch.equal(y1, y2) and torch.equal(g1["s"], g2["s"]) and torch.equal(g1["k"], g2["k"])


def test_autocast(device):
    x = torch.randn(2, 64, 32, device=device)
    w = torch.randn(32, 1, device=device)
    dtype = torch.bfloat16
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        s = (x @ w).squeeze(-1)
        y = F.coor_descent(s, n_iters=20, k=8.0, **ROUTER)
    assert s.dtype == dtype and y.dtype == dtype
    exact = reference.coor_descent(s.double(), 20, 8.0, mask=None, **ROUTER)
    compare(y, exact)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernels compile only on the GPU (docs/ARCHITECTURE.md)")
def test_compile_fullgraph(device):
    s = _scores(4, 2000, torch.float32, device).requires_grad_()
    k = (torch.rand(4, device=device) * 100 + 1).requires_grad_()
    fn = torch.compile(lambda a, b: F.coor_descent(a, n_iters=20, k=b, **ROUTER), fullgraph=True)
    y = fn(s, k)
    ds, dk = torch.autograd.grad(y.square().sum(), (s, k))
    y0 = F.coor_descent(s, n_iters=20, k=k, **ROUTER)
    ds0, dk0 = torch.autograd.grad(y0.square().sum(), (s, k))
    torch.testing.assert_close((y, ds, dk), (y0, ds0, dk0), rtol=1e-5, atol=1e-6)


def test_compile_reference_path():
    s = torch.randn(3, 50)
    fn = torch.compile(lambda a: F.coor_descent(a, n_iters=4, k=5.0, use_triton=False), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(fn(s), reference.coor_descent(s, 4, 5.0, 0.1, None, 1.0, None))


# --- bad inputs ---------------------------------------------------------------------------


def test_bad_inputs(device):
    s = torch.randn(3, 10, device=device)
    ok = dict(n_iters=3, k=2.0)
    with pytest.raises(TypeError, match="s must be a torch.Tensor"):
        F.coor_descent([[1.0]], **ok)
    with pytest.raises(TypeError, match="dtype torch.int64"):
        F.coor_descent(torch.ones(3, 10, dtype=torch.long, device=device), **ok)
    with pytest.raises(ValueError, match="at least one dim"):
        F.coor_descent(torch.tensor(1.0, device=device), **ok)
    # (the wrong kind of value: TypeError; a wrong value: ValueError; as the router's checks)
    for n_iters, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match="n_iters"):
            F.coor_descent(s, n_iters=n_iters, k=2.0)
    for k, error in ((0, ValueError), (-1.0, ValueError), (math.inf, ValueError), (math.nan, ValueError),
                     (True, TypeError), ("3", TypeError)):
        with pytest.raises(error, match="k must be"):
            F.coor_descent(s, n_iters=3, k=k)
    with pytest.raises(ValueError, match=r"k of shape \(4,\)"):
        F.coor_descent(s, n_iters=3, k=torch.ones(4, device=device))
    with pytest.raises(TypeError, match="k has dtype"):
        F.coor_descent(s, n_iters=3, k=torch.ones(3, dtype=torch.long, device=device))
    for name in ("eps", "eps_init", "eps_decay"):
        with pytest.raises(ValueError, match=name):
            F.coor_descent(s, **ok, **{name: 0.0})
    with pytest.raises(TypeError, match="mask has dtype"):
        F.coor_descent(s, **ok, mask=torch.ones(3, 10, device=device))
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 10\)"):
        F.coor_descent(s, **ok, mask=torch.ones(3, 9, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="one device"):
        F.coor_descent(s, n_iters=3, k=torch.ones(3, device="meta"))
    with pytest.raises(TypeError):
        F.coor_descent(s, 3, 2.0)  # keyword-only, as colt5-attention's


def test_use_triton_true_without_interpreter_raises(monkeypatch):
    from triton_layers import _checks

    monkeypatch.setattr(_checks, "TRITON_INTERPRET", False)
    with pytest.raises(ValueError, match="use_triton=True"):
        F.coor_descent(torch.randn(2, 5), n_iters=2, k=1.0, use_triton=True)


# --- k above the row length ----------------------------------------------------------------


@pytest.mark.parametrize("op", ["functional", "reference"])
def test_k_above_row_length_is_refused(device, op):
    """Every score is at most 1, so a row of n entries cannot hold k > n units of mass: the
    result was rows summing to some value under n, not k. A number k > n is a ValueError
    naming both (k == n, every entry chosen, is the router's min(k, n) and still allowed)."""
    s = torch.randn(3, 16, device=device)
    call = ((lambda k: F.coor_descent(s, n_iters=5, k=k, **ROUTER)) if op == "functional" else
            (lambda k: reference.coor_descent(s, 5, k, mask=None, **ROUTER)))
    with pytest.raises(ValueError, match=r"k=20\.0 is more than the 16 entries of each row of s \(shape \(3, 16\)\)"):
        call(20.0)
    with pytest.raises(ValueError, match=r"k=17 is more than the 16 entries"):
        call(17)
    assert call(16.0).shape == (3, 16)
    # A row with no entries has nothing to score: its (empty) result, whatever k.
    assert F.coor_descent(torch.randn(3, 0, device=device), n_iters=3, k=2.0).shape == (3, 0)


def test_k_tensor_above_row_length_is_not_checked(device):
    """A tensor k is not compared with n: that would read its values on the host (a sync
    on every call). Rows whose k exceeds n get scores in [0, 1] summing to at most n."""
    s = torch.randn(2, 16, device=device)
    y = F.coor_descent(s, n_iters=20, k=torch.tensor([20.0, 4.0], device=device), **ROUTER)
    assert y.min() >= 0 and y.max() <= 1 and (y.sum(-1) <= 16 + 1e-3).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_coor_descent_tuning_times_each_config_on_cpu(monkeypatch, capsys):
    """tune_coor_descent with the timer patched out: each combination of both grids runs our
    forward (or forward + backward) under its knobs (a spy sees the warps each launch got)."""
    from benchmarks.dev import tune_coor_descent
    from triton_layers import launch_config

    from triton_layers.kernels import _common

    runs = fake_gpu_timer(monkeypatch)
    warps = []
    warps_for = _common.warps_for

    def spy(block, elems_per_thread, max_warps=32):
        warps.append((block, elems_per_thread, max_warps))
        return warps_for(block, elems_per_thread, max_warps)
    monkeypatch.setattr(_common, "warps_for", spy)
    monkeypatch.setattr(tune_coor_descent, "FWD_GRID", {"fwd_elems_per_thread": [1, 8], "fwd_max_warps": [16, 32]})
    monkeypatch.setattr(tune_coor_descent, "BWD_GRID", {"bwd_elems_per_thread": [2], "split_programs_per_sm": [1, 4]})
    tune_coor_descent.main(["--shapes", "3x40"])
    assert len(runs) == 4 + 2
    assert {(64, 1, 16), (64, 1, 32), (64, 8, 16), (64, 8, 32)} <= set(warps)
    assert "fwd default 1.0 us" in capsys.readouterr().out
    assert launch_config.current() is launch_config.DEFAULT


# ------------------------------------------------ past 2**31 elements (tests/big_tensors.py; GPU: run alone)


@pytest.mark.parametrize("n_cols", [cols(8192), cols(32768)], ids=["in-registers", "chunked"])
def test_coor_descent_past_2_31(gpu_memory, n_cols):
    gpu_memory(24)  # s, y, dy, ds (bf16) and the mask: about 19 GiB
    n_rows = rows_past(n_cols)
    s = randn((n_rows, n_cols)).requires_grad_()
    mask = randn((n_rows, n_cols), seed=6) > -1.5  # ~93% valid (drawn in bf16: half the memory of fp32)
    k = (torch.rand(n_rows, device=DEVICE) * n_cols / 8 + 1).requires_grad_()
    kw = dict(n_iters=3, eps=0.03, eps_init=4.0, eps_decay=0.7)
    y = F.coor_descent(s, k=k, mask=mask, **kw)
    dy = randn((n_rows, n_cols), seed=7)
    y.backward(dy)
    rows = sample_rows(n_rows, n_cols)
    ss = s.detach()[rows].float().requires_grad_()
    ks = k.detach()[rows].requires_grad_()
    y32 = reference.coor_descent(ss, k=ks, mask=mask[rows], **kw)
    ds32, dk32 = torch.autograd.grad(y32, [ss, ks], dy[rows].float())
    # fp32 reference of the same rows: the kernels compute in fp32 too (bf16 only at the ends).
    torch.testing.assert_close(y.detach()[rows].float(), y32, rtol=0, atol=1e-2)
    torch.testing.assert_close(s.grad[rows].float(), ds32, rtol=2e-2, atol=2e-2 * ds32.abs().max().item())
    torch.testing.assert_close(k.grad[rows], dk32, rtol=1e-3, atol=1e-3 * dk32.abs().max().item())


# ------------------------------------------------ NaN and inf (its section of docs/API.md; helpers: nonfinite.py)

def cd(s, k, mask, use_triton):
    return F.coor_descent(s, n_iters=6, k=k, mask=mask, use_triton=use_triton)


@SILENT
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("masked", [False, True])
def test_nonfinite_as_the_definition(device, n_cols, value, masked):
    s = poisoned(5, n_cols, value, device)
    k = torch.rand(5, device=device) * 5 + 1
    mask = None
    if masked:
        mask = torch.rand(5, n_cols, device=device) > 0.3
        mask[1, 0] = True
        mask[-1, -1] = True
        mask[2, 4] = False
        s[2, 4] = value  # masked: never used
    (y, ds, dk), dy = grads(lambda s, k: cd(s, k, mask, True), s, k)
    (y_t, ds_t, dk_t), _ = grads(lambda s, k: cd(s, k, mask, False), s, k, dy=dy)  # the torch definition
    close(y, y_t, "y", atol=1e-4)
    close(ds, ds_t, "ds", rtol=1e-3, atol=1e-4)
    close(dk, dk_t, "dk", rtol=1e-3, atol=1e-4)
    assert torch.isnan(y[1]).all() == (mask is None) and torch.isfinite(y[[0, 2, 3]]).all()
    assert torch.isnan(y[1][mask[1]]).all() if mask is not None else True


@SILENT
@pytest.mark.parametrize("value", [NAN, INF])
def test_nonfinite_k(device, value):
    s = torch.randn(3, FUSED_N, device=device)
    k = torch.tensor([2.0, value, 4.0], device=device)
    (y, ds, dk), dy = grads(lambda s, k: cd(s, k, None, True), s, k)
    (y_t, ds_t, dk_t), _ = grads(lambda s, k: cd(s, k, None, False), s, k, dy=dy)
    close(y, y_t, "y", atol=1e-4)
    close(ds, ds_t, "ds", rtol=1e-3, atol=1e-4)
    close(dk, dk_t, "dk", rtol=1e-3, atol=1e-4)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


# ------------------------------------------------ properties (hypothesis; strategies: strategies.py)

@pytest.mark.parametrize("looped", ["fused", "tiny"], ids=["fused", "looped"], indirect=True)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@bounded(7)
@given(c=common(max_dims=3, max_n=60), data=st.data())
def test_properties(looped, masked, c, data):
    shape, dtype = c["shape"], c["dtype"]
    lead, n = shape[:-1], shape[-1]
    layout = data.draw(layouts(len(shape)), "layout")
    n_iters = data.draw(st.integers(1, 6), "n_iters")
    eps = data.draw(st.sampled_from([0.05, 0.1, 0.3]), "eps")
    eps_init = data.draw(st.sampled_from([None, 1.0, 4.0]), "eps_init")
    eps_decay = data.draw(st.sampled_from([0.7, 1.0]), "eps_decay")
    k_kind = data.draw(st.sampled_from(["number", "per-row", "broadcast"]), "k")
    x = drawn(shape, dtype, layout, min(c["scale"], 2.0), c["shift"], c["gen"])
    if k_kind == "number":
        k = data.draw(st.floats(0.5, float(n)), "k value")
    else:
        k_shape = lead if k_kind == "per-row" else (1,) * len(lead)
        k = (torch.rand(k_shape, generator=c["gen"]) * n + 0.5).to(DEVICE).requires_grad_()
    mask = None
    if masked:
        mask = torch.rand(shape, generator=c["gen"]) > data.draw(st.sampled_from([0.2, 0.7]), "p")
        if data.draw(st.booleans(), "a fully masked row"):
            mask.reshape(-1, n)[0] = False
        mask = mask.to(DEVICE)
    kw = dict(n_iters=n_iters, eps=eps, eps_init=eps_init, eps_decay=eps_decay, mask=mask)
    dy = torch.randn(shape, generator=c["gen"]).to(dtype).to(DEVICE)

    # exp(s / eps) amplifies fp32 rounding by |s| / eps (test_coor_descent.py): looser bounds.
    res = check(lambda s, k: F.coor_descent(s, k=k, use_triton=True, **kw),
                lambda s, k: F.coor_descent(s, k=k, use_triton=False, **kw),  # float64: the reference
                dict(s=x, k=k), dy=dy, rtol=dict(y=1e-4, s=1e-3, k=1e-3), summed=dict(k=rows_of(shape)))
    assert res.y.dtype == dtype and res.y.shape == shape
    if mask is not None:
        assert (res.y[~mask] == 0).all()
    if "k" in res.grads:
        assert res.grads["k"].dtype == k.dtype


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

def _k_tensor_nonpositive():
    k = torch.tensor([0.0, -2.0, 3.0], device=DEVICE)
    return F.coor_descent(bad.x_(3, 10), n_iters=5, k=k)


def _check_k_nonpositive(y):
    # log k of k clamped to 1e-20: those rows' scores sum to ~1e-20; the last row's to about 3.
    assert y[:2].sum() < 1e-6 and y[2].sum() > 1


def _check_k_tensor_above_n(y):
    # Scores in [0, 1]: the row asking for 6 of 5 entries sums to at most 5.
    assert 0 <= y.min() and y.max() <= 1 and (y.sum(-1) <= 5 + 1e-3).all()


def cd_(**kw):
    """coor_descent of a (2, 5) s with n_iters=3, k=2.0 unless ``kw`` says otherwise."""
    return F.coor_descent(bad.x_(2, 5), **{"n_iters": 3, "k": 2.0, **kw})


x_, mask_, OTHER = bad.x_, bad.mask_, bad.OTHER
BAD_INPUTS = [
    bad.Case("cd-dtype-int", lambda: F.coor_descent(torch.ones(2, 5, dtype=torch.int64, device=DEVICE), n_iters=3, k=2.0),
         (TypeError, r"s has dtype torch.int64")),
    bad.Case("cd-0dim", lambda: F.coor_descent(torch.tensor(1.0, device=DEVICE), n_iters=3, k=2.0),
         (ValueError, r"s must have at least one dim")),
    bad.Case("cd-n-iters-0", lambda: cd_(n_iters=0), (ValueError, r"n_iters must be an int >= 1, got 0")),
    bad.Case("cd-n-iters-float", lambda: cd_(n_iters=2.0), (TypeError, r"n_iters must be an int, got 2.0 \(float\)")),
    bad.Case("cd-k-0", lambda: cd_(k=0), (ValueError, r"k must be positive, got 0")),
    bad.Case("cd-k-negative", lambda: cd_(k=-1.0), (ValueError, r"k must be positive")),
    bad.Case("cd-k-inf", lambda: cd_(k=float("inf")), (ValueError, r"k must be finite")),
    bad.Case("cd-k-tensor-shape", lambda: cd_(k=torch.ones(2, 1, device=DEVICE)),
         (ValueError, r"k of shape \(2, 1\) must broadcast to s's leading dims \(2,\)")),
    bad.Case("cd-k-tensor-dtype", lambda: cd_(k=torch.ones(2, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"k has dtype torch.int64")),
    bad.Case("cd-k-tensor-nonpositive", _k_tensor_nonpositive, _check_k_nonpositive),
    bad.Case("cd-k-above-n", lambda: cd_(k=6.0),
         (ValueError, r"k=6.0 is more than the 5 entries of each row of s \(shape \(2, 5\)\).*pass k <= 5")),
    bad.Case("cd-k-tensor-above-n", lambda: cd_(k=torch.tensor([6.0, 2.0], device=DEVICE), n_iters=20),
         _check_k_tensor_above_n),
    bad.Case("cd-eps-0", lambda: cd_(eps=0.0), (ValueError, r"eps must be positive")),
    bad.Case("cd-mask-dtype", lambda: cd_(mask=torch.ones(2, 5, device=DEVICE)),
         (TypeError, r"mask has dtype torch.float32; expected one of torch.bool")),
    bad.Case("cd-mask-shape", lambda: cd_(mask=mask_(5)), (ValueError, r"mask must have shape \(2, 5\), got \(5,\)")),
    bad.Case("cd-mixed-devices", lambda: cd_(mask=mask_(2, 5, device=OTHER)),
         (ValueError, rf"one device; got s on {DEVICE}.*, mask on {OTHER}")),
    bad.Case("cd-wrong-device", lambda: F.coor_descent(x_(2, 5, device="meta"), n_iters=3, k=2.0, use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor")),
    bad.Case("cd-empty", lambda: bad.with_x(lambda s: F.coor_descent(s, n_iters=3, k=2.0), x_(0, 5)), bad.empty_result((0, 5))),
    bad.Case("cd-noncontiguous", *bad.same_as_contiguous(lambda x: F.coor_descent(x, n_iters=5, k=3.0), 10, 4)),
]
test_bad_input = bad.tests_of(BAD_INPUTS)
