"""TritonRMSNorm / functional.rms_norm: the kernels against torch's own RMSNorm in float64,
the reference, and nn.RMSNorm (state_dicts, convert). The fused residual and out_dtype of
both norms are tested in test_fused_residual.py, Hugging Face's RMSNorms in
test_convert_norms.py."""
import dataclasses

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import triton_layers
from triton_layers import TritonRMSNorm, reference
from triton_layers import functional as F
from triton_layers import launch_config
from triton_layers.kernels import ops as kernel_ops

from .conftest import DEVICE, DTYPES, H100
from . import bad_inputs as bad
from .oracle import check, compare

SIZES = [1, 7, 127, 1000]
EPS32 = torch.finfo(torch.float32).eps  # torch's default eps for RMSNorm of fp16/bf16/fp32


def _inputs(rows, n, dtype, device, param_dtype=None, unit_offset=False):
    x = (torch.randn(rows, n, device=device) * 2 + 0.5).to(dtype).requires_grad_()
    w = ((0 if unit_offset else 1) + 0.5 * torch.randn(n, device=device)).to(param_dtype or dtype).requires_grad_()
    return x, w


def _torch_rms_norm(x, w, eps, unit_offset):
    """torch's TF.rms_norm (Gemma's form: the weight 1 + w)."""
    return TF.rms_norm(x, x.shape[-1:], None if w is None else (1 + w if unit_offset else w), eps)


def _check_against_float64(x, w, eps=None, unit_offset=False, use_triton=None):
    """Output and gradients against torch's F.rms_norm in float64 (an independent
    definition); torch's own result in x's dtype sets the fp16/bf16 bar (not with an fp32
    weight: there the exact value rounded to x's dtype does)."""
    eps64 = EPS32 if eps is None else eps
    inputs = dict(x=x) if w is None else dict(x=x, weight=w)
    res = check(lambda x, weight=None: F.rms_norm(x, weight, eps, unit_offset=unit_offset, use_triton=use_triton),
                lambda x, weight=None: _torch_rms_norm(x, weight, eps64, unit_offset),
                inputs, lowp=w is None or w.dtype == x.dtype, summed=dict(weight=x.shape[0]))
    assert res.y.dtype == x.dtype and res.y.shape == x.shape


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_backward_match_float64(n, dtype, device):
    _check_against_float64(*_inputs(9, n, dtype, device), eps=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unit_offset_matches_definition(dtype, device):
    """Gemma's form: norm(x) * (1 + weight), weight around 0."""
    _check_against_float64(*_inputs(9, 300, dtype, device, unit_offset=True), eps=1e-6, unit_offset=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mixed_precision_fp32_weight(dtype, device):
    x, w = _inputs(9, 1000, dtype, device, param_dtype=torch.float32)
    y = F.rms_norm(x, w)
    assert y.dtype == dtype
    y.backward(torch.randn_like(y))
    assert w.grad.dtype == torch.float32 and x.grad.dtype == dtype
    _check_against_float64(*_inputs(9, 1000, dtype, device, param_dtype=torch.float32))


@pytest.mark.parametrize("n", [300, 1000])
@pytest.mark.parametrize("looped", ["medium"], indirect=True)
def test_long_rows_looped_path(n, looped, device):
    _check_against_float64(*_inputs(11, n, torch.float32, device), eps=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_kept_whole_past_layer_norms_limit(dtype, device):
    """Rows of 12,000 at the real limits: RMSNorm's backward keeps them whole (over
    LayerNorm's bwd_max_fused_cols and bwd_long_row, up to bwd_rms_max_fused_cols)."""
    limits = launch_config.DEFAULT.layer_norm
    assert max(limits.bwd_max_fused_cols, limits.bwd_long_row) < 12000 <= limits.bwd_rms_max_fused_cols
    _check_against_float64(*_inputs(3, 12000, dtype, device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_row_weight_per_tile(dtype, device):
    """Whole rows of more than bwd_long_row columns load the weight per tile instead of holding
    it (bwd_long_row_weight_per_tile; bwd_long_row lowered to 32, rows of 40): the launch says so,
    not for rows of bwd_long_row, and the gradients are those of the weight held (the same arithmetic on
    the same values: the same bits under the interpreter, within one rounding on a GPU), against
    float64 too."""
    limits = launch_config.TINY.with_knobs("layer_norm", bwd_rms_max_fused_cols=64, bwd_long_row=32).layer_norm
    assert limits.bwd_long_row_weight_per_tile
    x, w = _inputs(6, 40, dtype, device)
    dy = torch.randn_like(x)
    grads = {}
    for per_tile in (True, False):
        config = dataclasses.replace(launch_config.TINY, layer_norm=dataclasses.replace(
            limits, bwd_long_row_weight_per_tile=per_tile))
        with launch_config.use_config(config):
            for n, expected in ((40, per_tile), (32, False)):
                launches = kernel_ops.norm.record_launches(x[:, :n], w[:n], None, 1e-5, True, False, False, False,
                                                           dtype)
                assert [kw["WEIGHT_PER_TILE"] for _, _, kw in launches if "WEIGHT_PER_TILE" in kw] == [expected]
            grads[per_tile] = torch.autograd.grad(F.rms_norm(x, w, 1e-5), [x, w], dy)
    for name, a, b in zip(("dx", "dweight"), grads[True], grads[False]):
        if device == "cpu":
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    _check_against_float64(x, w, eps=1e-5)


def test_long_row_prefetch_counts_the_weight():
    """The whole-row backward's prefetch stages count the weight's buffer where a tile loads
    it: fp32 rows of 16,384 with the residual's gradient (z, dy, dh and the weight: 256 KB a
    stage) at bwd_long_row_stages = 2 get 1 stage on a GPU of 227 KB a program (2 do not fit:
    the launch failed), 2 with the weight held (192 KB). Planned on meta tensors as on an H100
    (launch_config.plan_as: its SMs, shared memory and name)."""
    assert H100.shared_memory == 232448

    def planned(per_tile: bool) -> list:
        meta = lambda *shape: torch.empty(*shape, device="meta").requires_grad_()  # noqa: E731
        with launch_config.plan_as(H100), launch_config.use_knobs(
                "layer_norm", bwd_long_row_stages=2, bwd_long_row_weight_per_tile=per_tile):
            launches = kernel_ops.residual_norm.record_launches(
                meta(4, 16384), meta(4, 16384), meta(16384), None, 1e-6, True, False, False, False,
                torch.float32, torch.float32)
        return [kw["NUM_STAGES"] for _, _, kw in launches if "WEIGHT_PER_TILE" in kw]

    assert planned(True) == [1]
    assert planned(False) == [2]


def test_no_weight(device):
    x = torch.randn(6, 300, device=device).requires_grad_()
    _check_against_float64(x, None)


def test_default_eps_is_torchs(device):
    """eps=None is what torch's TF.rms_norm takes for None: the fp32 epsilon, for bf16 too
    (torch.finfo(bf16).eps, 0.0078, would change rows of small values by percents)."""
    x = (torch.randn(4, 64, device=device) * 1e-2).bfloat16()
    ours, torchs = F.rms_norm(x), TF.rms_norm(x, (64,))
    assert (ours.float() - torchs.float()).abs().max() <= 2 * 2**-8 * torchs.float().abs().max()
    big_eps = TF.rms_norm(x, (64,), eps=torch.finfo(torch.bfloat16).eps)
    assert (big_eps.float() - torchs.float()).abs().max() > 0.1


@pytest.mark.parametrize("needs", ["x", "weight"])
def test_only_requested_gradients(needs, device):
    x, w = _inputs(5, 70, torch.float32, device)
    x.requires_grad_(needs == "x")
    w.requires_grad_(needs == "weight")
    y = F.rms_norm(x, w)
    y.backward(torch.randn_like(y))
    assert (x.grad is None) == (needs != "x") and (w.grad is None) == (needs != "weight")


def test_reference_matches_torch_rms_norm():
    x, w = torch.randn(8, 77, dtype=torch.float64) * 3 + 1, torch.randn(77, dtype=torch.float64)
    torch.testing.assert_close(reference.rms_norm(x, w, 1e-6), TF.rms_norm(x, (77,), w, 1e-6))
    torch.testing.assert_close(reference.rms_norm(x, w, 1e-6, unit_offset=True), TF.rms_norm(x, (77,), 1 + w, 1e-6))


def test_paths_agree_and_force_reference(device):
    x, w = _inputs(4, 100, torch.float32, device)
    y_kernel = F.rms_norm(x, w, use_triton=None)
    y_ref = F.rms_norm(x, w, use_triton=False)
    torch.testing.assert_close(y_kernel, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_ref, reference.rms_norm(x, w, EPS32), rtol=0, atol=0)


def test_backward_is_bitwise_deterministic(device):
    x, w = _inputs(300, 200, torch.bfloat16, device, param_dtype=torch.float32)
    dy = torch.randn_like(x)
    runs = [torch.autograd.grad(F.rms_norm(x, w), (x, w), dy) for _ in range(2)]
    for a, c in zip(*runs):
        assert torch.equal(a, c)


# --- the module ---------------------------------------------------------------------------


def test_module_parameters_and_repr():
    norm = TritonRMSNorm(32)
    assert [n for n, _ in norm.named_parameters()] == ["weight"] and not list(norm.buffers())
    assert torch.equal(norm.weight, torch.ones(32)) and norm.eps is None
    gemma = TritonRMSNorm(32, unit_offset=True, dtype=torch.bfloat16)
    assert torch.equal(gemma.weight, torch.zeros(32, dtype=torch.bfloat16)) and "unit_offset=True" in repr(gemma)
    assert not list(TritonRMSNorm(32, elementwise_affine=False).parameters())
    assert "(32,), eps=None" in repr(norm)
    norm.variance_epsilon = 1e-6  # Hugging Face's name for it
    assert norm.eps == 1e-6


def test_state_dict_interop_with_torch(device):
    """A state_dict loads strictly into nn.RMSNorm of the same shape and back; outputs agree."""
    torch_norm = nn.RMSNorm((4, 12), device=device)
    with torch.no_grad():
        torch_norm.weight.normal_()
    ours = TritonRMSNorm((4, 12), device=device)
    ours.load_state_dict(torch_norm.state_dict(), strict=True)
    x = torch.randn(5, 4, 12, device=device)
    torch.testing.assert_close(ours(x), torch_norm(x), rtol=1e-5, atol=1e-5)
    back = nn.RMSNorm((4, 12), device=device)
    back.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(back(x), torch_norm(x))
    assert torch.equal(TritonRMSNorm.from_torch(torch_norm).weight, torch_norm.weight)


def test_convert_swaps_nn_rms_norm(device):
    model = nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32, eps=1e-6), nn.Linear(32, 8), nn.RMSNorm(8),
                          nn.LayerNorm(8)).to(device)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(3, 16, device=device)
    before = model(x)
    converted, summary = triton_layers.convert(model, return_summary=True)
    assert converted is model and dict(summary.replaced) == {"RMSNorm": 2, "LayerNorm": 1}
    assert not any(type(m) in (nn.RMSNorm, nn.LayerNorm) for m in model.modules())
    assert isinstance(model[1], TritonRMSNorm) and model[1].eps == 1e-6 and model[3].eps is None
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)


def test_module_residual_and_training(device):
    norm = TritonRMSNorm(40, device=device)
    x, r = torch.randn(16, 40, device=device), torch.randn(16, 40, device=device)
    y, h = norm(x, r)
    torch.testing.assert_close(h, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, norm(x + r), rtol=0, atol=0)
    opt = torch.optim.SGD(norm.parameters(), lr=0.5)
    target = torch.randn(16, 40, device=device)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = (norm(x, r)[0] - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_torch_compile_fullgraph(device):
    """Kernel path under torch.compile(fullgraph=True) on the GPU, the reference on the CPU
    (interpreted kernels cannot be traced, docs/ARCHITECTURE.md), with a residual."""
    on_gpu = device == "cuda"
    fn = torch.compile(
        lambda x, r, w: F.rms_norm(x, w, 1e-6, residual=r, use_triton=on_gpu),
        fullgraph=True, dynamic=False, backend="inductor" if on_gpu else "aot_eager",
    )
    x, w = _inputs(6, 300, torch.float32, device)
    r = torch.randn(6, 300, device=device, requires_grad=True)
    y, h = fn(x, r, w)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    torch.autograd.backward((y, h), (dy, dh))
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    h64 = x64 + r64
    y64 = TF.rms_norm(h64, (300,), w64, 1e-6)
    torch.autograd.backward((y64, h64), (dy.double(), dh.double()))
    compare(y, y64, name="y")
    compare(h, h64, name="h")
    for got, want, name in ((x.grad, x64.grad, "dx"), (r.grad, r64.grad, "dresidual"), (w.grad, w64.grad, "dw")):
        compare(got, want, rtol=1e-4, name=name)  # as the other ops' compile tests: Inductor's own reductions


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

x_, w8 = bad.x_, bad.w8
BAD_INPUTS = [
    bad.Case("rms-dtype-int", lambda: F.rms_norm(torch.ones(2, 8, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"x has dtype torch.int64; expected one of torch.float32")),
    bad.Case("rms-weight-shape", lambda: F.rms_norm(x_(2, 8), torch.ones(7, device=DEVICE)),
         (ValueError, r"x of shape \(2, 8\) does not end with normalized_shape \(7,\)")),
    bad.Case("rms-x-shape", lambda: TritonRMSNorm(8, device=DEVICE)(x_(2, 7)),
         (ValueError, r"x of shape \(2, 7\) does not end with normalized_shape \(8,\)")),
    bad.Case("rms-eps", lambda: F.rms_norm(x_(2, 8), eps=-1e-6), (ValueError, r"eps must be >= 0, got -1e-06")),
    bad.Case("rms-unit-offset-no-weight", lambda: TritonRMSNorm(8, elementwise_affine=False, unit_offset=True),
         (ValueError, r"unit_offset=True multiplies by 1 \+ weight: it needs elementwise_affine=True")),
    bad.Case("rms-empty-rows", lambda: bad.with_x(lambda x: F.rms_norm(x, w8()), x_(0, 8)), bad.empty_result((0, 8))),
    bad.Case("rms-noncontiguous", *bad.same_as_contiguous(lambda x: F.rms_norm(x, torch.ones(8, device=DEVICE) * 0.5), 8, 5)),
]
BAD_CONFIGS = [
    (TritonRMSNorm, ("16",), {}, TypeError, r"normalized_shape must be an int or a sequence of ints, got '16'"),
    (TritonRMSNorm, (8.0,), {}, TypeError, r"normalized_shape must be an int or a sequence of ints, got 8.0"),
    (TritonRMSNorm, ((),), {}, ValueError, r"normalized_shape must have at least one dim"),
    (TritonRMSNorm, (8,), {"eps": -1e-6}, ValueError, r"eps must be >= 0, got -1e-06"),
    (TritonRMSNorm, (8,), {"eps": "1e-6"}, TypeError, r"eps must be a number or None, got '1e-6' \(str\)"),
    (TritonRMSNorm, (8,), {"unit_offset": "no"}, TypeError, r"unit_offset must be True or False, got 'no'"),
    (TritonRMSNorm, (8,), {"elementwise_affine": 0}, TypeError, r"elementwise_affine must be True or False"),
    (TritonRMSNorm, (8,), {"use_triton": "yes"}, TypeError, r"use_triton must be None, True or False"),
]
test_bad_input = bad.tests_of(BAD_INPUTS)
test_bad_module_config = bad.config_tests_of(BAD_CONFIGS)
