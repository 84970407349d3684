"""The fused residual add and ``out_dtype`` of both norms (functional.layer_norm / rms_norm,
TritonLayerNorm / TritonRMSNorm): ``h = x + residual`` computed in ``residual_dtype``,
``y = norm(h)``, one kernel pass forward and one backward, y in ``out_dtype``."""

import pytest
import torch
import torch.nn.functional as TF

from triton_layers import TritonLayerNorm, TritonRMSNorm
from triton_layers import functional as F
from triton_layers import reference
from triton_layers import launch_config
from triton_layers.kernels import _layer_norm_rules
from triton_layers.kernels import layer_norm as norm_kernels
from torch.utils._python_dispatch import TorchDispatchMode

from .conftest import DEVICE, H100, looped_config
from . import bad_inputs as bad
from .big_tensors import CHUNK, cols, randn, rows_past, sample_rows
from .nonfinite import SILENT, VALUES, close, poisoned
from .oracle import compare

BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16


def _norm(kind, x, w, b, **kw):
    if kind == "layer":
        return F.layer_norm(x, w, b, **kw)
    return F.rms_norm(x, w, 1e-6, **kw)


def _exact_norm(kind, h, w, b):
    """torch's own op (an independent definition), in float64."""
    if kind == "layer":
        return TF.layer_norm(h, h.shape[-1:], w, b, 1e-5)
    return TF.rms_norm(h, h.shape[-1:], w, 1e-6)


def _params(kind, n, device, dtype=FP32):
    w = (1 + 0.5 * torch.randn(n, device=device)).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(n, device=device)).to(dtype).requires_grad_() if kind == "layer" else None
    return w, b


def _assert_h_exact(h, x, r):
    """h is torch's x.to(d) + r.to(d): bitwise, except that the Triton interpreter truncates
    fp32 -> bf16 where the GPU rounds: an ulp of the sum, and one of r where r is cast first."""
    x, r = x.detach().to(h.dtype), r.detach().to(h.dtype)
    h_torch = x + r
    if DEVICE == "cuda" or h.dtype != BF16:
        assert torch.equal(h, h_torch)
    else:
        diff = (h.float() - h_torch.float()).abs()
        assert (diff <= 2 * torch.finfo(BF16).eps * (h_torch.float().abs() + r.float().abs())).all()


# (x's dtype, the residual's, residual_dtype): bf16 x with an fp32 residual is the residual
# stream kept in fp32 (flash-attn's residual_in_fp32); the last overrides h's dtype.
DTYPE_CASES = {"fp32": (FP32, FP32, None), "bf16-x-fp32-stream": (BF16, FP32, None), "bf16": (BF16, BF16, None),
               "fp16": (FP16, FP16, None), "fp32-stream-as-bf16": (BF16, FP32, BF16)}


def _compare_at_h(y, h, grads, dy, dh, params, rows, exact):
    """y and the gradients of x, the residual and ``params`` (through both outputs, with dy
    and dh) against float64 at the h computed: y = exact(h, *params), and dx = dresidual = dz
    (a cast passes gradients as they are)."""
    h64 = h.detach().double().requires_grad_()
    params64 = [p.detach().double().requires_grad_() for p in params]
    y64 = exact(h64, *params64)
    dz64, *dparams64 = torch.autograd.grad((y64, h64), (h64, *params64), (dy.double(), dh.double()))
    compare(y, y64, name="y")
    for name, g, g64 in zip(["dx", "dresidual", "dweight", "dbias"], grads, [dz64, dz64, *dparams64]):
        # Weight gradients are sums over rows: the oracle's bound grows with them.
        compare(g, g64, rows=1 if name in ("dx", "dresidual") else rows, name=name)


# The chunked (long-row) kernels with two dtypes for dx and dresidual, and with one; and, on a
# GPU, rows of 30,000 at the real limits: a forward holding x and the residual of a whole row
# in registers (up to fwd_residual_max_fused_cols), then the column-split backward.
PATHS = ([(d, "") for d in DTYPE_CASES] + [("bf16-x-fp32-stream", "looped"), ("bf16", "looped")]
         + [("bf16-x-fp32-stream", "wide"), ("fp32", "wide")])
SIZES = {"": (9, 300), "looped": (5, 40), "wide": (3, 30000)}


@pytest.mark.parametrize("dtypes,path", PATHS, ids=[d + (f"-{path}" if path else "") for d, path in PATHS])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_residual_matches_float64(kind, dtypes, path, device):
    """y, h and every gradient (through both outputs) against float64 torch."""
    if path == "wide" and device != "cuda":
        pytest.skip("rows of 30,000 at the real limits: too slow for the interpreter")
    x_dtype, r_dtype, residual_dtype = DTYPE_CASES[dtypes]
    rows, n = SIZES[path]
    x = (torch.randn(rows, n, device=device) * 2 + 0.5).to(x_dtype).requires_grad_()
    r = (torch.randn(rows, n, device=device) * 3).to(r_dtype).requires_grad_()
    w, b = _params(kind, n, device)
    with looped_config("tiny" if path == "looped" else "fused"):  # tiny: rows over 16 are chunked
        y, h = _norm(kind, x, w, b, residual=r, residual_dtype=residual_dtype)
        h_dtype = residual_dtype or r_dtype
        assert y.dtype == x_dtype and h.dtype == h_dtype
        _assert_h_exact(h, x, r)
        dy, dh = torch.randn_like(y), torch.randn_like(h)
        params = [p for p in (w, b) if p is not None]
        grads = torch.autograd.grad((y, h), (x, r, *params), (dy, dh))
    assert grads[0].dtype == x_dtype and grads[1].dtype == r_dtype
    _compare_at_h(y, h, grads, dy, dh, params, rows,
                  lambda h64, *params64: _exact_norm(kind, h64, *params64, *([None] if b is None else [])))


@pytest.mark.parametrize("path", ["fused", "tiny"])
def test_stable_layer_norm_with_residual(path, device):
    """Stable mode with the residual, against the float64 reference at the h computed. On the
    long-row path ("tiny": rows over 16 chunked) the first of three passes over a row writes h
    and the later two read it back."""
    from triton_layers import reference

    x = (torch.randn(5, 40, device=device) * 3 + 1).to(BF16).requires_grad_()
    r = (torch.randn(5, 40, device=device) * 2).requires_grad_()
    w, b = _params("layer", 40, device)
    with looped_config(path):
        y, h = F.layer_norm(x, w, b, stable=True, residual=r)
        _assert_h_exact(h, x, r)
        dy, dh = torch.randn_like(y), torch.randn_like(h)
        grads = torch.autograd.grad((y, h), (x, r, w, b), (dy, dh))
    _compare_at_h(y, h, grads, dy, dh, [w, b], 5,
                  lambda h64, w64, b64: reference.norm(h64, w64, b64, 1e-5, stable=True))


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_fp32_output_of_bf16_input_comes_from_fp32_statistics(kind, device):
    """out_dtype=fp32 from a bf16 x: fp32-accurate (a bf16 result cast up would be ~1e-3 off)."""
    x = (torch.randn(9, 300, device=device) * 2 + 0.5).to(BF16).requires_grad_()
    w, b = _params(kind, 300, device)
    y = _norm(kind, x, w, b, out_dtype=FP32)
    assert y.dtype == FP32
    y64 = _exact_norm(kind, x.detach().double(), w.detach().double(), None if b is None else b.detach().double())
    compare(y, y64, name="y")
    cast_up = _norm(kind, x, w, b).float()
    assert (cast_up - y64).abs().max() > 100 * (y - y64).abs().max()
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert dx.dtype == BF16


def test_out_dtype_must_be_floating(device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        F.rms_norm(x, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="residual_dtype must be one of"):
        F.layer_norm(x, residual=x, residual_dtype=torch.int32)


def test_modules_take_a_residual(device):
    x, r = torch.randn(3, 5, 32, device=device), torch.randn(3, 5, 32, device=device)
    for module in (TritonLayerNorm(32, bias=True, device=device), TritonRMSNorm(32, device=device)):
        y, h = module(x, r)
        assert y.shape == h.shape == x.shape
        torch.testing.assert_close(h, x + r, rtol=0, atol=0)
        torch.testing.assert_close(y, module(x + r), rtol=0, atol=0)


class _Spy:
    """Stands in for a @triton.jit kernel: counts its launches; ``busy`` while one runs."""

    def __init__(self, kernel, busy: list):
        self.kernel, self.busy, self.launches = kernel, busy, 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            self.busy.append(True)
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                self.busy.pop()
        return launch


class _TorchOps(TorchDispatchMode):
    """The torch ops called outside kernel launches (the interpreter copies data in them)."""

    def __init__(self, busy: list):
        super().__init__()
        self.busy, self.ops = busy, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.busy:
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


# Ops that move no x-sized data: allocations, views.
QUIET_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "view", "select",
             "unbind", "alias", "_unsafe_view"}


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_one_pass_each_way(kind, monkeypatch, device):
    """Forward: one kernel launch reads x and the residual and writes y (bf16, from the fp32
    stream: no cast kernel) and h; no torch op touches the data. Backward: one node for both
    outputs, one kernel launch for every gradient (and one summing the weight's partials,
    which are not x-sized)."""
    busy: list = []
    names = ("_norm_fwd_kernel", "_norm_bwd_kernel", "_norm_bwd_row_sums_kernel", "_norm_bwd_split_kernel",
             "_partials_sum_kernel")
    spies = {name: _Spy(getattr(norm_kernels, name), busy) for name in names}
    for name, spy in spies.items():
        monkeypatch.setattr(norm_kernels, name, spy)
    x = torch.randn(33, 64, device=device, requires_grad=True)
    r = torch.randn(33, 64, device=device, requires_grad=True)
    w, b = _params(kind, 64, device)
    with _TorchOps(busy) as fwd_ops:
        y, h = _norm(kind, x, w, b, residual=r, out_dtype=BF16)
    assert y.dtype == BF16 and h.dtype == FP32 and y.grad_fn is h.grad_fn
    params = [p for p in (w, b) if p is not None]
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    with _TorchOps(busy) as bwd_ops:
        grads = torch.autograd.grad((y, h), (x, r, *params), (dy, dh))
    assert spies["_norm_fwd_kernel"].launches == 1 and spies["_norm_bwd_kernel"].launches == 1
    assert sum(s.launches for s in spies.values()) - spies["_partials_sum_kernel"].launches == 2
    assert spies["_partials_sum_kernel"].launches <= 1
    assert set(fwd_ops.ops) <= QUIET_OPS, fwd_ops.ops
    assert set(bwd_ops.ops) <= QUIET_OPS, bwd_ops.ops
    assert grads[0] is grads[1]  # one dtype: dx and dresidual are one tensor, written once


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_rms_backward_keeps_longer_rows_whole(residual, monkeypatch, device):
    """RMSNorm's backward keeps rows whole up to ``bwd_rms_max_fused_cols``, past LayerNorm's
    limits (one kernel launch; past ``bwd_long_row`` columns with ``bwd_long_row_stages``), where
    LayerNorm's rows of the same length take the two column-split kernels. The gradients
    against float64 torch either way."""
    # (rows of 40 are "long" here)
    config = launch_config.TINY.with_knobs("layer_norm", bwd_rms_max_fused_cols=64, bwd_long_row=32)
    limits = config.layer_norm
    names = ("_norm_bwd_kernel", "_norm_bwd_row_sums_kernel", "_norm_bwd_split_kernel")
    # (on a GPU the long rows' one pass needs no row-sums kernel: 5 chunks of 8)
    split = {names[2]} if _layer_norm_rules.one_pass_split(
        5, False, 4, limits, launch_config.GPU.of(torch.device(device))) else set(names[1:])
    for kind, launched in (("rms", {"_norm_bwd_kernel"}), ("layer", split)):
        spies = {name: _Spy(getattr(norm_kernels, name), []) for name in names}
        for name, spy in spies.items():
            monkeypatch.setattr(norm_kernels, name, spy)
        x = (torch.randn(6, 40, device=device) * 2 + 0.5).requires_grad_()
        r = torch.randn(6, 40, device=device, requires_grad=True)
        w, b = _params(kind, 40, device)
        params = [p for p in (w, b) if p is not None]
        inputs = [x, *([r] if residual else []), *params]
        with launch_config.use_config(config):
            out = _norm(kind, x, w, b, **({"residual": r} if residual else {}))
            dout = tuple(torch.randn_like(o) for o in out) if residual else torch.randn_like(out)
            grads = torch.autograd.grad(out, inputs, dout)
        assert {name for name, spy in spies.items() if spy.launches} == launched, kind
        inputs64 = [t.detach().double().requires_grad_() for t in inputs]
        h64 = inputs64[0] + inputs64[1] if residual else inputs64[0]
        p64 = inputs64[2:] if residual else inputs64[1:]
        y64 = _exact_norm(kind, h64, *p64, *([None] if b is None else []))
        out64 = (y64, h64) if residual else y64
        dout64 = tuple(d.double() for d in dout) if residual else dout.double()
        for name, g, g64 in zip(["dx", "dresidual", "dweight", "dbias"] if residual else ["dx", "dweight", "dbias"],
                                grads, torch.autograd.grad(out64, inputs64, dout64)):
            compare(g, g64, rows=6 if name in ("dweight", "dbias") else 1, name=name)


# --- residual_in_place: serving's residual buffer, updated in place ----------------------------

@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("shape, looped", [((1, 64), False), ((7, 3, 130), False), ((5, 300), True)],
                         ids=["decode-row", "3d", "long-rows-looped"])
@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("use_triton", [None, False], ids=["kernels", "reference"])
def test_residual_in_place_writes_h_into_the_residual(kind, dtype, shape, looped, context, use_triton):
    """Under no_grad / inference_mode, ``residual_in_place=True`` returns (y, residual) with h
    written into the residual: the same bits as the out-of-place call's (y, h), twice in a
    row (the second call planned), on the kernels (the row-by-row and the looped long-row
    forms) and the reference path; nothing else is written. The out-of-place call is taken
    with the one-pass split kernel off: the in-place call never takes it (its programs read
    each other's chunks of the residual), and on an H100 it sums a row in another order."""
    import contextlib

    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    residual = torch.randn(shape, device=DEVICE, dtype=dtype)
    w, b = (p.detach() for p in _params(kind, shape[-1], DEVICE, dtype)) if kind == "layer" else (
        _params(kind, shape[-1], DEVICE, dtype)[0].detach(), None)
    config = looped_config("small") if looped else contextlib.nullcontext()
    grad_off = torch.no_grad if context == "no_grad" else torch.inference_mode
    with config, grad_off():
        with launch_config.use_knobs("layer_norm", fwd_residual_one_pass=False):
            want_y, want_h = _norm(kind, x, w, b, residual=residual, use_triton=use_triton)
        x_before = x.clone()
        for _ in range(2):
            buffer = residual.clone()
            y, h = _norm(kind, x, w, b, residual=buffer, use_triton=use_triton, residual_in_place=True)
            assert h.data_ptr() == buffer.data_ptr() and h.shape == buffer.shape
            assert torch.equal(buffer, want_h) and torch.equal(y, want_y)
            assert torch.equal(x, x_before)


def test_residual_in_place_from_the_modules():
    norm = TritonRMSNorm(64).to(DEVICE)
    x, residual = torch.randn(4, 64, device=DEVICE), torch.randn(4, 64, device=DEVICE)
    with torch.no_grad():
        want_y, want_h = norm(x, residual)
        buffer = residual.clone()
        y, h = norm(x, buffer, residual_in_place=True)
    assert h.data_ptr() == buffer.data_ptr() and torch.equal(buffer, want_h) and torch.equal(y, want_y)


@pytest.mark.parametrize("bad, match", [
    ("grad", "no gradient flows"), ("no residual", "pass a residual"), ("strided", "contiguous residual"),
    ("dtype", "keeps the residual's dtype"), ("stable", "stable=True"),
])
def test_residual_in_place_refuses_what_it_cannot_do(bad, match):
    x = torch.randn(4, 64, device=DEVICE, requires_grad=bad == "grad")
    residual = torch.randn(4, 128, device=DEVICE)[:, :64] if bad == "strided" else torch.randn(4, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    kwargs = dict(residual=None if bad == "no residual" else residual, residual_in_place=True)
    if bad == "dtype":
        kwargs["residual_dtype"] = torch.bfloat16
    with pytest.raises(ValueError, match=match):
        if bad == "stable":
            with torch.no_grad():
                F.layer_norm(x, w, None, 1e-5, True, **kwargs)
        elif bad == "grad":
            F.rms_norm(x, w, **kwargs)
        else:
            with torch.no_grad():
                F.rms_norm(x, w, **kwargs)


def test_residual_in_place_never_plans_the_one_pass_split():
    """The one-pass split forward's programs read each other's chunks of the residual: where
    it would run (planned as on an H100, for long rows), the in-place plan keeps the loop."""
    from triton_layers.kernels import ops

    x, residual, w = (torch.empty(shape, device="meta") for shape in ((4, 300), (4, 300), (300,)))
    args = (x, residual, w, None, 1e-6, True, False, False, False, FP32, FP32)
    with looped_config("small"), launch_config.plan_as(H100):
        assert ops.residual_norm.plan(*args).forward.kernel.kernel is norm_kernels._norm_fwd_split_kernel
        assert ops.residual_norm_in_place.plan(*args).forward.kernel.kernel is norm_kernels._norm_fwd_kernel


def test_residual_in_place_over_several_normalized_dims():
    """Normalizing two trailing dims views the rows anew (not the residual itself): h is
    computed by the op and copied into the residual, with the out-of-place call's bits."""
    x, residual = torch.randn(3, 4, 16, device=DEVICE), torch.randn(3, 4, 16, device=DEVICE)
    w, b = torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    with torch.no_grad():
        want_y, want_h = F.layer_norm(x, w, b, residual=residual)
        buffer = residual.clone()
        y, h = F.layer_norm(x, w, b, residual=buffer, residual_in_place=True)
    assert h.data_ptr() == buffer.data_ptr() and torch.equal(buffer, want_h) and torch.equal(y, want_y)


# ------------------------------------------------ past 2**31 elements (tests/big_tensors.py; GPU: run alone)


@pytest.mark.parametrize("n_cols", [cols(4096), cols(65536)], ids=["in-registers", "chunked"])
def test_rms_norm_residual_past_2_31(gpu_memory, n_cols):
    """The fused residual: x (bf16) and an fp32 residual stream past 2**31 elements, y and h,
    and the gradients of both (h's own included: dx and dresidual are written apart)."""
    gpu_memory(64)  # x, y, dy, dx: 4 x 4 GiB in bf16; residual, h, dh, dresidual: 4 x 8 GiB
    n_rows = rows_past(n_cols)
    x = randn((n_rows, n_cols)).requires_grad_()
    r = randn((n_rows, n_cols), torch.float32, 1).requires_grad_()
    w = (1 + 0.5 * randn(n_cols, torch.float32, 2)).requires_grad_()
    y, h = F.rms_norm(x, w, 1e-6, residual=r)
    dy, dh = randn((n_rows, n_cols), seed=3), randn((n_rows, n_cols), torch.float32, 4)
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


# ------------------------------------------------ NaN and inf (its section of docs/API.md; helpers: nonfinite.py)

def _rms_norm_definition(h, w, eps):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


@SILENT
@pytest.mark.parametrize("value", VALUES)
def test_nonfinite_rms_norm_with_residual(device, n_cols, value):
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


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

x_, OTHER = bad.x_, bad.OTHER
BAD_INPUTS = [
    bad.Case("norm-residual-shape", lambda: F.rms_norm(x_(2, 8), residual=x_(3, 8)),
         (ValueError, r"residual must have x's shape and device; got x of shape \(2, 8\) on .*, "
                      r"residual of shape \(3, 8\)")),
    bad.Case("norm-residual-device", lambda: F.layer_norm(x_(2, 8), residual=x_(2, 8, device=OTHER)),
         (ValueError, rf"residual must have x's shape and device; got x of shape \(2, 8\) on {DEVICE}.*, "
                      rf"residual of shape \(2, 8\) on {OTHER}")),
    bad.Case("norm-residual-dtype", lambda: F.rms_norm(x_(2, 8), residual=torch.ones(2, 8, dtype=torch.int64,
                                                                                device=DEVICE)),
         (TypeError, r"residual has dtype torch.int64")),
    bad.Case("norm-out-dtype", lambda: F.layer_norm(x_(2, 8), out_dtype=torch.int64),
         (TypeError, r"out_dtype must be one of torch.float32, torch.float16, torch.bfloat16, torch.float64; "
                     r"got torch.int64")),
    bad.Case("norm-residual-dtype-alone", lambda: F.rms_norm(x_(2, 8), residual_dtype=torch.float32),
         (ValueError, r"residual_dtype=torch.float32 is given without a residual")),
]
test_bad_input = bad.tests_of(BAD_INPUTS)
