"""The FP8 norms on rows longer than the forward holds whole (``fwd_max_fused_cols``):
kernels/norm_fp8.py's chunked kernel, every recipe against the reference with
tests/test_fp8_norms.py's criterion (counted one-step flips). Small rows reach it through
``launch_config.shrunk``: rows over 256 columns in chunks of 128 or 256 (the last ragged)."""
import pytest
import torch

from triton_layers import FP8Recipe, functional as F, launch_config, reference
from triton_layers.kernels import norm_fp8 as kernel
from tests.conftest import DEVICE
from tests.test_fp8_norms import (FP8, RECIPES, RMS_EPS, check_quantized, check_compile_fullgraph, check_rows,
                                  check_straight_through, recipe_of)

# rows over 256 columns: chunked; chunks of 256 columns (a per-group row of 640: 256, 256, 128)
LONG = launch_config.shrunk(256, 256)


def _call(x, w, b, recipe, scale=None, residual=None, residual_dtype=None, rms=True):
    if rms:
        return F.rms_norm_fp8(x, w, recipe=recipe, scale=scale, residual=residual, residual_dtype=residual_dtype)
    return F.layer_norm_fp8(x, w, b, recipe=recipe, scale=scale, residual=residual, residual_dtype=residual_dtype)


def _launched(x, residual, w, b, static, rms, recipe, transposed=False) -> list:
    """The kernels the plan of this call launches (under the current config): the norm's
    launches as "chunked" or "whole", the transposed copy's as "copy"."""
    plan = kernel._plan_forward(x, residual, w, b, static, 1e-5, rms, False, False,
                                x.dtype if residual is None else residual.dtype, recipe.dtype, recipe.granularity,
                                recipe.pow2_scales, float(recipe.scale_ub or 0.0), recipe.column_major_scales,
                                False, transposed)
    return [_form(launch) for launch in plan.launches]


def _form(launch) -> str:
    if launch.kernel is kernel._norm_fp8_t_tile_kernel:
        return "copy"
    assert launch.kernel is kernel._norm_fp8_kernel
    return "chunked" if launch.constexprs["CHUNKED"] else "whole"


@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("granularity,fields,static", RECIPES)
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
def test_recipes_on_long_rows(device, rms, granularity, fields, static, fp8):
    m, n = 7, 640 if granularity == "per_group" else 300  # (the last chunk ragged: 128 or 44 of 256)
    x = (torch.randn(m, n, device=device) * 3 + 0.5).to(torch.bfloat16)
    w = torch.randn(n, device=device)
    b = None if rms else torch.randn(n, device=device)
    recipe = recipe_of(granularity, fields, fp8)
    scale = torch.tensor([0.0173], device=device) if static else None
    with launch_config.use_config(LONG):
        assert _launched(x, None, w, b, scale, rms, recipe) == ["chunked"]
        got = _call(x, w, b, recipe, scale, rms=rms)
    check_rows(got, reference.norm_fp8(x, w, b, RMS_EPS if rms else 1e-5, recipe, scale, rms=rms), recipe)


@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.bfloat16], ids=["h_fp32", "h_bf16"])
@pytest.mark.parametrize("granularity,fields,static", [r for r in RECIPES if not r[1].get("scale_ub")])
def test_fused_residual_on_long_rows(device, rms, residual_dtype, granularity, fields, static):
    """h written chunk by chunk in the first pass and read back by the later ones."""
    m, n = 5, 640 if granularity == "per_group" else 520
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    r = torch.randn(m, n, device=device, dtype=residual_dtype) * 2 + 0.25
    w = torch.randn(n, device=device)
    b = None if rms else torch.randn(n, device=device)
    recipe = recipe_of(granularity, fields)
    scale = torch.tensor([0.02], device=device) if static else None
    with launch_config.use_config(LONG):
        got = _call(x, w, b, recipe, scale, residual=r, residual_dtype=residual_dtype, rms=rms)
    want_h = x.to(residual_dtype) + r
    # (the interpreter rounds a bf16 h toward zero where the GPU rounds to nearest: one ulp)
    torch.testing.assert_close(got.h, want_h, rtol=2 ** -7 if residual_dtype == torch.bfloat16 else 0, atol=0)
    want = reference.norm_fp8(got.h, w, b, RMS_EPS if rms else 1e-5, recipe, scale, rms=rms)
    check_rows(got, (*want[:2], got.h), recipe)


@pytest.mark.parametrize("parts_max,cells", [(1024, "programs"), (1, 1)], ids=["amax_per_program", "atomic_cell"])
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
def test_dynamic_per_tensor_two_launches(device, parts_max, cells, rms):
    """Several programs: the amax launch, then the quantizing one (which re-reads h), both
    chunked; NaN kept."""
    m, n = 9, 300
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16) * 2 + 0.25
    r = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    w, b = torch.randn(n, device=device), (None if rms else torch.randn(n, device=device))
    recipe = FP8Recipe("per_tensor", pow2_scales=cells == 1)
    config = LONG.with_knobs("layer_norm", fp8_tile_elements=512, fp8_amax_parts_max=parts_max)
    with launch_config.use_config(config):
        plan = kernel._plan_forward(x, r, w, b, None, 1e-5, rms, False, False, torch.bfloat16, recipe.dtype,
                                    "per_tensor", recipe.pow2_scales, 0.0, False, False, False)
        programs = plan.launches[0].grid[0]
        assert programs > 1 and plan.amax_cells == (programs if cells == "programs" else 1)
        assert [_form(c) for c in plan.launches] == ["chunked"] * 2
        got = _call(x, w, b, recipe, residual=r, rms=rms)
        want = reference.norm_fp8(got.h, w, b, RMS_EPS if rms else 1e-5, recipe, rms=rms)
        check_rows(got, (*want[:2], got.h), recipe)
        bad = x.clone()
        bad[m // 2, 280] = float("nan")
        got = _call(bad, w, b, recipe, rms=rms)
        assert got.scale.isnan().all() and got.data.float().isnan().all()


@pytest.mark.parametrize("granularity,fields", [("per_token", {}), ("per_token", {"scale_ub": 1.0}),
                                                ("per_group", {}), ("per_tensor", {})])
def test_nan_and_inf_long_rows(device, granularity, fields):
    """A NaN or inf in a later chunk of a row: that row's scale (group's, tensor's) NaN, as the
    reference's."""
    n = 640
    x = torch.randn(5, n, device=device)
    x[0, 300], x[1, 600], x[2, 7] = float("nan"), float("inf"), -float("inf")
    w = torch.randn(n, device=device)
    recipe = FP8Recipe(granularity, **fields)
    with launch_config.use_config(LONG):
        got = F.rms_norm_fp8(x, w, recipe=recipe)
    data, scale, _, _ = reference.norm_fp8(x, w, None, RMS_EPS, recipe, rms=True)
    assert torch.equal(got.data.view(torch.uint8), data.view(torch.uint8))
    torch.testing.assert_close(got.scale, scale, rtol=4 * 2.0 ** -23, atol=0, equal_nan=True)
    assert got.scale.isnan().any()


# (both norms with and without the residual in e4m3, e5m2 once: the copy's cast is the whole
# row kernel's, tested in both dtypes there; each case is ~10 s in the interpreter)
@pytest.mark.parametrize("rms,with_residual,fp8", [
    (True, False, FP8[0]), (False, False, FP8[0]), (True, True, FP8[0]), (False, True, FP8[0]),
    (False, False, FP8[1])], ids=["rms-plain-e4m3", "layer-plain-e4m3", "rms-residual-e4m3",
                                  "layer-residual-e4m3", "layer-plain-e5m2"])
def test_transposed_copy_on_long_rows(device, rms, with_residual, fp8):
    """The 1x128 recipe's transposed copy after the chunked launch: its tile launch reads the
    statistics the chunked kernel stored (130 rows: a ragged 128-row block; rows of two chunks)."""
    m, n = 130, 256
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16) * 2 + 0.5
    r = torch.randn(m, n, device=device) if with_residual else None
    w = torch.randn(n, device=device)
    b = None if rms else torch.randn(n, device=device)
    recipe = FP8Recipe("per_group", fp8, pow2_scales=rms, transposed=True)
    with launch_config.use_config(launch_config.shrunk(128, 128)):
        assert _launched(x, r, w, b, None, rms, recipe, True) == ["chunked", "copy"]
        got = _call(x, w, b, recipe, residual=r, rms=rms)
    z = x if r is None else got.h
    data, scale, _, y = reference.norm_fp8(z, w, b, RMS_EPS if rms else 1e-5, recipe, rms=rms)
    check_rows(got, (data, scale, got.h), recipe)
    data_t, scale_t = reference.quantize_fp8_transposed(y, recipe)
    # (the ragged block's column amax is over 2 values: where LayerNorm's zhat * w + b nearly
    # cancels there, the chunked sums' other rounding of rstd is many of its own roundings; on
    # an H200 7e-10 against a scale of 1e-3, 6 of them)
    check_quantized(got.data_t, got.scale_t, data_t, scale_t, recipe, scale_atol_roundings=4)


@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_straight_through_gradients_on_long_rows(device, rms, with_residual):
    """The backward is the norm's (its own long-row paths here): the reference's gradients."""
    with launch_config.use_config(LONG):
        check_straight_through(device, rms, with_residual, 5, 640)


def test_compile_fullgraph_on_long_rows(device):
    """torch.compile(fullgraph=True) of a long-row FP8 norm: on a GPU the chunked kernel through
    the custom op (on the CPU the reference: the interpreter cannot be traced)."""
    with launch_config.use_config(LONG):
        check_compile_fullgraph(device, 640)


@pytest.mark.skipif(DEVICE != "cuda", reason="rows over the real limit on a GPU")
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
@pytest.mark.parametrize("granularity,fields,static", RECIPES + [("per_group", {"transposed": True}, False)])
def test_real_long_rows_on_the_gpu(rms, granularity, fields, static):
    """Rows of 65,536 (twice fwd_max_fused_cols) under the default config, with a residual."""
    m, n = 300, 65536
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    r = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    b = None if rms else torch.randn(n, device="cuda", dtype=torch.bfloat16)
    recipe = FP8Recipe(granularity, **fields)
    scale = torch.tensor([0.02], device="cuda") if static else None
    got = _call(x, w, b, recipe, scale, residual=r, rms=rms)
    torch.testing.assert_close(got.h, x + r, rtol=0, atol=0)
    data, scale_, _, y = reference.norm_fp8(got.h, w, b, RMS_EPS if rms else 1e-5, recipe, scale, rms=rms)
    check_rows(got, (data, scale_, got.h), recipe)
    if recipe.transposed:
        check_quantized(got.data_t, got.scale_t, *reference.quantize_fp8_transposed(y, recipe), recipe)
