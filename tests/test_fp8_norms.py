"""FP8 out of the norms (triton_layers/fp8.py, kernels/norm_fp8.py): every recipe against the
reference (the norm in fp32, the scale, torch's saturating cast), counting the FP8 values an
fp32 rounding of the statistics moved (each at most one FP8 step); the reference against an
independent definition; the straight-through gradients; the modules; and the FP8 cast itself
(Triton's interpreter's is not torch's, ours is). Bad inputs: docs/API.md's fp8-* rows."""
import math

import pytest
import torch
import triton
import triton.language as tl
import torch.nn.functional as TF

import triton_layers
from triton_layers import FP8Activation, FP8Recipe, FP8Rows, TritonLayerNorm, TritonRMSNorm, functional as F, reference
from triton_layers.fp8 import dequantize
from triton_layers.kernels.norm_fp8 import _quantize
from tests import bad_inputs as bad
from tests.conftest import DEVICE
from tests.fake_timer import fake_gpu_timer

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
RMS_EPS = torch.finfo(torch.float32).eps

# (granularity, extra recipe fields, static scale?)
RECIPES = [
    ("per_tensor", {}, True),
    ("per_tensor", {}, False),
    ("per_tensor", {"pow2_scales": True}, False),
    ("per_token", {}, False),
    ("per_token", {"pow2_scales": True}, False),
    ("per_token", {"scale_ub": 1.5}, False),
    ("per_group", {}, False),
    ("per_group", {"column_major_scales": True, "pow2_scales": True}, False),
]


def fp8_steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many FP8 values apart each pair is (+0 and -0 are one value)."""
    def index(t):
        bits = t.view(torch.uint8).to(torch.int32)
        mag = bits & 0x7F
        return torch.where(bits >= 128, -mag, mag)
    return (index(a) - index(b)).abs()


def check_rows(got: FP8Rows, want: tuple, recipe: FP8Recipe) -> None:
    """``got`` equals the reference's ``(data, scale, h, _)`` but where the fp32 statistics'
    rounding moved a value: at most one FP8 step, in at most 1% of the values (and the scales
    within 4 fp32 roundings, or for power-of-two scales equal but in 1% of them)."""
    data, scale, h = want[:3]
    check_quantized(got.data, got.scale, data, scale, recipe)
    if h is None:
        assert got.h is None
    else:
        assert got.h is not None and got.h.dtype == h.dtype and got.h.shape == h.shape


def check_quantized(data: torch.Tensor, scale: torch.Tensor, want_data: torch.Tensor, want_scale: torch.Tensor,
                    recipe: FP8Recipe, scale_atol_roundings: int = 0) -> None:
    """FP8 ``data`` and its ``scale`` against the reference's, as :func:`check_rows` says; with
    ``scale_atol_roundings``, a scale may also be that many fp32 roundings of the largest scale
    away (an amax over few values that nearly cancel, LayerNorm's ``zhat * w + b``: its error is
    the terms' roundings, not its own)."""
    assert data.dtype == recipe.dtype and data.shape == want_data.shape
    assert scale.shape == want_scale.shape and scale.stride() == want_scale.stride()
    steps = fp8_steps_apart(data, want_data)
    assert steps.numel() == 0 or steps.max().item() <= 1, f"an FP8 value {steps.max().item()} steps from the reference"
    assert steps.count_nonzero().item() <= max(2, want_data.numel() // 100), \
        f"{steps.count_nonzero().item()} of {want_data.numel()} FP8 values moved by a rounding"
    if recipe.pow2_scales:
        assert (scale != want_scale).count_nonzero().item() <= max(1, want_scale.numel() // 100)
    else:
        atol = scale_atol_roundings * 2.0 ** -23 * want_scale.abs().max().item() if want_scale.numel() else 0.0
        torch.testing.assert_close(scale, want_scale, rtol=4 * 2.0 ** -23, atol=atol)


def recipe_of(granularity, fields, dtype=torch.float8_e4m3fn) -> FP8Recipe:
    return FP8Recipe(granularity, dtype, **fields)


@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("granularity,fields,static", RECIPES)
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_recipes_equal_the_reference(device, rms, granularity, fields, static, fp8, x_dtype):
    m, n = 19, 384  # (odd rows; three groups of 128)
    x = (torch.randn(m, n, device=device) * 3 + 0.5).to(x_dtype)
    w = torch.randn(n, device=device)
    b = torch.randn(n, device=device) if not rms else None
    recipe = recipe_of(granularity, fields, fp8)
    scale = torch.tensor([0.0173], device=device) if static else None
    eps = RMS_EPS if rms else 1e-5
    if rms:
        got = F.rms_norm_fp8(x, w, recipe=recipe, scale=scale)
    else:
        got = F.layer_norm_fp8(x, w, b, recipe=recipe, scale=scale)
    check_rows(got, reference.norm_fp8(x, w, b, eps, recipe, scale, rms=rms), recipe)
    assert got.activation is None  # (no gradient asked)


@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.bfloat16], ids=["h_fp32", "h_bf16"])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_token", "per_group"])
def test_fused_residual(device, residual_dtype, granularity):
    m, n = 13, 256
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    r = torch.randn(m, n, device=device, dtype=residual_dtype)
    w = torch.randn(n, device=device)
    recipe = FP8Recipe(granularity)
    got = F.rms_norm_fp8(x, w, recipe=recipe, residual=r)
    want_h = (x.to(residual_dtype) + r)
    # (the interpreter rounds a bf16 h toward zero where the GPU rounds to nearest: one ulp)
    torch.testing.assert_close(got.h, want_h, rtol=2 ** -7 if residual_dtype == torch.bfloat16 else 0, atol=0)
    # the norm of the h the kernel wrote, by the reference
    check_rows(got, (*reference.norm_fp8(got.h, w, None, RMS_EPS, recipe, rms=True)[:2], got.h), recipe)



@pytest.mark.parametrize("rows,parts_max,cells", [(5, 1024, 0), (77, 1024, "programs"), (77, 2, 1)],
                         ids=["one_program", "amax_per_program", "atomic_cell"])
def test_dynamic_per_tensor_paths(device, rows, parts_max, cells):
    """The dynamic per-tensor scale's three paths (kernels/norm_fp8.py, the top): one launch
    where one program holds every row, else an amax a program read whole by the second
    launch, or past ``fp8_amax_parts_max`` programs one zeroed cell; each equal to the
    reference, with a residual, for both norms, NaN kept in a row holding one."""
    from triton_layers.kernels import norm_fp8 as kernel
    n = 256
    x = torch.randn(rows, n, device=device, dtype=torch.bfloat16) * 2 + 0.25
    r = torch.randn(rows, n, device=device, dtype=torch.bfloat16)
    w, b = torch.randn(n, device=device), torch.randn(n, device=device)
    recipe = FP8Recipe("per_tensor")
    with triton_layers.launch_config.use_knobs("layer_norm", fp8_tile_elements=2048, fp8_amax_parts_max=parts_max):
        plan = kernel._plan_forward(x, r, w, b, None, 1e-5, False, False, False, torch.bfloat16,
                                    recipe.dtype, "per_tensor", False, 0.0, False, False, False)
        programs = plan.launches[0].grid[0]
        assert plan.amax_cells == (programs if cells == "programs" else cells)
        assert len(plan.launches) == (1 if cells == 0 else 2)
        for rms in (True, False):
            got = (F.rms_norm_fp8(x, w, recipe=recipe, residual=r) if rms
                   else F.layer_norm_fp8(x, w, b, recipe=recipe, residual=r))
            want = reference.norm_fp8(got.h, w, None if rms else b, RMS_EPS if rms else 1e-5, recipe, rms=rms)
            check_rows(got, (*want[:2], got.h), recipe)
        bad = x.clone()
        bad[rows // 2, 3] = float("nan")
        got = F.rms_norm_fp8(bad, w, recipe=recipe)
        assert got.scale.isnan().all() and got.data.float().isnan().all()

def test_the_reference_against_an_independent_definition():
    """The reference's y is torch's rms_norm (float64), and data * scale gives it back to FP8's
    precision; the scales are amax / 448 (power of two: 2 ** ceil(log2) away from ties)."""
    x = torch.randn(33, 256, dtype=torch.float64) * 2
    w = torch.randn(256, dtype=torch.float64)
    y = TF.rms_norm(x, (256,), w, eps=1e-6)
    for granularity in ("per_tensor", "per_token", "per_group"):
        recipe = FP8Recipe(granularity)
        data, scale, _, y_ref = reference.norm_fp8(x, w, None, 1e-6, recipe, rms=True)
        torch.testing.assert_close(y_ref.double(), y, rtol=1e-6, atol=1e-6)
        back = dequantize(data, scale, granularity, torch.float64)
        # e4m3 keeps 3 mantissa bits: a relative error of 2**-4, or one step of the smallest
        # normal's exponent times the scale near zero
        assert ((back - y).abs() <= y.abs() * 2.0 ** -4 + scale.max() * 2.0 ** -9).all()
        if granularity == "per_token":
            torch.testing.assert_close(scale.double(), y.abs().amax(-1, keepdim=True) / 448, rtol=1e-6, atol=0)
    s = torch.tensor([0.3, 1.0, 1.0000001, 2.5, 4.0, 1e-20], dtype=torch.float32)
    assert reference.pow2_ceil(s).tolist() == [0.5, 1.0, 2.0, 4.0, 4.0, 2.0 ** math.ceil(math.log2(1e-20))]


@triton.jit
def _cast_kernel(V, Out, n, FP8_MAX: tl.constexpr, IS_E5M2: tl.constexpr, EXACT_CAST: tl.constexpr,
                 BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(V + i, mask=i < n, other=0.0)
    tl.store(Out + i, _quantize(v, 1.0, FP8_MAX, IS_E5M2, EXACT_CAST), mask=i < n)


def _cast_through_kernel(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (fp32) through the kernels' own cast, as the norm kernel casts (EXACT_CAST
    on the CPU, where Triton's interpreter runs it)."""
    n = values.numel()
    out = torch.empty(n, dtype=dtype, device=values.device)
    exact = not values.is_cuda
    _cast_kernel[(1,)](values, out.view(torch.uint8) if exact else out, n, FP8_MAX=float(torch.finfo(dtype).max),
                       IS_E5M2=dtype == torch.float8_e5m2, EXACT_CAST=exact, BLOCK=triton.next_power_of_2(n))
    return out


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_the_fp8_cast_is_torchs(device, fp8):
    """Our cast equals torch's saturating cast on every kind of value: subnormals, ties, the
    range's edge, overflow, NaN. (Triton's interpreter's own conversion is not torch's: it
    rounded values near the bottom binades wrongly, which our kernel's EXACT_CAST avoids.)"""
    fmax = torch.finfo(fp8).max
    grid = torch.arange(256, dtype=torch.uint8).view(fp8).float()
    grid = grid[grid.isfinite()]
    mids = (grid.sort().values[1:] + grid.sort().values[:-1]) / 2  # ties: round to even
    values = torch.cat([
        torch.randn(3000) * torch.logspace(-12, 5, 3000), grid, mids, mids.nextafter(torch.tensor(0.0)),
        torch.tensor([fmax, -fmax, fmax * 1.01, -fmax * 1e3, 1e30, float("inf"), -float("inf"), 0.0, -0.0,
                      float("nan")])])
    got = _cast_through_kernel(values.to(device), fp8).cpu()
    want = values.clamp(-fmax, fmax).to(fp8)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_straight_through_gradients(device, rms, with_residual):
    """The activation's gradient reaches x, the residual and the parameters as the norm's
    backward on it (the fp32 norm's, by autograd through the reference)."""
    check_straight_through(device, rms, with_residual, 11, 256)


def check_straight_through(device, rms, with_residual, m, n):
    """:func:`test_straight_through_gradients` at ``(m, n)`` rows, under the current launch config."""
    x = torch.randn(m, n, device=device, requires_grad=True)
    r = torch.randn(m, n, device=device, requires_grad=True) if with_residual else None
    w = torch.randn(n, device=device, requires_grad=True)
    b = None if rms else torch.randn(n, device=device, requires_grad=True)
    g, gh = torch.randn(m, n, device=device), torch.randn(m, n, device=device)
    recipe = FP8Recipe("per_group")
    out = (F.rms_norm_fp8(x, w, recipe=recipe, residual=r) if rms
           else F.layer_norm_fp8(x, w, b, recipe=recipe, residual=r))
    assert isinstance(out.activation, FP8Activation) and out.activation.dtype == x.dtype
    assert not out.data.requires_grad and not out.scale.requires_grad
    loss = (out.activation * g).sum() + ((out.h * gh).sum() if r is not None else 0)
    inputs = [t for t in (x, r, w, b) if t is not None]
    got = torch.autograd.grad(loss, inputs)
    y = reference.norm(x, w, b, RMS_EPS if rms else 1e-5, rms=rms, residual=r, out_dtype=torch.float32)
    y, h = y if r is not None else (y, None)
    want = torch.autograd.grad((y * g).sum() + ((h * gh).sum() if h is not None else 0), inputs)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)


def test_straight_through_low_precision(device):
    """bf16 inputs and weight: the gradients in their dtypes, within bf16 of the reference's."""
    x = torch.randn(9, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(256, device=device)).to(torch.bfloat16).requires_grad_()
    g = torch.randn(9, 256, device=device, dtype=torch.bfloat16)
    out = F.rms_norm_fp8(x, w, recipe=FP8Recipe("per_token"))
    dx, dw = torch.autograd.grad((out.activation * g).sum(), (x, w))
    assert dx.dtype == dw.dtype == torch.bfloat16
    y = reference.norm(x, w, None, RMS_EPS, rms=True)
    rx, rw = torch.autograd.grad((y * g).sum(), (x, w))
    torch.testing.assert_close(dx, rx, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dw, rw, rtol=2e-2, atol=5e-2)


def test_activation_is_the_dequantized_value(device):
    x = torch.randn(4, 3, 256, device=device, requires_grad=True)
    out = F.rms_norm_fp8(x, None, recipe=FP8Recipe("per_group"))
    act = out.activation
    torch.testing.assert_close(act.dequantize(), dequantize(out.data, out.scale, "per_group", x.dtype))
    # every torch op sees the dequantized value; detach keeps the FP8 form
    torch.testing.assert_close(act * 2, act.dequantize() * 2)
    assert isinstance(act.detach(), FP8Activation)
    assert out.scale.shape == (4, 3, 2)


def test_modules(device):
    m = triton_layers.TritonRMSNorm(256, fp8=FP8Recipe("per_token"), device=device)
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(2, 5, 256, device=device)
    got = m(x)
    check_rows(got, reference.norm_fp8(x, m.weight, None, RMS_EPS, m.fp8, rms=True), m.fp8)
    ln = triton_layers.TritonLayerNorm(256, fp8=FP8Recipe("per_tensor"), device=device)
    ln.fp8_scale = torch.tensor([0.05], device=device)
    r = torch.randn_like(x)
    got = ln(x, r)
    want = reference.norm_fp8(x, ln.weight, ln.bias, 1e-5, ln.fp8, ln.fp8_scale, residual=r)
    check_rows(got, want, ln.fp8)
    assert "fp8=FP8Recipe" in repr(m)
    # the state_dict is the module's without FP8 (loads both ways)
    assert set(m.state_dict()) == {"weight"}


def test_empty_and_one_row(device):
    for shape in ((0, 256), (1, 256), (2, 0, 128)):
        x = torch.randn(shape, device=device)
        for granularity in ("per_tensor", "per_token", "per_group"):
            recipe = FP8Recipe(granularity)
            got = F.rms_norm_fp8(x, None, recipe=recipe)
            check_rows(got, reference.norm_fp8(x, None, None, RMS_EPS, recipe, rms=True), recipe)


def test_rows_with_a_stride(device):
    """The q slice of a wider tensor: read where it is, no copy."""
    wide = torch.randn(7, 640, device=device)
    x = wide[:, :384]
    recipe = FP8Recipe("per_group", column_major_scales=True)
    got = F.rms_norm_fp8(x, None, recipe=recipe)
    check_rows(got, reference.norm_fp8(x, None, None, RMS_EPS, recipe, rms=True), recipe)
    assert got.scale.stride() == (1, 8)  # (7 rows rounded up to 8: TMA-aligned columns)


def test_plan_cache_fuzz(device):
    """Calls of random recipes, shapes and grad modes in a random order, each against the
    reference: a plan key that missed a recipe field would hand one call another's plan."""
    gen = torch.Generator().manual_seed(1)
    shapes = [(3, 128), (5, 256), (1, 384)]
    recipes = [recipe_of(g, f, d) for g, f, _ in RECIPES for d in FP8]
    for _ in range(40):
        shape = shapes[torch.randint(len(shapes), (1,), generator=gen).item()]
        recipe = recipes[torch.randint(len(recipes), (1,), generator=gen).item()]
        grad = bool(torch.randint(2, (1,), generator=gen).item())
        x = torch.randn(shape, generator=gen).to(device).requires_grad_(grad)
        got = F.rms_norm_fp8(x, None, recipe=recipe)
        check_rows(got, reference.norm_fp8(x.detach(), None, None, RMS_EPS, recipe, rms=True), recipe)
        assert (got.activation is not None) == grad


def test_float64_and_the_reference_path(device):
    x = torch.randn(5, 256, dtype=torch.float64, device=device)
    recipe = FP8Recipe("per_token")
    got = F.rms_norm_fp8(x, None, recipe=recipe)
    data, scale, _, _ = reference.norm_fp8(x, None, None, torch.finfo(torch.float64).eps, recipe, rms=True)
    assert torch.equal(got.data.view(torch.uint8), data.view(torch.uint8)) and torch.equal(got.scale, scale)
    got = F.rms_norm_fp8(x.float(), None, recipe=recipe, use_triton=False)
    assert got.data.dtype == torch.float8_e4m3fn


# (bad inputs: docs/API.md's fp8-* rows, BAD_INPUTS below)


def test_compile_fullgraph(device):
    """torch.compile(fullgraph=True) over an FP8 norm: on a GPU the kernel's custom op, on the
    CPU the reference (the interpreter cannot be traced); both give the eager result."""
    check_compile_fullgraph(device, 256)


def check_compile_fullgraph(device, n):
    """:func:`test_compile_fullgraph` on rows of ``n``, under the current launch config."""
    x = torch.randn(6, n, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, device=device, dtype=torch.bfloat16)
    recipe = FP8Recipe("per_token")

    def f(x, w):
        out = F.rms_norm_fp8(x, w, recipe=recipe)
        return out.data, out.scale

    torch._dynamo.reset()
    data, scale = torch.compile(f, fullgraph=True)(x, w)
    check_rows(FP8Rows(data, scale), reference.norm_fp8(x, w, None, RMS_EPS, recipe, rms=True), recipe)


@pytest.mark.skipif(DEVICE != "cuda", reason="a CUDA graph needs a GPU")
def test_cuda_graph():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    recipes = [FP8Recipe(g) for g in ("per_tensor", "per_token", "per_group")]
    with torch.no_grad():
        for recipe in recipes:  # (warm: plans and compiled kernels before the capture)
            F.rms_norm_fp8(x, w, recipe=recipe)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [F.rms_norm_fp8(x, w, recipe=recipe) for recipe in recipes]
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
    for recipe, got in zip(recipes, outs):
        check_rows(got, reference.norm_fp8(x, w, None, RMS_EPS, recipe, rms=True), recipe)


@pytest.mark.skipif(DEVICE != "cuda", reason="the training shape on a GPU")
@pytest.mark.parametrize("granularity", ["per_tensor", "per_token", "per_group"])
def test_training_shape_on_the_gpu(granularity):
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, device="cuda")).to(torch.bfloat16)
    r = torch.randn_like(x)
    recipe = FP8Recipe(granularity)
    got = F.rms_norm_fp8(x, w, recipe=recipe, residual=r)
    check_rows(got, (*reference.norm_fp8(got.h, w, None, RMS_EPS, recipe, rms=True)[:2], got.h), recipe)
    torch.testing.assert_close(got.h, x + r, rtol=0, atol=0)


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's launch rules on a GPU")
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("rows,cols", [(1, 4096), (64, 4096), (132, 8192), (520, 8192)])
def test_the_launch_rules_shapes_on_the_gpu(rms, rows, cols):
    """The shapes test_fp8_launch_rules_by_gpu plans differently on an H200 (a small grid: a row a
    program at more warps; LayerNorm's rows of 8,192: two a program), run on this GPU: equal to
    the reference, per token and 1x128."""
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
    b = None if rms else (0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
    eps = RMS_EPS if rms else 1e-5
    for recipe in (FP8Recipe("per_token"), FP8Recipe("per_group")):
        got = (F.rms_norm_fp8(x, w, eps, recipe=recipe) if rms else
               F.layer_norm_fp8(x, w, b, eps, recipe=recipe))
        check_rows(got, reference.norm_fp8(x, w, b, eps, recipe, rms=rms), recipe)


class _DequantizedLinear(torch.autograd.Function):
    """A consumer of the activation with its own backward (as an FP8 GEMM's would be)."""

    @staticmethod
    def forward(ctx, activation, weight):
        ctx.save_for_backward(activation, weight)
        return activation.dequantize().float() @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        activation, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ activation.dequantize().float()


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_training_under_compile(device, backend):
    """The activation through an autograd.Function consumer, compiled fullgraph: the same
    gradients as eager (the subclass flattens to its FP8 data and scale for Dynamo; an
    earlier form without that lost x's gradient silently)."""
    x0, w0, lin0 = torch.randn(4, 256, device=device), torch.randn(256, device=device), torch.randn(64, 256,
                                                                                                   device=device)

    def loss(x, w, lin):
        return _DequantizedLinear.apply(F.rms_norm_fp8(x, w, recipe=FP8Recipe("per_token")).activation, lin).sum()

    def grads(fn):
        tensors = [t.clone().requires_grad_() for t in (x0, w0, lin0)]
        fn(*tensors).backward()
        return [t.grad for t in tensors]

    want = grads(loss)
    torch._dynamo.reset()
    got = grads(torch.compile(loss, backend=backend, fullgraph=True))
    for a, b in zip(got, want):
        assert a is not None
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("granularity,fields", [("per_token", {}), ("per_token", {"pow2_scales": True}),
                                                ("per_token", {"scale_ub": 1.0}), ("per_group", {}),
                                                ("per_tensor", {}), ("per_tensor", {"pow2_scales": True})])
def test_nan_and_inf_rows(device, granularity, fields):
    """A row holding NaN or inf normalizes to NaN (as torch's norm): its scale is NaN and its
    data NaN, as the reference's (torch's amax keeps a NaN; Triton's max would drop it), and
    the other rows keep theirs (per tensor: one NaN scale for all)."""
    x = torch.randn(5, 256, device=device)
    x[0, 3], x[1, 5], x[2, 7] = float("nan"), float("inf"), -float("inf")
    w = torch.randn(256, device=device)
    recipe = FP8Recipe(granularity, **fields)
    got = F.rms_norm_fp8(x, w, recipe=recipe)
    data, scale, _, _ = reference.norm_fp8(x, w, None, RMS_EPS, recipe, rms=True)
    assert torch.equal(got.data.view(torch.uint8), data.view(torch.uint8))
    torch.testing.assert_close(got.scale, scale, rtol=4 * 2.0 ** -23, atol=0, equal_nan=True)
    assert got.scale.isnan().any()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_fp8_tuning_times_each_config_on_cpu(monkeypatch, capsys):
    """tune_fp8 with the timer patched out: each combination of its grid runs our FP8 norm
    under those knobs (a spy sees the tile each plan got), and the default config is back after."""
    from benchmarks.dev import tune_fp8
    from triton_layers import launch_config

    from triton_layers.kernels import _layer_norm_rules

    runs = fake_gpu_timer(monkeypatch)
    tiles = []
    row_tile = _layer_norm_rules.row_tile

    def spy(rows, cols, limit, loop_block, tile_elements, *rest):
        tiles.append(tile_elements)
        return row_tile(rows, cols, limit, loop_block, tile_elements, *rest)
    monkeypatch.setattr(_layer_norm_rules, "row_tile", spy)
    monkeypatch.setattr(tune_fp8, "GRID", {"fp8_tile_elements": [256, 1024], "fp8_elems_per_thread": [16]})
    tune_fp8.main(["--shapes", "3x256", "--ops", "rmsnorm_fp8_per_token,add_rmsnorm_fp8_per_token"])
    assert len(runs) == 2 * 2
    assert {256, 1024} <= set(tiles)
    assert "fwd default" in capsys.readouterr().out
    assert launch_config.current() is launch_config.DEFAULT


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_fp8_ceiling_ladder_runs_each_rung_on_cpu(monkeypatch, capsys):
    """benchmarks/dev/fp8_ceiling.py with the timer patched out: every rung of the ladder and ours
    under each tile is called and printed, and the default config is back after."""
    from benchmarks.dev import fp8_ceiling
    from triton_layers import launch_config

    timed = fake_gpu_timer(monkeypatch)
    fp8_ceiling.main(["--shapes", "3x256"])
    out = capsys.readouterr().out
    for rung in ("torch_cast", "flat_cast", "rows_cast", "rows_static", "rows_per_token ", "rows_per_token_exact",
                 "ours_static", "ours_per_token"):
        assert rung in out, rung
    assert len(timed) == 1 + 8 + 4 * 12 + 2 * 10
    assert launch_config.current() is launch_config.DEFAULT


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

def _fp8_in_place():
    with torch.no_grad():
        return TritonRMSNorm(256, fp8=FP8Recipe(), device=DEVICE)(bad.x_(2, 256), bad.x_(2, 256),
                                                                   residual_in_place=True)


def _check_fp8_empty(rows) -> None:
    assert rows.data.shape == (0, 256) and rows.data.dtype == torch.float8_e4m3fn and rows.scale.shape == (0, 2)


x_ = bad.x_
BAD_INPUTS = [
    bad.Case("fp8-group-cols", lambda: F.rms_norm_fp8(x_(4, 200), recipe=FP8Recipe("per_group")),
         (ValueError, r"x's last dim must be a multiple of 128; got 200")),
    bad.Case("fp8-scale-nonpositive", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_tensor"),
                                                         scale=torch.tensor([0.0], device=DEVICE)),
         (ValueError, r"scale must be > 0 \(a dequantization scale\); got 0.0")),
    bad.Case("fp8-scale-granularity", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_token"),
                                                         scale=torch.tensor([1.0], device=DEVICE)),
         (ValueError, r"a static scale is per tensor; the recipe's granularity is 'per_token'")),
    bad.Case("fp8-scale-dtype", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_tensor"),
                                                   scale=torch.tensor([1], device=DEVICE)),
         (TypeError, r"scale has dtype torch.int64; expected one of torch.float32")),
    bad.Case("fp8-scale-shape", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_tensor"),
                                                   scale=torch.ones(2, device=DEVICE)),
         (ValueError, r"scale must be one fp32 element on x's device")),
    bad.Case("fp8-recipe-type", lambda: F.rms_norm_fp8(x_(4, 256), recipe="per_token"),
         (TypeError, r"recipe must be a triton_layers.FP8Recipe; got str")),
    bad.Case("fp8-weight-shape", lambda: F.rms_norm_fp8(x_(4, 256), torch.ones(128, device=DEVICE)),
         (ValueError, r"weight must have shape \(256,\) \(x's last dim\); got \(128,\)")),
    bad.Case("fp8-recipe-granularity", lambda: FP8Recipe("per_block"),
         (ValueError, r"granularity must be one of 'per_tensor', 'per_token', 'per_group'; got 'per_block'")),
    bad.Case("fp8-recipe-dtype", lambda: FP8Recipe("per_token", torch.bfloat16),
         (TypeError, r"dtype must be torch.float8_e4m3fn or torch.float8_e5m2; got torch.bfloat16")),
    bad.Case("fp8-recipe-scale-ub", lambda: FP8Recipe("per_token", scale_ub=0.0),
         (ValueError, r"scale_ub must be a finite number > 0; got 0.0")),
    bad.Case("fp8-recipe-scale-ub-granularity", lambda: FP8Recipe("per_group", scale_ub=2.0),
         (ValueError, r"scale_ub bounds per-token scales; got it with granularity 'per_group'")),
    bad.Case("fp8-recipe-column-major", lambda: FP8Recipe("per_token", column_major_scales=True),
         (ValueError, r"column_major_scales is a layout of per-group scales")),
    bad.Case("fp8-recipe-transposed", lambda: FP8Recipe("per_token", transposed=True),
         (ValueError, r"transposed=True writes the 128x1-block copy of the 1x128 recipe \(granularity 'per_group'\); "
                      r"got it with granularity 'per_token'")),
    bad.Case("fp8-module-shape", lambda: TritonRMSNorm((2, 128), fp8=FP8Recipe()),
         (ValueError, r"the FP8 norms normalize the last dim only; got normalized_shape \(2, 128\)")),
    bad.Case("fp8-module-in-place", lambda: _fp8_in_place(),
         (ValueError, r"residual_in_place=True is not offered with an fp8 recipe")),
    bad.Case("fp8-module-stable", lambda: TritonLayerNorm(256, stable=True, fp8=FP8Recipe())(x_(2, 256)),
         (ValueError, r"the FP8 norms have no stable mode")),
    bad.Case("fp8-empty", lambda: F.rms_norm_fp8(x_(0, 256), recipe=FP8Recipe("per_group")),
         lambda rows: _check_fp8_empty(rows)),
]
test_bad_input = bad.tests_of(BAD_INPUTS)


def test_the_straight_through_backward_keeps_its_plan():
    """The norms' backward under an FP8 activation is planned once per layout and kept (the
    norm op's own plan cache), and a kept plan equals a fresh one (checked plans)."""
    from triton_layers.calls import eager
    from triton_layers.kernels import layer_norm as norms

    if not F.uses_kernels(torch.empty(1, device=DEVICE)):
        pytest.skip("the kernels do not run here")
    x = torch.randn(4, 256, device=DEVICE, requires_grad=True)
    w = (1 + 0.1 * torch.randn(256, device=DEVICE)).requires_grad_()
    cache = norms.norm._door_plans
    cache.clear()
    with eager.checking_plans():
        for _ in range(3):
            out = F.rms_norm_fp8(x, w, recipe=FP8Recipe())
            out.activation.float().sum().backward()
    assert len([key for key in cache if key[0] == "backward"]) == 1


def test_fp8_launch_rules_by_gpu():
    """On the GPUs of fp8_small_grid_gpus (an H200, named by its model token), rows of at least
    fp8_small_grid_min_cols columns that number at most the SMs take one row a program at
    fp8_small_grid_elems_per_thread (twice the warps); more rows, shorter rows, chunked rows, other
    GPUs and the CPU keep the default tile. On an H200 LayerNorm without a residual at rows of
    8,192 takes fp8_layer_norm_8192_tile_elements (two rows) past the small grid. The plans recorded on meta tensors as on an H200 and
    an H100 say the same, and the launch is exact on the CPU whichever tile it takes."""
    from dataclasses import replace

    from tests.conftest import H100, H200
    from triton_layers import launch_config
    from triton_layers.kernels import _layer_norm_rules as rules
    from triton_layers.kernels import ops as K

    cfg = launch_config.DEFAULT.layer_norm
    assert (cfg.fp8_small_grid_gpus, cfg.fp8_small_grid_min_cols, cfg.fp8_small_grid_elems_per_thread) == \
        (("H200",), 4096, 32)
    assert rules.fp8_tile(64, 4096, cfg, H200) == (1, 4096, True, 32)
    assert rules.fp8_tile(132, 8192, cfg, H200) == (1, 8192, True, 32)
    assert rules.fp8_tile(133, 4096, cfg, H200) == (2, 4096, True, 64)  # (more rows than SMs)
    assert rules.fp8_tile(64, 2048, cfg, H200) == (4, 2048, True, 64)  # (short rows)
    assert rules.fp8_tile(8, 40000, cfg, H200)[2:] == (False, cfg.elems_per_thread)  # (chunks)
    for gpu in (H100, replace(H200, name="NVIDIA GH200 480GB"), launch_config.GPU.of(torch.device("cpu"))):
        assert rules.fp8_tile(64, 4096, cfg, gpu) == (2, 4096, True, 64), gpu.name
        assert rules.fp8_tile(512, 8192, cfg, gpu, layer_norm=True) == (1, 8192, True, 64), gpu.name
    # LayerNorm (no residual) at rows of 8,192 on an H200: two rows a program past the small grid
    assert rules.fp8_tile(512, 8192, cfg, H200, layer_norm=True) == (2, 8192, True, 64)
    assert rules.fp8_tile(512, 8192, cfg, H200) == (1, 8192, True, 64)  # (RMSNorm, or a residual)
    assert rules.fp8_tile(512, 4096, cfg, H200, layer_norm=True) == (2, 4096, True, 64)
    assert rules.fp8_tile(64, 8192, cfg, H200, layer_norm=True) == (1, 8192, True, 32)  # (the small grid)
    w = torch.empty(4096, device="meta", dtype=torch.bfloat16)
    for gpu, rows, expected in ((H200, 64, (1, 4)), (H200, 512, (2, 4)), (H100, 64, (2, 4))):
        x = torch.empty(rows, 4096, device="meta", dtype=torch.bfloat16)
        with launch_config.plan_as(gpu):
            (kernel, grid, args, kwargs), = K.norm_fp8.record_launches(
                x, None, w, None, None, 1e-5, True, False, False, torch.bfloat16, torch.float8_e4m3fn,
                "per_token", False, 0.0, False, False, False, grids=True)
        want_block_m, want_warps = expected
        assert (kwargs["BLOCK_M"], kwargs["num_warps"], grid) == \
            (want_block_m, want_warps, (rows // want_block_m,)), (gpu.name, rows, kwargs)
    # exact under the small-grid launch (its knobs set by hand: no rule names the CPU)
    if F.uses_kernels(torch.empty(1, device=DEVICE)) and DEVICE == "cpu":
        x = torch.randn(3, 4096, dtype=torch.bfloat16)
        w = (1 + 0.1 * torch.randn(4096)).to(torch.bfloat16)
        recipe = FP8Recipe()
        want = reference.norm_fp8(x, w, None, RMS_EPS, recipe, rms=True)
        with launch_config.use_knobs("layer_norm", fp8_tile_elements=4096, fp8_elems_per_thread=32):
            check_rows(F.rms_norm_fp8(x, w, RMS_EPS, recipe=recipe), want, recipe)
