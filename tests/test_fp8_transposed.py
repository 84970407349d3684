"""The 1x128 recipe's transposed copy (``FP8Recipe("per_group", transposed=True)``): the
output's rows seen as H x M and quantized in 128-row blocks along M, what the weight-gradient
GEMM reads, written in the same call as the rows' 1x128 groups by a second launch (tiles of 128
rows, from the statistics the first stored). Each case
against the reference (``reference.quantize_fp8_transposed`` of the fp32 norm), counting the
FP8 values an fp32 rounding of the statistics moved, as tests/test_fp8_norms.py does; the
reference against an independent definition; rows not a multiple of 128 (the ragged last
block) and fewer than 128; the straight-through gradient; the custom op's shapes; the
compiled door."""
import pytest
import torch

import triton_layers
from triton_layers import FP8Recipe, FP8Rows, functional as F, reference
from triton_layers.kernels import norm_fp8 as kernel
from tests.test_fp8_norms import RMS_EPS, check_quantized, check_rows

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def check_transposed(got: FP8Rows, want: tuple, recipe: FP8Recipe) -> None:
    """``got``'s transposed copy equals the reference's ``(data_t, scale_t)`` as
    :func:`check_rows` has it (at most one FP8 step where the fp32 statistics' rounding moved a
    value, in at most 1% of them), both contiguous."""
    assert got.data_t.is_contiguous() and got.scale_t.is_contiguous() and got.scale_t.dtype == torch.float32
    check_quantized(got.data_t, got.scale_t, *want, recipe)


def want_of(x, w, b, recipe, rms, residual=None):
    """The reference's ``(data, scale, h, y)`` and ``(data_t, scale_t)``."""
    want = reference.norm_fp8(x, w, b, RMS_EPS if rms else 1e-5, recipe, rms=rms, residual=residual)
    return want, reference.quantize_fp8_transposed(want[3].detach(), recipe)


# (norm, fp8 dtype, pow2 scales, x's shape, x's dtype): rows under 128, ragged, several blocks, 3-D
CASES = [
    ("rms", E4M3, False, (130, 256), torch.float32),
    ("rms", E5M2, True, (37, 384), torch.bfloat16),
    ("layer", E4M3, True, (2, 70, 256), torch.bfloat16),
    ("layer", E5M2, False, (5, 128), torch.float32),
]


@pytest.mark.parametrize("norm,fp8,pow2,shape,x_dtype", CASES,
                         ids=["rms-e4m3-ragged", "rms-e5m2-pow2-37rows", "layer-e4m3-pow2-3d", "layer-e5m2-5rows"])
def test_transposed_equals_the_reference(device, norm, fp8, pow2, shape, x_dtype):
    n = shape[-1]
    x = (torch.randn(shape, device=device) * 3 + 0.5).to(x_dtype)
    w = torch.randn(n, device=device)
    b = torch.randn(n, device=device) if norm == "layer" else None
    recipe = FP8Recipe("per_group", fp8, pow2_scales=pow2, transposed=True)
    got = (F.rms_norm_fp8(x, w, recipe=recipe) if norm == "rms"
           else F.layer_norm_fp8(x, w, b, recipe=recipe))
    want, want_t = want_of(x, w, b, recipe, norm == "rms")
    check_rows(got, want, recipe)
    check_transposed(got, want_t, recipe)
    rows = x.numel() // n
    assert got.data_t.shape == (n, rows) and got.scale_t.shape == (n, -(-rows // 128))
    assert got.activation is None


@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.bfloat16], ids=["h_fp32", "h_bf16"])
def test_fused_residual(device, residual_dtype):
    """Fused add + RMSNorm: h written, and both copies the norm of that h (the copy's launch
    reads h back)."""
    m, n = 133, 256
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    r = torch.randn(m, n, device=device, dtype=residual_dtype)
    w = torch.randn(n, device=device)
    recipe = FP8Recipe("per_group", transposed=True)
    got = F.rms_norm_fp8(x, w, recipe=recipe, residual=r)
    torch.testing.assert_close(got.h, x.to(residual_dtype) + r, rtol=2 ** -7 if residual_dtype == torch.bfloat16
                               else 0, atol=0)  # (the interpreter's bf16 rounding: tests/test_fp8_norms.py)
    want, want_t = want_of(got.h, w, None, recipe, True)
    check_rows(got, (*want[:2], got.h), recipe)
    check_transposed(got, want_t, recipe)


def test_layer_norm_residual_and_column_major_scales(device):
    """LayerNorm with a bias and the residual, the rows' scales column-major: ``scale`` in
    DeepGEMM's layout, ``scale_t`` row-major still."""
    m, n = 21, 256
    x = torch.randn(m, n, device=device) * 2 + 1.0
    r = torch.randn(m, n, device=device)
    w, b = torch.randn(n, device=device), torch.randn(n, device=device)
    recipe = FP8Recipe("per_group", column_major_scales=True, transposed=True)
    got = F.layer_norm_fp8(x, w, b, recipe=recipe, residual=r)
    want, want_t = want_of(got.h, w, b, recipe, False)
    check_rows(got, (*want[:2], got.h), recipe)
    assert got.scale.stride() == (1, 24)
    check_transposed(got, want_t, recipe)


@pytest.mark.parametrize("norm", ["rms-residual", "layer"])
def test_ragged_column_tiles(device, norm):
    """Columns not a multiple of the copy's tile (384 in tiles of 256: the second half masked)
    and rows of two 128-row blocks, the last ragged (140 = 128 + 12)."""
    m, n = 140, 384
    x = torch.randn(m, n, device=device) * 2 + 0.25
    w, b = torch.randn(n, device=device), torch.randn(n, device=device)
    r = torch.randn(m, n, device=device, dtype=torch.bfloat16) if norm == "rms-residual" else None
    recipe = FP8Recipe("per_group", torch.float8_e5m2 if r is None else E4M3, pow2_scales=r is None,
                       transposed=True)
    with triton_layers.launch_config.use_knobs("layer_norm", fp8_transposed_block_n=256):
        args = (x, r, w, None, None, 1e-6, True, False, False, x.dtype, E4M3, "per_group", False, 0.0, False, False)
        (_, copy) = kernel._plan_forward(*args, True).launches
        assert copy.grid == (2, 2) and copy.constexprs["BLOCK_N"] == 256
        got = (F.rms_norm_fp8(x, w, recipe=recipe, residual=r) if r is not None
               else F.layer_norm_fp8(x, w, b, recipe=recipe))
    z = x if r is None else got.h
    want, want_t = want_of(z, w, None if r is not None else b, recipe, r is not None)
    check_rows(got, (*want[:2], got.h), recipe)
    check_transposed(got, want_t, recipe)
    assert got.data_t.shape == (n, m) and got.scale_t.shape == (n, 2)


def test_a_nan_row_spoils_its_block_only(device):
    """A row holding NaN normalizes to NaN: its 1x128 groups, and in the transposed copy every
    column's block holding that row (torch's amax keeps the NaN), as the reference's; the
    other block keeps its values."""
    m, n = 140, 128
    x = torch.randn(m, n, device=device)
    x[131, 7] = float("nan")
    recipe = FP8Recipe("per_group", transposed=True)
    got = F.rms_norm_fp8(x, None, recipe=recipe)
    want_t = want_of(x, None, None, recipe, True)[1]
    assert torch.equal(got.data_t.view(torch.uint8), want_t[0].view(torch.uint8))
    assert got.scale_t[:, 1].isnan().all() and not got.scale_t[:, 0].isnan().any()
    torch.testing.assert_close(got.scale_t, want_t[1], rtol=4 * 2.0 ** -23, atol=0, equal_nan=True)


def test_the_reference_against_an_independent_definition():
    """Each column's scale is the amax of its 128-row block (the last: the rows left) / 448,
    and data_t * scale_t gives y.T back to FP8's precision."""
    x = torch.randn(300, 256, dtype=torch.float64) * 2
    w = torch.randn(256, dtype=torch.float64)
    recipe = FP8Recipe("per_group", transposed=True)
    y = reference.norm_fp8(x, w, None, 1e-6, recipe, rms=True)[3].detach()
    data_t, scale_t = reference.quantize_fp8_transposed(y, recipe)
    assert data_t.shape == (256, 300) and scale_t.shape == (256, 3)
    for block, (lo, hi) in enumerate(((0, 128), (128, 256), (256, 300))):
        torch.testing.assert_close(scale_t[:, block].double(), y[lo:hi].abs().amax(0).double() / 448, rtol=1e-6,
                                   atol=0)
        back = data_t[:, lo:hi].double() * scale_t[:, block, None].double()
        want = y[lo:hi].t().double()
        assert ((back - want).abs() <= want.abs() * 2.0 ** -4 + scale_t[:, block, None] * 2.0 ** -9).all()
    # the rows' copy is the per-group recipe's, unchanged by the option
    plain = reference.quantize_fp8(y, FP8Recipe("per_group"))
    assert torch.equal(reference.quantize_fp8(y, recipe)[0].view(torch.uint8), plain[0].view(torch.uint8))


def test_only_the_1x128_recipe():
    for granularity in ("per_tensor", "per_token"):
        with pytest.raises(ValueError, match=f"granularity 'per_group'\\); got it with granularity '{granularity}'"):
            FP8Recipe(granularity, transposed=True)
    with pytest.raises(TypeError, match="transposed must be a bool"):
        FP8Recipe("per_group", transposed=1)


def test_the_plan(device):
    """Two launches: the per-group recipe's own as without the option (but storing the rows'
    statistics, which the copy's launch reads), then a program per 128 rows and
    fp8_transposed_block_n columns (fewer rows: one block of them, a power of two)."""
    x = torch.randn(300, 256, device=device)
    args = (x, None, None, None, None, 1e-6, True, False, False, x.dtype, E4M3, "per_group", False, 0.0, False,
            False)
    rows, copy = kernel._plan_forward(*args, True).launches
    (plain,) = kernel._plan_forward(*args, False).launches
    assert rows.kernel is plain.kernel is kernel._norm_fp8_kernel and rows.grid == plain.grid
    assert rows.scalars == plain.scalars and rows.constexprs == dict(plain.constexprs, STORE_STATS=True)
    block_n = triton_layers.launch_config.current().layer_norm.fp8_transposed_block_n
    assert copy.kernel is kernel._norm_fp8_t_tile_kernel and copy.grid == (3, -(-256 // block_n))
    assert copy.constexprs["BLOCK_M"] == 128 and copy.constexprs["BLOCK_N"] == block_n
    (_, few) = kernel._plan_forward(x[:37], *args[1:], True).launches
    assert few.grid == (1, -(-256 // block_n)) and few.constexprs["BLOCK_M"] == 64


def test_straight_through_gradients(device):
    """The activation's gradient is the per-group recipe's without the option (the copy adds
    none); data_t and scale_t carry none."""
    m, n = 9, 256
    x0, w0, g = torch.randn(m, n, device=device), torch.randn(n, device=device), torch.randn(m, n, device=device)
    grads = []
    for transposed in (True, False):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        recipe = FP8Recipe("per_group", transposed=transposed)
        out = F.rms_norm_fp8(x, w, recipe=recipe)
        if transposed:
            assert not out.data_t.requires_grad and not out.scale_t.requires_grad
            check_transposed(out, want_of(x.detach(), w.detach(), None, recipe, True)[1], recipe)
        else:
            assert out.data_t is None and out.scale_t is None
        grads.append(torch.autograd.grad((out.activation * g).sum(), (x, w)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_module_and_empty_rows(device):
    m = triton_layers.TritonRMSNorm(128, fp8=FP8Recipe("per_group", transposed=True), device=device)
    x = torch.randn(2, 3, 128, device=device)
    with torch.no_grad():
        got = m(x)
    want, want_t = want_of(x, m.weight.detach(), None, m.fp8, True)
    check_rows(got, want, m.fp8)
    check_transposed(got, want_t, m.fp8)
    got = F.rms_norm_fp8(torch.randn(0, 256, device=device), recipe=FP8Recipe("per_group", transposed=True))
    assert got.data_t.shape == (256, 0) and got.scale_t.shape == (256, 0)


def test_plan_cache_fuzz(device):
    """The same shapes with and without the option, in a random order: a plan key that missed
    it would hand one call the other's plan."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(8):
        rows = (3, 129)[torch.randint(2, (1,), generator=gen).item()]
        transposed = bool(torch.randint(2, (1,), generator=gen).item())
        recipe = FP8Recipe("per_group", transposed=transposed)
        x = torch.randn(rows, 128, generator=gen).to(device)
        got = F.rms_norm_fp8(x, None, recipe=recipe)
        want, want_t = want_of(x, None, None, recipe, True)
        check_rows(got, want, recipe)
        if transposed:
            check_transposed(got, want_t, recipe)
        else:
            assert got.data_t is None


def test_the_custom_ops_shapes():
    """The compiled door's custom op (``triton_layers::norm_fp8_fwd``) on fake tensors: the
    transposed copy's shapes and dtypes, empty without the option (what Inductor allocates)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(300, 256, dtype=torch.bfloat16)
        for transposed in (True, False):
            out = kernel.norm_fp8.forward_op(x, None, None, None, None, 1e-6, True, False, False, x.dtype, E5M2,
                                             "per_group", False, 0.0, False, False, transposed)
            data, scale, _, _, data_t, scale_t = out
            assert data.shape == (300, 256) and scale.shape == (300, 2)
            if transposed:
                assert data_t.shape == (256, 300) and data_t.dtype == E5M2 and data_t.stride() == (300, 1)
                assert scale_t.shape == (256, 3) and scale_t.dtype == torch.float32
            else:
                assert data_t.numel() == 0 and scale_t.numel() == 0


def test_compile_fullgraph(device):
    """torch.compile(fullgraph=True): on a GPU the kernel's custom op, on the CPU the reference
    (the interpreter cannot be traced: docs); both give the eager reference's copy."""
    x = torch.randn(130, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, device=device, dtype=torch.bfloat16)
    recipe = FP8Recipe("per_group", transposed=True)

    def f(x, w):
        out = F.rms_norm_fp8(x, w, recipe=recipe)
        return out.data, out.scale, out.data_t, out.scale_t

    torch._dynamo.reset()
    data, scale, data_t, scale_t = torch.compile(f, fullgraph=True)(x, w)
    want, want_t = want_of(x, w, None, recipe, True)
    got = FP8Rows(data, scale, None, None, data_t, scale_t)
    check_rows(got, want, recipe)
    check_transposed(got, want_t, recipe)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the training shape on a GPU")
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
def test_training_shape_on_the_gpu(rms):
    x = torch.randn(4100, 4096, device="cuda", dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, device="cuda")).to(torch.bfloat16)
    r = torch.randn_like(x)
    recipe = FP8Recipe("per_group", transposed=True)
    got = F.rms_norm_fp8(x, w, recipe=recipe, residual=r) if rms else F.layer_norm_fp8(x, w, None, recipe=recipe,
                                                                                        residual=r)
    torch.testing.assert_close(got.h, x + r, rtol=0, atol=0)
    want, want_t = want_of(got.h, w, None, recipe, rms)
    check_rows(got, (*want[:2], got.h), recipe)
    check_transposed(got, want_t, recipe)
