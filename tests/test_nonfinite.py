"""NaN and +-inf in the inputs: each op against torch's own op (docs/NAN_INF.md).

Every test puts NaN / inf / -inf into a few entries of random inputs and compares the
kernels' forward and backward with torch's op on the same inputs, NaN for NaN and inf
for inf (``oracle.agree(..., equal_nan=True)``), on the in-register path and on the
chunked long-row path (limits shrunk so that rows of 100 take it). The deliberate
differences (softmax rows with nothing to attend to, hidden causal keys in the backward)
have tests of their own. A newer op's test is in its own test file (``tests/test_<op>.py``,
``-k nonfinite``), using the same helpers (``tests/nonfinite.py``), so that adding an op edits no
file here.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from triton_layers import functional as F
from triton_layers import reference

from .conftest import looped_config
from .nonfinite import INF, NAN, VALUES, close, grads, poisoned

# No warning either: the interpreter computes in numpy, whose floating-point warnings the
# launch turns off (calls/fast_launch._Quiet), as a GPU computes NaN and inf silently.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

FUSED_N, LOOPED_N = 37, 100


@pytest.fixture(params=["fused", "looped"])
def n_cols(request) -> int:
    """Row length for the in-register path, or for the chunked path with shrunk limits."""
    looped = request.param == "looped"
    with looped_config("small" if looped else "fused"):
        yield LOOPED_N if looped else FUSED_N


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("stable", [False, True])
def test_layer_norm(device, n_cols, value, stable):
    x = poisoned(5, n_cols, value, device)
    w, b = torch.randn(n_cols, device=device), torch.randn(n_cols, device=device)
    (y, dx, dw, db), dy = grads(lambda *a: F.layer_norm(*a, stable=stable), x, w, b)
    # torch's op (stable: the float64 torch definition, as torch has none).
    torch_fn = (lambda x, w, b: TF.layer_norm(x, (n_cols,), w, b)) if not stable else (
        lambda x, w, b: reference.layer_norm(x.double(), w.double(), b.double(), 1e-5, True).float())
    (y_t, dx_t, dw_t, db_t), _ = grads(torch_fn, x, w, b, dy=dy)
    for name, ours, theirs in [("y", y, y_t), ("dx", dx, dx_t), ("dw", dw, dw_t), ("db", db, db_t)]:
        close(ours, theirs, name, rtol=1e-4, atol=1e-4)
    assert torch.isnan(y[[1, -1]]).all() and torch.isfinite(y[[0, 2, 3]]).all()


def test_layer_norm_nonfinite_parameters(device, n_cols):
    x = torch.randn(4, n_cols, device=device)
    w, b = torch.randn(n_cols, device=device), torch.randn(n_cols, device=device)
    w[3], b[5] = NAN, INF
    (y, dx, dw, db), dy = grads(F.layer_norm, x, w, b)
    (y_t, dx_t, dw_t, db_t), _ = grads(lambda x, w, b: TF.layer_norm(x, (n_cols,), w, b), x, w, b, dy=dy)
    for name, ours, theirs in [("y", y, y_t), ("dx", dx, dx_t), ("dw", dw, dw_t), ("db", db, db_t)]:
        close(ours, theirs, name, rtol=1e-4, atol=1e-4)


def _rms_norm_definition(h, w, eps):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("value", VALUES)
def test_rms_norm_with_residual(device, n_cols, value):
    """RMSNorm (as F.rms_norm) of h = x + residual: NaN/inf in x propagates to y, h and every
    gradient as through torch's ops (a NaN makes its row of y NaN; an inf makes its
    mean square inf: NaN at the inf, 0 elsewhere in the row); the other rows are untouched."""
    x = poisoned(5, n_cols, value, device)
    r, w = torch.randn(5, n_cols, device=device), torch.randn(n_cols, device=device)
    dy, dh = torch.randn(5, n_cols, device=device), torch.randn(5, n_cols, device=device)

    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, r, w)]
        y, h = fn(*leaves)
        return (y.detach(), h.detach(), *torch.autograd.grad((y, h), leaves, (dy, dh)))

    ours = run(lambda x, r, w: F.rms_norm(x, w, 1e-6, residual=r))
    # The definition in torch ops, not torch's rms_norm kernel: on CUDA that one makes the
    # whole row of an inf NaN (on the CPU, as here, only the inf's element).
    theirs = run(lambda x, r, w: (_rms_norm_definition(x + r, w, 1e-6), x + r))
    for name, a, b in zip(["y", "h", "dx", "dresidual", "dw"], ours, theirs):
        close(a, b, name, rtol=1e-4, atol=1e-4)
    assert not torch.isfinite(ours[0][[1, -1]]).all(dim=-1).any() and torch.isfinite(ours[0][[0, 2, 3]]).all()


def torch_masked_softmax(x, causal, mask):
    """torch's masked softmax: masked_fill(-inf) then softmax (no fix-up of empty rows)."""
    keep = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    if causal:
        n_q, n_k = x.shape[-2:]
        keep = keep & torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).tril(n_k - n_q)
    if mask is not None:
        keep = keep & ~mask[:, None, :]
    return torch.softmax((0.7 * x).masked_fill(~keep, -INF), dim=-1), keep


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True), (True, True)])
def test_softmax(device, n_cols, value, causal, masked):
    n_q = 6
    x = torch.randn(2, n_q, n_cols, device=device)
    x[0, 4, 1] = value  # a visible key
    x[1, 2, -1] = value  # hidden by the causal mask (when causal)
    mask = None
    if masked:
        mask = torch.rand(2, n_cols, device=device) < 0.3
        mask[:, 1] = False
        mask[1, 5] = True
        x[1, 5, 5] = value  # a padded key: never used
    (y, dx), dy = grads(lambda x: F.softmax(x, causal=causal, scale=0.7, key_padding_mask=mask), x)
    (y_t, dx_t), _ = grads(lambda x: torch_masked_softmax(x, causal, mask)[0], x, dy=dy)
    keep = torch_masked_softmax(x, causal, mask)[1]
    # At visible keys: torch's result, NaN for NaN. (Masked keys of a row torch makes NaN may
    # hold NaN or 0 here; torch's forward has NaN there and its backward 0.)
    close(torch.where(keep, y, 0), torch.where(keep, y_t, 0), "y")
    close(torch.where(keep, dx, 0), torch.where(keep, dx_t, 0), "dx")
    finite_rows = torch.isfinite(y_t).all(-1, keepdim=True).expand_as(y)
    assert (y[finite_rows & ~keep] == 0).all() and (dx[finite_rows & ~keep] == 0).all()
    # The rows with a NaN or +inf visible score are NaN; -inf is probability 0.
    assert torch.isnan(y[0, 4, 1]) == (value != -INF)


def test_softmax_rows_with_nothing_to_attend_to_are_zero(device, n_cols):
    """Differs from torch on purpose: all keys masked, or all scores -inf -> 0, not NaN."""
    x = torch.randn(3, 4, n_cols, device=device)
    x[0, 2] = -INF  # an additive mask hiding every key of a row
    mask = torch.zeros(3, n_cols, dtype=torch.bool, device=device)
    mask[1] = True  # a batch entry that is all padding
    for use_triton in (None, False):  # kernels and reference agree
        (y, dx), _ = grads(lambda x: F.softmax(x, key_padding_mask=mask, use_triton=use_triton), x)
        assert torch.isnan(torch_masked_softmax(x, False, mask)[0][[0, 1], [2, 0]]).all()  # torch: NaN
        assert (y[0, 2] == 0).all() and (y[1] == 0).all() and (dx[0, 2] == 0).all() and (dx[1] == 0).all()
        torch.testing.assert_close(y[2].sum(-1), torch.ones(4, device=device))


@pytest.mark.parametrize("value", [NAN, INF])
def test_softmax_backward_ignores_hidden_causal_keys(device, n_cols, value):
    """Differs from torch on purpose: dy at causally hidden keys is never read."""
    x = torch.randn(2, 5, n_cols, device=device)
    dy = torch.randn_like(x)
    dy_bad = dy.clone()
    dy_bad[0, 1, -1] = value  # hidden: query 1 of 5 sees keys <= 1 + n_cols - 5
    (_, dx), _ = grads(lambda x: F.softmax(x, causal=True), x, dy=dy)
    (_, dx_bad), _ = grads(lambda x: F.softmax(x, causal=True), x, dy=dy_bad)
    assert torch.equal(dx, dx_bad)
    # At padded keys it propagates as in torch: the row's visible entries are NaN.
    mask = torch.zeros(2, n_cols, dtype=torch.bool, device=device)
    mask[0, 3] = True
    dy_bad = dy.clone()
    dy_bad[0, 4, 3] = value
    (_, dx_pad), _ = grads(lambda x: F.softmax(x, key_padding_mask=mask), x, dy=dy_bad)
    (_, dx_t), _ = grads(lambda x: torch_masked_softmax(x / 0.7, False, mask)[0], x, dy=dy_bad)
    visible = ~mask[0]
    close(dx_pad[0, 4, visible], dx_t[0, 4, visible], "dx")
    assert torch.isnan(dx_pad[0, 4, visible]).all()


def cd(s, k, mask, use_triton):
    return F.coor_descent(s, n_iters=6, k=k, mask=mask, use_triton=use_triton)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("masked", [False, True])
def test_coor_descent(device, n_cols, value, masked):
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


@pytest.mark.parametrize("value", [NAN, INF])
def test_coor_descent_nonfinite_k(device, value):
    s = torch.randn(3, FUSED_N, device=device)
    k = torch.tensor([2.0, value, 4.0], device=device)
    (y, ds, dk), dy = grads(lambda s, k: cd(s, k, None, True), s, k)
    (y_t, ds_t, dk_t), _ = grads(lambda s, k: cd(s, k, None, False), s, k, dy=dy)
    close(y, y_t, "y", atol=1e-4)
    close(ds, ds_t, "ds", rtol=1e-3, atol=1e-4)
    close(dk, dk_t, "dk", rtol=1e-3, atol=1e-4)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
