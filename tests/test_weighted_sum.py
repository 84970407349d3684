"""WeightedSum: kernels against float64 ``x @ w`` and against the reference; the module.

Every check compares with an independent float64 result (``x.double() @ w.double()`` and
its autograd); fp16/bf16 results may be off by at most 2x torch's own ``x @ w`` in that
dtype plus a small atol (tests/oracle.py). The kernels run on CPU through the Triton
interpreter (conftest.py), on the GPU where there is one.
"""
from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import triton_layers
from triton_layers import WeightedSum, reference
from triton_layers import functional as F
from triton_layers import launch_config
from triton_layers.kernels import _weighted_sum_rules
from triton_layers.kernels import ops as kernel_ops
from triton_layers.calls.doors import direct

from . import nonfinite
from . import bad_inputs as bad
from .conftest import DEVICE, DTYPES, LOW_DTYPES, spy_main_inputs
from .big_tensors import BIG, CHUNK, COL_CHUNK, cols, randn, rows_past, sample_rows
from .fake_timer import fake_gpu_timer
from .oracle import check, compare
from .strategies import bounded, common, drawn, layouts, param, rows_of, view

# (x dtype, parameter dtype): every dtype, and fp32 parameters with fp16/bf16 inputs.
PRECISIONS = [
    (torch.float32, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
]
SHAPES = [(1, 1), (7, 127), (3, 1000), (5, 3000), (64, 256), (1000, 7), (2, 3, 64), (127, 1), (16, 128)]


def _kernel_round(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``t`` rounded to ``dtype`` as the kernels' ``.to()`` does: to nearest even on
    the GPU; the Triton interpreter (CPU) truncates fp32 -> bf16 instead (seen with 3.9)."""
    if dtype == torch.bfloat16 and t.device.type == "cpu":
        return (t.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
    return t.to(dtype)


def _name(p):
    return str(p).replace("torch.", "") if isinstance(p, torch.dtype) else None


def _inputs(shape, dtype, param_dtype, device, bias=True):
    """Fresh random inputs (no zeros, no ones) that require grad."""
    d = shape[-1]
    x = torch.randn(shape, device=device).to(dtype).requires_grad_()
    w = (torch.randn(d, device=device) / math.sqrt(max(d, 1)) + 0.1).to(param_dtype).requires_grad_()
    b = (0.5 + torch.rand((), device=device)).to(param_dtype).requires_grad_() if bias else None
    return x, w, b


def _definition(x, w, b):
    """``x @ w + b`` in torch: the independent oracle (float64), and torch's own low-precision result."""
    y = x @ w
    return y if b is None else y + b


def _check_all(x, w, b, dy):
    """Forward and every gradient of ``F.weighted_sum`` against float64 ``x @ w``; torch's
    own ``x @ w`` in x's dtype (parameters cast to it) sets the fp16/bf16 bar."""
    rows = max(1, x.numel() // max(x.shape[-1], 1))
    res = check(lambda x, w, b: F.weighted_sum(x, w, b), _definition, dict(x=x, weight=w, bias=b), dy=dy,
                lowp=True, summed=dict(weight=rows, bias=rows))
    assert res.y.shape == x.shape[:-1] and res.y.dtype == x.dtype
    for name, t in (("weight", w), ("bias", b)):
        if name in res.grads:
            assert res.grads[name].shape == t.shape and res.grads[name].dtype == t.dtype
    return res


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype,param_dtype", PRECISIONS, ids=_name)
def test_forward_backward_against_float64(shape, dtype, param_dtype, device):
    x, w, b = _inputs(shape, dtype, param_dtype, device)
    dy = torch.randn(shape[:-1], device=device).to(dtype)
    _check_all(x, w, b, dy)


@pytest.mark.parametrize("shape", [(3, 1000), (13, 300), (1, 129), (200, 70), (9, 5, 100)], ids=str)
@pytest.mark.parametrize("dtype,param_dtype", PRECISIONS, ids=_name)
@pytest.mark.parametrize("looped", ["tiny"], indirect=True)
def test_looped_and_split_paths(shape, dtype, param_dtype, device, looped):
    x, w, b = _inputs(shape, dtype, param_dtype, device)
    dy = torch.randn(shape[:-1], device=device).to(dtype)
    _check_all(x, w, b, dy)


@pytest.mark.parametrize("looped", ["tiny"], indirect=True)
def test_tiny_tiles_take_the_split_and_multi_program_paths(looped, device):
    """The looped-path test above must actually reach the paths it is there for."""
    sms = launch_config.GPU.of(torch.device(device)).sm_count
    cfg, rules = looped.weighted_sum, _weighted_sum_rules
    block_m, block_d, _ = rules.tile_2d(3, 1000, 4, cfg)
    wanted = math.ceil(sms * cfg.fwd_programs_per_sm / math.ceil(3 / block_m))
    assert rules.split_range(1000, block_d, wanted)[1] > 1  # forward splits columns
    block_m, block_d, _ = rules.tile_2d(200, 70, 4, cfg)
    assert block_d < 70  # column loop
    col_blocks = math.ceil(70 / block_d)
    wanted = math.ceil(sms * cfg.bwd_programs_per_sm / col_blocks)
    assert rules.split_range(200, block_m, wanted)[1] > 1  # several dw partial rows


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_long_rows(dtype, device):
    """D = 262,144 with a single row and with a few: the column split on its real limits."""
    for shape in [(1, 262144), (3, 100003)]:
        x, w, b = _inputs(shape, dtype, torch.float32, device)
        _check_all(x, w, b, torch.randn(shape[:-1], device=device).to(dtype))


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False), (False, False, True),
                                   (True, True, False), (False, True, True)], ids=str)
@pytest.mark.parametrize("looped", ["tiny"], indirect=True)
def test_only_requested_gradients(needs, device, looped):
    x, w, b = _inputs((37, 300), torch.float32, torch.float32, device)
    for t, need in zip((x, w, b), needs):
        t.requires_grad_(need)
    res = _check_all(x, w, b, torch.randn(37, device=device))
    assert list(res.grads) == [name for name, need in zip(("x", "weight", "bias"), needs) if need]


@pytest.mark.parametrize("looped", ["tiny"], indirect=True)
def test_backward_launcher_skips_what_is_not_asked(device, looped, monkeypatch):
    x, w, _ = _inputs((45, 100), torch.bfloat16, torch.float32, device, bias=False)
    x, w = x.detach(), w.detach()
    dy = torch.randn(45, device=device).to(torch.bfloat16)
    backward = kernel_ops.weighted_sum.backward
    grads = backward(direct, (dy,), dict(x=True, weight=False, bias=False), None, w, torch.bfloat16)  # no x
    dx = grads["x"]
    assert "weight" not in grads and dx.dtype == torch.bfloat16
    assert torch.equal(dx, _kernel_round(dy.float()[:, None] * w[None, :], torch.bfloat16))
    grads = backward(direct, (dy,), dict(x=False, weight=True, bias=False), x, w, torch.bfloat16)
    dw = grads["weight"]
    assert "x" not in grads and "bias" not in grads and dw.dtype == torch.float32
    compare(dw, x.double().T @ dy.double(), rtol=2e-5, name="dweight")
    # The bias's gradient comes from the same pass: torch adds at most the programs'
    # partials, never reduces dy itself.
    calls = []
    monkeypatch.setattr(torch.Tensor, "sum", lambda t, *a, **k: calls.append(t.shape) or torch.sum(t, *a, **k))
    grads = backward(direct, (dy,), dict(x=True, weight=False, bias=True), None, w, torch.bfloat16)
    monkeypatch.undo()
    assert tuple(dy.shape) not in calls, calls
    assert set(grads) == {"x", "bias"} and grads["bias"].shape == ()
    compare(grads["bias"], dy.double().sum(), rtol=2e-5, name="dbias")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_two_pass_backward_equals_the_fused_pass(dtype, device):
    """Large inputs take the backward in two launches (dx and db, then dw): the same programs
    sum the same tiles in the same order as the fused pass, so every gradient is bitwise equal;
    and each config really takes the path it names."""
    x, w, b = _inputs((45, 300), dtype, torch.float32, device)
    dy = torch.randn(45, device=device).to(dtype)
    grads, launches = {}, {}
    for name, limit in (("fused", 1 << 40), ("two passes", 0)):
        with launch_config.use_config(launch_config.TINY.with_knobs("weighted_sum", bwd_two_pass_min_bytes=limit)):
            grads[name] = torch.autograd.grad(F.weighted_sum(x, w, b), (x, w, b), dy)
            launches[name] = kernel_ops.weighted_sum.record_launches(x, w, b)
    for fused, two in zip(grads["fused"], grads["two passes"]):
        assert torch.equal(fused, two)
    assert len(launches["two passes"]) == len(launches["fused"]) + 1


def test_x_is_saved_only_for_the_weight_gradient(device):
    def saved_shapes(x, w):
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            F.weighted_sum(x, w)
        return shapes

    x = torch.randn(6, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device)
    assert (6, 40) not in saved_shapes(x, w)
    assert (6, 40) in saved_shapes(x, w.requires_grad_())


def test_reference_against_independent_definitions(device):
    """reference.weighted_sum is F.linear with a (1, D) weight, squeezed (float64 and fp32)."""
    x, w, b = _inputs((4, 5, 300), torch.float32, torch.float32, device)
    x, w, b = x.detach(), w.detach(), b.detach()
    exact = TF.linear(x.double(), w.double()[None], b.double()[None])[..., 0]
    assert torch.allclose(reference.weighted_sum(x.double(), w.double(), b.double()), exact, rtol=1e-12, atol=1e-12)
    compare(reference.weighted_sum(x, w, b), exact, name="reference fp32")
    for dtype in LOW_DTYPES:
        xl = x.to(dtype)
        exact = xl.double() @ w.double() + b.double()
        low = xl @ w.to(dtype) + b.to(dtype)
        compare(reference.weighted_sum(xl, w, b), exact, low=low, name=f"reference {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_kernels_match_reference_path(dtype, device):
    x, w, b = _inputs((33, 3, 200), dtype, torch.float32, device)
    y_ref = F.weighted_sum(x, w, b, use_triton=False)
    gx_ref, gw_ref, gb_ref = torch.autograd.grad(y_ref.float().sum(), (x, w, b))
    y = F.weighted_sum(x, w, b)
    gx, gw, gb = torch.autograd.grad(y.float().sum(), (x, w, b))
    ulp = 2 * torch.finfo(dtype).eps
    assert torch.allclose(y.float(), y_ref.float(), rtol=ulp, atol=1e-5)
    # dx = dy * w in fp32, rounded once: exact in every dtype.
    assert torch.equal(gx, _kernel_round(torch.ones_like(gx, dtype=torch.float32) * w.detach(), dtype))
    assert torch.equal(gx_ref, (torch.ones_like(gx, dtype=torch.float32) * w.detach()).to(dtype))
    assert torch.allclose(gw, gw_ref, rtol=1e-5, atol=1e-4)
    assert torch.allclose(gb, gb_ref, rtol=1e-6)


def test_non_contiguous_views(device):
    # x: a slice of a wider tensor (last stride 1, no copy), a transposed tensor (copied),
    # a strided batch dim; weight: every other element; dy: strided and expanded (stride 0).
    big = torch.randn(50, 3, 70, device=device)
    cases = [
        big[:, 0, 5:65],
        big[:, :, 9].t(),
        big[::2, :, 3:40],
    ]
    wbig = torch.randn(200, device=device)
    for x in cases:
        d = x.shape[-1]
        x = x.detach().requires_grad_()
        w = wbig[: 2 * d : 2].detach().requires_grad_()
        b = torch.tensor(0.3, device=device, requires_grad=True)
        dy = torch.randn(*x.shape[:-1], 2, device=device)[..., 1]
        res = check(lambda x, w, b: F.weighted_sum(x, w, b), _definition, dict(x=x, weight=w, bias=b), dy=dy)
        # y.sum() hands back an expanded dy of stride 0.
        F.weighted_sum(x, w, b).sum().backward()
        compare(w.grad, x.detach().double().reshape(-1, d).sum(0), name="dweight(sum)")
        assert torch.equal(x.grad, w.detach().expand_as(x))
        assert b.grad.item() == res.y.numel()


def test_row_strided_input_is_not_copied(device, monkeypatch):
    seen = spy_main_inputs(monkeypatch, kernel_ops.weighted_sum)
    big = torch.randn(20, 100, device=device)
    x = big[:, 10:90]
    F.weighted_sum(x, torch.randn(80, device=device))
    assert seen[-1].data_ptr() == x.data_ptr() and seen[-1].stride() == (100, 1)


@pytest.mark.parametrize("looped", ["tiny"], indirect=True)
def test_bitwise_reproducible(device, looped):
    x, w, b = _inputs((301, 257), torch.bfloat16, torch.float32, device)
    dy = torch.randn(301, device=device).to(torch.bfloat16)
    results = []
    for _ in range(2):
        y = F.weighted_sum(x, w, b)
        results.append((y, *torch.autograd.grad(y, (x, w, b), dy)))
    for first, second in zip(*results):
        assert torch.equal(first, second)


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (2, 0, 3), (0,), (0, 0)], ids=str)
def test_empty_inputs(shape, device):
    x, w, b = _inputs(shape, torch.float32, torch.float32, device)
    y = F.weighted_sum(x, w, b)
    assert y.shape == shape[:-1] and y.dtype == x.dtype
    if shape[-1] == 0:
        assert torch.equal(y, b.detach().expand(shape[:-1]))
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    assert b.grad.item() == y.numel()


def test_bias_of_shape_one_and_none(device):
    x, w, _ = _inputs((5, 9), torch.float32, torch.float32, device, bias=False)
    b1 = torch.tensor([0.7], device=device, requires_grad=True)
    y = F.weighted_sum(x, w, b1)
    compare(y, x.detach().double() @ w.detach().double() + 0.7, name="y")
    y.sum().backward()
    assert b1.grad.shape == (1,) and b1.grad.item() == 5
    compare(F.weighted_sum(x, w), x.detach().double() @ w.detach().double(), name="no bias")


def test_bad_inputs_raise(device):
    x = torch.randn(4, 8, device=device)
    w = torch.randn(8, device=device)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        F.weighted_sum(x, torch.randn(9, device=device))
    with pytest.raises(ValueError, match="weight must have shape"):
        F.weighted_sum(x, w[None])
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        F.weighted_sum(torch.ones(4, 8, dtype=torch.long, device=device), w)
    with pytest.raises(TypeError, match="weight has dtype torch.int32"):
        F.weighted_sum(x, torch.ones(8, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        F.weighted_sum([[1.0] * 8], w)
    with pytest.raises(ValueError, match="bias must be a scalar"):
        F.weighted_sum(x, w, torch.randn(2, device=device))
    with pytest.raises(ValueError, match="bias must be a scalar"):
        F.weighted_sum(x, w, torch.randn(1, 1, device=device))
    with pytest.raises(ValueError, match="0-dim"):
        F.weighted_sum(torch.tensor(1.0, device=device), torch.randn(1, device=device))
    with pytest.raises(ValueError, match="one device"):
        F.weighted_sum(x, torch.randn(8, device="meta"))
    # The module names x's last dim, not the weight, when they disagree.
    with pytest.raises(ValueError, match=r"x of shape \(3, 10\) must end with dim=8"):
        WeightedSum(8).to(device)(torch.randn(3, 10, device=device))


# ---------------------------------------------------------------- the module


def test_module_initialised_as_linear():
    torch.manual_seed(3)
    linear = nn.Linear(50, 1)
    torch.manual_seed(3)
    module = WeightedSum(50, bias=True)
    assert torch.equal(module.weight, linear.weight.reshape(-1))
    assert torch.equal(module.bias, linear.bias)
    assert module.weight.shape == (50,) and module.bias.shape == (1,)  # 1-D: FSDP2 refuses 0-dim
    bound = 1 / math.sqrt(50)
    assert module.weight.abs().max() <= bound and module.weight.std() > bound / 4


def test_module_options_and_repr():
    module = WeightedSum(7, dtype=torch.bfloat16)
    assert module.bias is None and list(dict(module.named_parameters())) == ["weight"]
    assert "bias" not in module.state_dict()
    assert module.weight.dtype == torch.bfloat16
    assert repr(module) == "WeightedSum(dim=7, bias=False)"
    assert WeightedSum(0).weight.shape == (0,)
    with pytest.raises(ValueError, match="dim must be an int >= 0, got -1"):
        WeightedSum(-1)
    assert triton_layers.WeightedSum is WeightedSum


@pytest.mark.parametrize("bias", [True, False])
def test_from_linear(bias, device):
    linear = nn.Linear(300, 1, bias=bias, device=device)
    module = WeightedSum.from_linear(linear)
    assert module.weight.device == linear.weight.device and (module.bias is None) != bias
    x = torch.randn(2, 9, 300, device=device)
    exact = linear.double()(x.double())[..., 0]
    compare(module(x), exact, name="from_linear")
    with pytest.raises(ValueError, match="out_features=1"):
        WeightedSum.from_linear(nn.Linear(4, 2))
    with pytest.raises(TypeError, match="expects an nn.Linear"):
        WeightedSum.from_linear(nn.Conv1d(4, 1, 1))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=_name)
def test_to_linear_round_trips_both_ways(bias, dtype, device):
    """to_linear: WeightedSum -> nn.Linear(dim, 1) -> WeightedSum and
    nn.Linear -> WeightedSum -> nn.Linear keep the weights bit for bit, the device, the dtype
    and each parameter's requires_grad; the copies share no memory, and a Linear's
    state_dict made from it loads into a plain nn.Linear(dim, 1)."""
    module = WeightedSum(40, bias=bias, device=device, dtype=dtype)
    with torch.no_grad():  # random values, not the initialisation's
        module.weight.normal_()
        if bias:
            module.bias.normal_()
    module.weight.requires_grad_(False)  # a frozen weight stays frozen
    rng = torch.random.get_rng_state()
    linear = module.to_linear()
    assert torch.equal(torch.random.get_rng_state(), rng)  # no initialisation drawn and thrown away
    assert type(linear) is nn.Linear and (linear.in_features, linear.out_features) == (40, 1)
    for ours, theirs in ((module.weight, linear.weight), (module.bias, linear.bias)):
        if ours is None:
            assert theirs is None
            continue
        assert theirs.dtype == dtype and theirs.device == ours.device
        assert theirs.requires_grad == ours.requires_grad
        assert torch.equal(theirs.reshape(-1), ours) and theirs.data_ptr() != ours.data_ptr()
    assert tuple(linear.weight.shape) == (1, 40)
    x = torch.randn(3, 40, device=device, dtype=dtype)
    torch.testing.assert_close(linear(x)[..., 0], module(x))
    back = WeightedSum.from_linear(linear)
    assert torch.equal(back.weight, module.weight) and (not bias or torch.equal(back.bias, module.bias))
    plain = nn.Linear(40, 1, bias=bias, device=device, dtype=dtype)
    plain.load_state_dict(linear.state_dict())  # strict
    # The other way: a Linear with random weights through WeightedSum and back.
    start = nn.Linear(40, 1, bias=bias, device=device, dtype=dtype)
    again = WeightedSum.from_linear(start).to_linear()
    assert torch.equal(again.weight, start.weight) and (not bias or torch.equal(again.bias, start.bias))
    assert WeightedSum(0).to_linear().weight.shape == (1, 0)


def test_state_dict_round_trip_and_linear_checkpoint(device):
    module = WeightedSum(33, bias=True, device=device)
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    other = WeightedSum(33, bias=True, device=device)
    assert not torch.equal(other.weight, module.weight)
    other.load_state_dict(torch.load(buffer))
    x = torch.randn(5, 33, device=device)
    assert torch.equal(other(x), module(x))
    # An nn.Linear(33, 1) checkpoint loads as is: weight (1, 33) -> (33,), bias (1,) as is.
    linear = nn.Linear(33, 1, device=device)
    other.load_state_dict(linear.state_dict())
    assert torch.equal(other.weight, linear.weight.reshape(-1)) and torch.equal(other.bias, linear.bias)
    # A checkpoint of this layer from when its bias was 0-dim loads too.
    other.load_state_dict({"weight": module.weight.detach(), "bias": module.bias.detach().reshape(())})
    assert torch.equal(other(x), module(x))
    with pytest.raises(RuntimeError, match="size mismatch"):
        other.load_state_dict(nn.Linear(34, 1).state_dict())


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=_name)
def test_module_mixed_precision_in_sequential(dtype, device):
    """An attention-pooling style head: fp32 parameters, low-precision activations."""
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), WeightedSum(64, bias=True)).to(device)
    x = torch.randn(8, 16, 64, device=device)
    with torch.no_grad():
        h = model[1](model[0](x)).to(dtype)
    h.requires_grad_()
    y = model[2](h)
    assert y.shape == (8, 16) and y.dtype == dtype
    y.float().sum().backward()
    assert model[2].weight.grad.dtype == torch.float32 and model[2].bias.grad.dtype == torch.float32
    compare(model[2].weight.grad, h.detach().double().reshape(-1, 64).sum(0), name="dweight")
    use_ref = WeightedSum(64, bias=True, use_triton=False).to(device)
    use_ref.load_state_dict(model[2].state_dict())
    assert torch.allclose(use_ref(h).float(), y.float(), rtol=2 * torch.finfo(dtype).eps, atol=1e-3)


def test_torch_compile_fullgraph(device):
    """Kernel path under torch.compile on the GPU; on CPU (interpreter) the reference path,
    as docs/ARCHITECTURE.md says compiling the interpreted kernels is not supported."""
    on_gpu = device == "cuda"
    fn = torch.compile(
        lambda x, w, b: F.weighted_sum(x, w, b, use_triton=on_gpu),
        fullgraph=True, dynamic=False, backend="inductor" if on_gpu else "aot_eager",
    )
    x, w, b = _inputs((6, 7, 96), torch.float32, torch.float32, device)
    check(fn, _definition, dict(x=x, weight=w, bias=b), dy=torch.randn(6, 7, device=device))


# ------------------------------------------------ NaN and inf (its section of docs/API.md; helpers: nonfinite.py)


@nonfinite.SILENT
@pytest.mark.parametrize("shape", [(37, 20), (3, 3000)], ids=["many-rows", "split-columns"])
def test_nonfinite_as_torch_matmul(device, shape):
    x = torch.randn(shape, device=device)
    w = torch.randn(shape[1], device=device)
    nan, inf = nonfinite.NAN, nonfinite.INF
    x[1, 3], x[2, 0], x[2, -1] = nan, inf, -inf  # row 2: inf - inf (if the weights agree in sign)
    x[0, 5], w[5] = inf, 0.0  # inf * 0
    x[-1, 7] = -inf
    (y, dx, dw), dy = nonfinite.grads(F.weighted_sum, x, w)
    (y_t, dx_t, dw_t), _ = nonfinite.grads(lambda x, w: x @ w, x, w, dy=dy)
    nonfinite.close(y, y_t, "y", rtol=1e-4, atol=1e-4)
    nonfinite.close(dx, dx_t, "dx")
    nonfinite.close(dw, dw_t, "dw", rtol=1e-4, atol=1e-4)
    assert torch.isnan(y[[0, 1]]).all() and torch.isinf(y[-1])


# ------------------------------------------------ properties (hypothesis; strategies: strategies.py)


@pytest.mark.parametrize("long_rows", [False, True], ids=["short", "split-columns"])
@pytest.mark.parametrize("bias_shape", [None, (), (1,)], ids=["nobias", "bias0d", "bias1d"])
@bounded(8)
@given(c=common(max_n=70), data=st.data())
def test_properties(long_rows, bias_shape, c, data):
    shape, dtype = c["shape"], c["dtype"]
    if long_rows:  # more than a column block (2048): the forward splits the columns
        shape = shape[:-1] + (data.draw(st.sampled_from([2049, 4500]), "n"),)
    n = shape[-1]
    layout = data.draw(layouts(len(shape), broadcast_last=True), "layout")
    param_dtype = data.draw(st.sampled_from([dtype, torch.float32]), "param_dtype")
    x = drawn(shape, dtype, layout, c["scale"], c["shift"], c["gen"])
    strided = data.draw(st.booleans(), "strided weight")
    w = param(n, param_dtype, c["gen"], strided)
    b = None
    if bias_shape is not None:
        b = (torch.randn(bias_shape, generator=c["gen"])).to(param_dtype).to(DEVICE).requires_grad_()
    dy = torch.randn(shape[:-1], generator=c["gen"]).to(dtype).to(DEVICE)

    res = check(lambda x, w, b: F.weighted_sum(x, view(w, strided), b, use_triton=True),  # (no row limits to shrink)
                lambda x, w, b: reference.weighted_sum(x, view(w, strided), None if b is None else b.reshape(())),
                dict(x=x, weight=w, bias=b), dy=dy,
                summed=dict(y=n, weight=rows_of(shape), bias=rows_of(shape)))  # y: a sum over the row
    assert res.y.dtype == dtype and res.y.shape == shape[:-1]
    for name, t in (("weight", w), ("bias", b)):
        if t is not None:
            assert res.grads[name].dtype == param_dtype and res.grads[name].shape == t.shape


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_weighted_sum_tuning_times_each_config_on_cpu(monkeypatch, capsys):
    """tune_weighted_sum with the timer patched out: each combination of the grids runs our
    forward or backward under its knobs (a spy on the launcher's tile), the default is found in
    the results, and the launch settings are the default again after."""
    from benchmarks.dev import tune_weighted_sum
    from triton_layers import launch_config

    from triton_layers.kernels import _weighted_sum_rules

    runs = fake_gpu_timer(monkeypatch)
    seen = []
    tile_2d = _weighted_sum_rules.tile_2d

    def spy(rows, cols, elem_size, cfg, aligned=True, tile_bytes=None):
        seen.append((tile_bytes or cfg.tile_bytes, cfg.bwd_stages))
        return tile_2d(rows, cols, elem_size, cfg, aligned, tile_bytes)
    monkeypatch.setattr(_weighted_sum_rules, "tile_2d", spy)
    monkeypatch.setattr(tune_weighted_sum, "FWD_GRIDS", {4: {"fwd_tile_bytes_4byte": [512, 16384],
                                                             "fwd_stages_4byte": [None]}})
    monkeypatch.setattr(tune_weighted_sum, "BWD_GRID", {"tile_bytes": [512, 8192], "bwd_stages": [None, 2]})
    tune_weighted_sum.main(["--shapes", "5x70", "--dtypes", "float32"])
    assert len(runs) == 2 + 4
    # the fp32 forward's own tile (512, 16384), the backward's tile_bytes with its stages
    assert {(512, 2), (16384, 2), (512, None), (8192, 2)} <= set(seen)
    out = capsys.readouterr().out
    assert "fwd default 1.0 us" in out and "bwd default 1.0 us" in out
    assert launch_config.current() is launch_config.DEFAULT


# ------------------------------------------------ past 2**31 elements (tests/big_tensors.py; GPU: run alone)


@pytest.mark.parametrize("shape", [(rows_past(cols(32768)), cols(32768)), (2, BIG // 2 + 3)],
                         ids=["many-rows", "two-long-rows"])
def test_weighted_sum_past_2_31(gpu_memory, shape):
    gpu_memory(16)  # x, dx: 2 x 4 GiB in bf16, plus the checks
    n_rows, n_cols = shape
    x = randn(shape).requires_grad_()
    w = randn(n_cols, torch.float32, 1).requires_grad_()
    b = torch.tensor(0.25, device=DEVICE, requires_grad=True)
    y = F.weighted_sum(x, w, b)
    dy = randn(n_rows, seed=2)
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


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

x_, w8, OTHER = bad.x_, bad.w8, bad.OTHER
BAD_INPUTS = [
    bad.Case("ws-dtype-int", lambda: F.weighted_sum(torch.ones(2, 8, dtype=torch.int64, device=DEVICE), w8()),
         (TypeError, r"x has dtype torch.int64")),
    bad.Case("ws-weight-dtype", lambda: F.weighted_sum(x_(2, 8), torch.ones(8, dtype=torch.int32, device=DEVICE)),
         (TypeError, r"weight has dtype torch.int32")),
    bad.Case("ws-weight-shape", lambda: F.weighted_sum(x_(2, 8), torch.ones(1, 8, device=DEVICE)),
         (ValueError, r"weight must have shape \(8,\), got \(1, 8\)")),
    bad.Case("ws-bias-shape", lambda: F.weighted_sum(x_(2, 8), w8(), torch.ones(2, device=DEVICE)),
         (ValueError, r"bias must be a scalar: shape \(\) or \(1,\), got \(2,\)")),
    bad.Case("ws-0dim", lambda: F.weighted_sum(torch.tensor(1.0, device=DEVICE), torch.ones((), device=DEVICE)),
         (ValueError, r"x must have at least one dim")),
    bad.Case("ws-mixed-devices", lambda: F.weighted_sum(x_(2, 8), w8(device=OTHER)),
         (ValueError, rf"one device; got x on {DEVICE}.*, weight on {OTHER}")),
    bad.Case("ws-wrong-device", lambda: F.weighted_sum(x_(2, 8, device="meta"), w8(device="meta"), use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor")),
    bad.Case("ws-empty-rows", lambda: bad.with_x(lambda x: F.weighted_sum(x, w8()), x_(0, 8)), bad.empty_result((0,))),
    bad.Case("ws-empty-dim",
         lambda: F.weighted_sum(x_(3, 0), torch.ones(0, device=DEVICE), torch.tensor(0.5, device=DEVICE)),
         lambda y: torch.testing.assert_close(y, torch.full((3,), 0.5, device=DEVICE))),
    bad.Case("ws-noncontiguous", *bad.same_as_contiguous(lambda x: F.weighted_sum(x, torch.linspace(-1, 1, 8, device=DEVICE)), 8, 5)),
    bad.Case("ws-module-dim", lambda: WeightedSum(-1), (ValueError, r"dim must be an int >= 0, got -1")),
    bad.Case("ws-module-dim-type", lambda: WeightedSum(8.0), (TypeError, r"dim must be an int, got 8.0 \(float\)")),
    bad.Case("ws-module-x-dim", lambda: WeightedSum(8, device=DEVICE)(x_(2, 7)),
         (ValueError, r"x of shape \(2, 7\) must end with dim=8")),
]
BAD_CONFIGS = [
    (WeightedSum, (True,), {}, TypeError, r"dim must be an int, got True \(bool\)"),
    (WeightedSum, ("8",), {}, TypeError, r"dim must be an int, got '8' \(str\)"),
    (WeightedSum, (8,), {"bias": "yes"}, TypeError, r"bias must be True or False"),
    (WeightedSum, (8,), {"use_triton": "auto"}, TypeError, r"use_triton must be None, True or False"),
]
test_bad_input = bad.tests_of(BAD_INPUTS)
test_bad_module_config = bad.config_tests_of(BAD_CONFIGS)


def test_a_module_of_dim_0_builds():
    assert WeightedSum(0).weight.shape == (0,)
