"""Determinism of every op, tensors past 2**31 elements (GPU), the sanitizer driver.

Determinism: the same inputs give bitwise-identical outputs and gradients from run to
run. On the GPU at shapes that use many programs and the partial-sum reductions
(weight gradients, split columns, chunked rows); on the CPU (interpreter) at small shapes.

Past 2**31 elements: each op on a bf16 tensor with more than 2**31 elements (e.g.
65600 x 32768), forward and backward, checked against the reference on a sample of rows
(the first and last, those around element 2**31, and random ones) and, for the weight
gradients, against sums over all rows computed in chunks. An int32 offset anywhere
would wrap past row 2**31 // N and show up there (or crash). On the GPU, skipped without
enough free memory. On the CPU the same tests run in miniature (past 2**11 elements,
fp16, rows 512x shorter, the row limits shrunk so the same kernel paths run): that
keeps the checking code itself tested where CI runs.

Last, scripts/sanitize.py (the compute-sanitizer driver) must pass: in full on the GPU,
with its tiny limits on the CPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_layers import functional as F
from triton_layers import reference

from triton_layers import launch_config

from .conftest import DEVICE, looped_config
from .oracle import compare, run

CUDA = torch.cuda.is_available()
GIB = 2**30
# The real sizes on the GPU; a miniature of them on the CPU (see the module docstring).
BIG = 2**31 if CUDA else 2**11
DTYPE = torch.bfloat16 if CUDA else torch.float16  # (the interpreter truncates to bf16)
# Float64 checks over all rows go a chunk at a time: at most CHUNK elements (2 GiB), rows
# cut into COL_CHUNK columns.
CHUNK, COL_CHUNK = (2**28, 2**26) if CUDA else (2**10, 1000)


def cols(n: int) -> int:
    """A row length of the real test, or its miniature (same kernel path under MINI_LIMITS)."""
    return n if CUDA else n // 512


MINI_LIMITS = dataclasses.replace(launch_config.shrunk(16, 16), softmax=launch_config.shrunk(64, 16, 128).softmax)


def _run(fn, inputs):
    """fn(*inputs) and the gradients of the inputs that require one, for a fixed dy."""
    torch.manual_seed(1)  # the same dy every time
    y, grads, _ = run(fn, {i: t.detach().clone().requires_grad_(t.requires_grad) for i, t in enumerate(inputs)})
    return [y, *grads.values()]


def _r(*shape, dtype=torch.float32, grad=True, scale=1.0, offset=0.0):
    return (torch.randn(shape, device=DEVICE) * scale + offset).to(dtype).requires_grad_(grad)


DETERMINISM = ["layer_norm", "layer_norm-long-stable", "rms_norm-residual", "rms_norm-residual-long",
               "softmax-causal-padding", "softmax-long",
               "weighted_sum", "weighted_sum-split", "coor_descent", "coor_descent-long"]


def _determinism_case(name: str):
    """(fn, inputs, small_limits): GPU shapes fill the device; CPU shapes stay tiny, with
    the row limits shrunk for the "-long" cases so they take the chunked paths."""
    big = DEVICE == "cuda"
    bf = torch.bfloat16

    def pick(gpu, cpu):
        return gpu if big else cpu

    if name.startswith("layer_norm"):
        long = name != "layer_norm"
        rows, n = pick((257, 20000), (9, 100)) if long else pick((4099, 1000), (37, 50))
        inputs = [_r(rows, n, dtype=torch.float32 if long else bf), _r(n), _r(n)]
        return (lambda x, w, b: F.layer_norm(x, w, b, stable=long)), inputs, long and not big
    if name.startswith("rms_norm-residual"):
        # bf16 x on an fp32 residual stream: dx and dresidual written apart; y and h summed
        # into one output so that gradients flow back through both.
        long = name.endswith("-long")
        rows, n = pick((257, 20000), (9, 100)) if long else pick((4099, 1000), (37, 50))

        def fn(x, r, w):
            y, h = F.rms_norm(x, w, residual=r)
            return y.float() + h
        return fn, [_r(rows, n, dtype=bf), _r(rows, n), _r(n)], long and not big
    if name == "softmax-causal-padding":
        shape = pick((8, 4, 257, 1000), (2, 3, 9, 40))
        pad = torch.rand(shape[0], shape[-1], device=DEVICE) < 0.3
        fn = lambda x: F.softmax(x, causal=True, scale=0.3, key_padding_mask=pad)  # noqa: E731
        return fn, [_r(*shape, dtype=torch.float16)], False
    if name == "softmax-long":
        return (lambda x: F.softmax(x, causal=True)), [_r(*pick((3, 5, 40000), (2, 3, 100)), dtype=bf)], not big
    if name.startswith("weighted_sum"):
        rows, n = pick((100003, 64), (203, 16)) if name == "weighted_sum" else pick((7, 100000), (3, 5000))
        return (lambda x, w, b: F.weighted_sum(x, w, b)), [_r(rows, n, dtype=bf), _r(n), _r()], False
    if name == "coor_descent":
        shape = pick((64, 5000), (6, 40))
        mask = torch.rand(shape, device=DEVICE) > 0.3
        k = (torch.rand(shape[0], device=DEVICE) * 50 + 1).requires_grad_()
        fn = lambda s, k: F.coor_descent(s, n_iters=20, k=k, eps=0.03, eps_init=4.0, eps_decay=0.7, mask=mask)  # noqa
        return fn, [_r(*shape), k], False
    assert name == "coor_descent-long"
    return (lambda s: F.coor_descent(s, n_iters=10, k=100.0)), [_r(*pick((4, 20000), (3, 100)), dtype=bf)], not big


@pytest.mark.parametrize("name", DETERMINISM)
def test_bitwise_deterministic(name):
    torch.manual_seed(0)
    fn, inputs, small = _determinism_case(name)
    with looped_config("small" if small else "fused"):
        first = _run(fn, inputs)
        second = _run(fn, inputs)
    assert len(first) == len(second) >= 2, name
    for i, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), f"{name}: output {i} differs between two runs"


# --- past 2**31 elements ----------------------------------------------------------------


@pytest.fixture
def gpu_memory():
    """``need(gib)`` skips unless the GPU has that much free (a no-op for the CPU
    miniature, which also shrinks the row limits); frees everything afterwards."""
    def need(gib: float) -> None:
        if not CUDA:
            return
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0] / GIB
        if free < gib:
            pytest.skip(f"needs {gib:.0f} GiB of free GPU memory, {free:.0f} GiB free")

    with contextlib.nullcontext() if CUDA else launch_config.use_config(MINI_LIMITS):
        yield need
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def sample_rows(n_rows: int, n_cols: int, count: int = 8) -> torch.Tensor:
    """The first and last rows, the rows around element 2**31, and ``count`` random rows."""
    edge = BIG // n_cols
    picked = {0, 1, edge - 1, edge, edge + 1, n_rows - 2, n_rows - 1}
    gen = torch.Generator().manual_seed(0)
    picked |= set(torch.randint(0, n_rows, (count,), generator=gen).tolist())
    return torch.tensor(sorted(r for r in picked if 0 <= r < n_rows), device=DEVICE)


def _randn(shape, dtype=DTYPE, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=DEVICE, dtype=dtype)


def _rows_past(n_cols: int, extra: int = 64) -> int:
    """Rows so that the tensor holds more than BIG elements (``extra`` rows past it; 3 in miniature)."""
    return BIG // n_cols + (extra if CUDA else min(extra, 3))


@pytest.mark.parametrize("n_cols", [cols(4096), cols(65536)], ids=["in-registers", "chunked"])
def test_layer_norm_past_2_31(gpu_memory, n_cols):
    gpu_memory(28)  # x, y, dy, dx: 4 x 4 GiB in bf16, plus the float64 checks
    n_rows = _rows_past(n_cols)
    x = _randn((n_rows, n_cols)).requires_grad_()
    w = (1 + 0.5 * _randn(n_cols, torch.float32, 1)).requires_grad_()
    b = (0.5 * _randn(n_cols, torch.float32, 2)).requires_grad_()
    y = F.layer_norm(x, w, b)
    dy = _randn((n_rows, n_cols), seed=3)
    y.backward(dy)
    rows = sample_rows(n_rows, n_cols)
    xs = x.detach()[rows].double().requires_grad_()
    ws, bs = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    y64 = reference.layer_norm(xs, ws, bs, 1e-5, False)
    (dx64,) = torch.autograd.grad(y64, xs, dy[rows].double())
    compare(y.detach()[rows], y64, name="y")
    compare(x.grad[rows], dx64, name="dx")
    del y, x.grad
    # Weight and bias gradients: sums over all rows, in float64, a chunk of rows at a time.
    dw64 = torch.zeros(n_cols, dtype=torch.float64, device=DEVICE)
    db64 = torch.zeros_like(dw64)
    step = CHUNK // n_cols
    for start in range(0, n_rows, step):
        xc = x.detach()[start:start + step].double()
        xhat = (xc - xc.mean(-1, keepdim=True)) * torch.rsqrt(xc.var(-1, unbiased=False, keepdim=True) + 1e-5)
        dyc = dy[start:start + step].double()
        dw64 += (dyc * xhat).sum(0)
        db64 += dyc.sum(0)
    compare(w.grad, dw64, rows=n_rows, name="dweight")
    compare(b.grad, db64, rows=n_rows, name="dbias")


@pytest.mark.parametrize("n_cols", [cols(4096), cols(65536)], ids=["in-registers", "chunked"])
def test_rms_norm_residual_past_2_31(gpu_memory, n_cols):
    """The fused residual: x (bf16) and an fp32 residual stream past 2**31 elements, y and h,
    and the gradients of both (h's own included: dx and dresidual are written apart)."""
    gpu_memory(64)  # x, y, dy, dx: 4 x 4 GiB in bf16; residual, h, dh, dresidual: 4 x 8 GiB
    n_rows = _rows_past(n_cols)
    x = _randn((n_rows, n_cols)).requires_grad_()
    r = _randn((n_rows, n_cols), torch.float32, 1).requires_grad_()
    w = (1 + 0.5 * _randn(n_cols, torch.float32, 2)).requires_grad_()
    y, h = F.rms_norm(x, w, 1e-6, residual=r)
    dy, dh = _randn((n_rows, n_cols), seed=3), _randn((n_rows, n_cols), torch.float32, 4)
    torch.autograd.backward((y, h), (dy, dh))
    rows = sample_rows(n_rows, n_cols)
    hs = (x.detach()[rows].float() + r.detach()[rows]).double().requires_grad_()
    assert torch.equal(h.detach()[rows], hs.detach().float())
    ws = w.detach().double()
    y64 = reference.rms_norm(hs, ws, 1e-6)
    (dh64,) = torch.autograd.grad((y64, hs), hs, (dy[rows].double(), dh[rows].double()))
    compare(y.detach()[rows], y64, name="y")  # bf16: against the exact value rounded (the oracle's default)
    compare(x.grad[rows], dh64, name="dx")
    compare(r.grad[rows], dh64, name="dresidual")
    del y, x.grad, r.grad, dh
    # The weight gradient: a sum over all rows, in float64, a chunk of rows at a time.
    dw64 = torch.zeros(n_cols, dtype=torch.float64, device=DEVICE)
    step = CHUNK // n_cols
    for start in range(0, n_rows, step):
        hc = h.detach()[start:start + step].double()
        dw64 += (dy[start:start + step].double() * hc * torch.rsqrt(hc.square().mean(-1, keepdim=True) + 1e-6)).sum(0)
    compare(w.grad, dw64, rows=n_rows, name="dweight")


def _softmax_rows_reference(x_rows, dy_rows, row_ids, n_q, causal, scale, pad_rows):
    """Float64 softmax and dx of selected rows: each row as a (1, 1, Nk) problem whose
    padding mask is the row's hidden keys (causal) and padded keys."""
    n_k = x_rows.shape[-1]
    keys = torch.arange(n_k, device=x_rows.device)
    hidden = torch.zeros(x_rows.shape, dtype=torch.bool, device=x_rows.device)
    if causal:
        hidden = keys[None, :] > (row_ids % n_q)[:, None] + (n_k - n_q)
    if pad_rows is not None:
        hidden = hidden | pad_rows
    xs = x_rows.double().requires_grad_()
    y = torch.stack([reference.softmax(xs[i][None, None], False, scale, hidden[i][None])[0, 0]
                     for i in range(len(row_ids))])
    (dx,) = torch.autograd.grad(y, xs, dy_rows.double())
    return y, dx


@pytest.mark.parametrize("shape,causal,padded", [
    ((_rows_past(cols(32768)), cols(32768)), False, False),  # rows in registers
    ((2, _rows_past(cols(32768)) // 2, cols(32768)), True, True),  # causal + padding; Nq > Nk: top rows see no key
    ((_rows_past(cols(131072), 4), cols(131072)), False, False),  # chunked rows
], ids=["plain", "causal-padding", "chunked"])
def test_softmax_past_2_31(gpu_memory, shape, causal, padded):
    gpu_memory(24)
    n_k = shape[-1]
    x = (3 * _randn(shape)).requires_grad_()
    pad = None
    if padded:
        pad = _randn((shape[0], n_k), torch.float32, 4) > 1.0  # ~16% padding
        pad[:, 0] = False
    y = F.softmax(x, causal=causal, scale=0.5, key_padding_mask=pad)
    dy = _randn(shape, seed=5)
    y.backward(dy)
    n_rows = math.prod(shape[:-1])
    rows = sample_rows(n_rows, n_k)
    flat = lambda t: t.reshape(n_rows, n_k)  # noqa: E731
    n_q = shape[-2] if len(shape) == 3 else 1
    pad_rows = None if pad is None else pad[rows // n_q]
    y64, dx64 = _softmax_rows_reference(flat(x.detach())[rows], flat(dy)[rows], rows, n_q, causal, 0.5, pad_rows)
    compare(flat(y.detach())[rows], y64, name="y")
    compare(flat(x.grad)[rows], dx64, name="dx")


@pytest.mark.parametrize("shape", [(_rows_past(cols(32768)), cols(32768)), (2, BIG // 2 + 3)],
                         ids=["many-rows", "two-long-rows"])
def test_weighted_sum_past_2_31(gpu_memory, shape):
    gpu_memory(16)  # x, dx: 2 x 4 GiB in bf16, plus the checks
    n_rows, n_cols = shape
    x = _randn(shape).requires_grad_()
    w = _randn(n_cols, torch.float32, 1).requires_grad_()
    b = torch.tensor(0.25, device=DEVICE, requires_grad=True)
    y = F.weighted_sum(x, w, b)
    dy = _randn(n_rows, seed=2)
    y.backward(dy)
    rows = sample_rows(n_rows, n_cols, count=4 if n_rows > 2 else 0)
    # Float64 references, a chunk at a time (a chunk of rows, or of columns of long rows).
    y64 = torch.zeros(len(rows), dtype=torch.float64, device=DEVICE)
    dw64 = torch.zeros(n_cols, dtype=torch.float64, device=DEVICE)
    step = max(1, CHUNK // n_cols)
    for start in range(0, n_rows, step):
        dw_rows = dy[start:start + step].double()
        for c in range(0, n_cols, COL_CHUNK):
            xc = x.detach()[start:start + step, c:c + COL_CHUNK].double()
            dw64[c:c + COL_CHUNK] += dw_rows @ xc
    for c in range(0, n_cols, COL_CHUNK):
        y64 += x.detach()[rows, c:c + COL_CHUNK].double() @ w.detach()[c:c + COL_CHUNK].double()
    y64 += 0.25
    compare(y.detach()[rows], y64, name="y")
    for c in range(0, n_cols, COL_CHUNK):  # a chunk at a time: all of dx in float64 would need 16 GiB
        dx64 = dy[rows].double()[:, None] * w.detach()[c:c + COL_CHUNK].double()[None, :]
        compare(x.grad[rows, c:c + COL_CHUNK], dx64, name=f"dx[:, {c}:]")
    compare(w.grad, dw64, rows=n_rows, name="dweight")
    torch.testing.assert_close(b.grad.double(), dy.double().sum(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("n_cols", [cols(8192), cols(32768)], ids=["in-registers", "chunked"])
def test_coor_descent_past_2_31(gpu_memory, n_cols):
    gpu_memory(24)  # s, y, dy, ds (bf16) and the mask: about 19 GiB
    n_rows = _rows_past(n_cols)
    s = _randn((n_rows, n_cols)).requires_grad_()
    mask = _randn((n_rows, n_cols), seed=6) > -1.5  # ~93% valid (drawn in bf16: half the memory of fp32)
    k = (torch.rand(n_rows, device=DEVICE) * n_cols / 8 + 1).requires_grad_()
    kw = dict(n_iters=3, eps=0.03, eps_init=4.0, eps_decay=0.7)
    y = F.coor_descent(s, k=k, mask=mask, **kw)
    dy = _randn((n_rows, n_cols), seed=7)
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


# --- the compute-sanitizer driver -----------------------------------------------------


def test_sanitize_driver_passes():
    """scripts/sanitize.py (what scripts/sanitize.sh runs under compute-sanitizer) runs
    every case and agrees with the reference: on the CPU with its tiny limits, every third
    case (all 96 take ~35 s of CI's ~6 minutes; each kernel op's cases still run, and every
    kernel op must have some: the bench files declare them)."""
    from triton_layers.kernels import ops

    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, str(root / "scripts" / "sanitize.py")] + ([] if CUDA else ["--tiny", "--every", "3"])
    env = dict(os.environ, **({} if CUDA else {"TRITON_INTERPRET": "1"}))
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " 0 failed" in done.stdout.splitlines()[-1]
    ran = {line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("ok ")}
    assert set(ops.__all__) <= ran, f"kernel ops without a sanitize case that ran: {sorted(set(ops.__all__) - ran)}"
