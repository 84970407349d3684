"""Property-based tests (hypothesis): every op, random shapes, dtypes, layouts and options.

Each example draws a shape (sizes 1 and odd sizes included), a dtype, a memory layout
for the input (contiguous, transposed, a slice with a row stride wider than the row,
every other row, a stride-0 broadcast), the op's parameters and masks, and whether the
kernels' long-row (chunked) path is forced by shrinking its limits (that, and the
masks and modes, are pytest parameters, so that every kernel path is covered). The kernels' output
and the gradients of every input are compared with ``triton_layers.reference`` run in
float64 on the same (rounded) inputs, by tests/oracle.py. The norms', softmax's and
coor_descent's tests are here; a newer op's is in its own test file (``tests/test_<op>.py``,
``-k properties``), drawing on the same strategies (``tests/strategies.py``), so that adding an
op edits no file here.

Bounded for CI: small sizes, a fixed number of examples, ``derandomize=True`` and no
example database, so every run draws the same examples (about a minute on 2 CPU cores
through the Triton interpreter).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triton_layers import functional as F
from triton_layers import reference

from .conftest import DEVICE
from .oracle import check
from .strategies import TRUNCATING_BF16, bounded, common, drawn, layouts, param, rows_of, view
from .test_softmax import independent


# --- layer_norm -------------------------------------------------------------------------


@pytest.mark.parametrize("looped", ["fused", "tiny"], ids=["fused", "looped"], indirect=True)
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@bounded(10)
@given(c=common(), data=st.data())
def test_layer_norm(looped, stable, c, data):
    shape, dtype = c["shape"], c["dtype"]
    n = shape[-1]
    layout = data.draw(layouts(len(shape)), "layout")
    has_w, has_b = (data.draw(st.booleans(), name) for name in ("weight", "bias"))
    param_dtype = data.draw(st.sampled_from([dtype, torch.float32]), "param_dtype")
    strided_params = data.draw(st.booleans(), "strided_params")
    eps = data.draw(st.sampled_from([1e-5, 1e-3, 0.1]), "eps")
    x = drawn(shape, dtype, layout, c["scale"], c["shift"], c["gen"])
    w = param(n, param_dtype, c["gen"], strided_params, 1.0) if has_w else None
    b = param(n, param_dtype, c["gen"], strided_params) if has_b else None
    dy = torch.randn(shape, generator=c["gen"]).to(dtype).to(DEVICE)

    def v(p):
        return view(p, strided_params)

    res = check(lambda x, w, b: F.layer_norm(x, v(w), v(b), eps=eps, stable=stable, use_triton=True),
                lambda x, w, b: reference.layer_norm(x.reshape(-1, n), v(w), v(b), eps, stable).reshape(shape),
                dict(x=x, weight=w, bias=b), dy=dy, summed=dict(weight=rows_of(shape), bias=rows_of(shape)))
    assert res.y.dtype == dtype and res.y.shape == shape
    assert all(g.dtype == param_dtype for name, g in res.grads.items() if name != "x")


# --- softmax ----------------------------------------------------------------------------


@pytest.mark.parametrize("looped", ["fused", "tiny"], ids=["fused", "looped"], indirect=True)
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padding"])
@bounded(6)
@given(c=common(min_dims=3, max_dims=4, max_n=40), data=st.data())
def test_softmax(looped, causal, masked, c, data):
    shape, dtype = c["shape"], c["dtype"]
    scale = data.draw(st.one_of(st.none(), st.floats(0.05, 3.0)), "scale")
    layout = data.draw(layouts(len(shape), broadcast_last=True), "layout")
    x = drawn(shape, dtype, layout, c["scale"], c["shift"], c["gen"])
    mask = None
    if masked:
        p_pad = data.draw(st.sampled_from([0.1, 0.5, 0.9]), "padding")
        mask = torch.rand(shape[0], shape[-1], generator=c["gen"]) < p_pad
        if data.draw(st.booleans(), "an all-padding entry"):
            mask[0] = True
        mask = mask.to(DEVICE)
    dy = torch.randn(shape, generator=c["gen"]).to(dtype).to(DEVICE)
    s = 1.0 if scale is None else scale
    # A truncated y (interpreter, bf16) is off by up to one ulp (eps * y) per entry; through
    # dx = s * y * (dy - sum(y * dy)) that is at most 2 * s * eps * max|dy| more.
    slack = 0.0
    if dtype == torch.bfloat16 and TRUNCATING_BF16:
        slack = 2 * s * torch.finfo(dtype).eps * dy.abs().max().item()
    # fp16/bf16: the backward starts from the saved, rounded y, as torch's own softmax in
    # that dtype does: its error is the bar (test_softmax.independent: masked_fill + softmax).
    res = check(lambda x: F.softmax(x, causal=causal, scale=scale, key_padding_mask=mask, use_triton=True),
                lambda x: reference.softmax(x, causal, scale, mask), dict(x=x), dy=dy,
                lowp=lambda x: independent(x, causal, s, mask), slack=dict(x=slack))
    assert res.y.dtype == dtype and res.y.shape == shape


# --- coor_descent -----------------------------------------------------------------------


@pytest.mark.parametrize("looped", ["fused", "tiny"], ids=["fused", "looped"], indirect=True)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@bounded(7)
@given(c=common(max_dims=3, max_n=60), data=st.data())
def test_coor_descent(looped, masked, c, data):
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
