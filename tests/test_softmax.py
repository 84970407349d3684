"""CausalSoftmax / functional.softmax: kernels vs reference vs an independent torch definition."""
from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given
from hypothesis import strategies as st

import triton_layers
from triton_layers import CausalSoftmax, _checks, reference
from triton_layers import functional as F
from triton_layers import launch_config
from triton_layers.calls import doors as _doors, fast_launch as _fast_launch
from triton_layers.kernels import _common
from triton_layers.kernels import _softmax_rules as rules
from triton_layers.kernels import ops as kernel_ops

from .conftest import DEVICE, DTYPES, spy_main_inputs
from . import bad_inputs as bad
from .big_tensors import cols, randn, rows_past, sample_rows
from .fake_timer import fake_gpu_timer
from .nonfinite import INF, NAN, SILENT, VALUES, close, grads
from .oracle import agree, check, compare, run
from .strategies import TRUNCATING_BF16, bounded, common, drawn, layouts

# (shape of the scores, whether it is batch-first (B, [H,] Nq, Nk) so a padding mask applies)
SHAPES = [
    (2, 3, 7, 7),  # square
    (2, 5, 127),  # Nq < Nk
    (1, 2, 9, 4),  # Nq > Nk: the top rows see no key under causal
    (3, 1, 1000),  # Nq = 1 (decoding): sees every key
    (2, 4, 3000),  # long-ish rows, Nq < Nk
    (1, 1, 1),
    (2, 2, 64, 64),  # powers of two
    (1, 16, 24),
]


def random_padding(batch: int, n_k: int, device, all_padded: int | None = None) -> torch.Tensor:
    """About 30% padding, at least one key of each batch entry kept (unless ``all_padded``)."""
    mask = torch.rand(batch, n_k, device=device) < 0.3
    mask[:, torch.randint(n_k, (batch,))] = False
    if all_padded is not None:
        mask[all_padded] = True
    return mask


def independent(x, causal, scale, mask):
    """torch's masked_fill + softmax in x's dtype, fully masked rows set to 0 (differentiable).

    Written without the library's code: the causal mask comes from tril with the
    diagonal offset Nk - Nq, the padding mask is broadcast by indexing.
    """
    keep = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    if causal:
        n_q, n_k = x.shape[-2], x.shape[-1]
        keep = keep & torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).tril(diagonal=n_k - n_q)
    if mask is not None:
        pad = mask[:, None, :] if x.dim() == 3 else mask[:, None, None, :]
        keep = keep & ~pad
    y = torch.softmax((x * scale).masked_fill(~keep, float("-inf")), dim=-1)
    # The NaN rows' gradient is zeroed by masked_fill's backward (every entry is masked there).
    return torch.where(keep.any(dim=-1, keepdim=True), y, torch.zeros_like(y))


def check_against_torch(x, causal, scale, mask, name=""):
    """Forward and dx of functional.softmax vs float64 torch (and torch in x's dtype for the bound)."""
    s = 1.0 if scale is None else scale
    res = check(lambda x: F.softmax(x, causal=causal, scale=scale, key_padding_mask=mask),
                lambda x: independent(x, causal, s, mask), dict(x=x.detach().requires_grad_()), lowp=True, name=name)
    return res.y, res.grads["x"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True), (True, True)])
def test_kernels_match_torch_and_reference(device, dtype, shape, causal, masked):
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    mask = random_padding(shape[0], shape[-1], device) if masked else None
    scale = 0.37 if masked else None
    y, dx = check_against_torch(x, causal, scale, mask, name=f"{shape} {dtype}")
    # The kernels against the reference path (same inputs, same dtype out).
    yr = reference.softmax(x, causal, scale, mask)
    assert yr.dtype == y.dtype == dtype and y.shape == x.shape
    agree(y, yr)


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_matches_independent_float64(shape, causal, masked):
    x = 3 * torch.randn(shape, dtype=torch.float64, requires_grad=True)
    mask = random_padding(shape[0], shape[-1], "cpu") if masked else None
    y, grads, dy = run(lambda x: reference.softmax(x, causal, 0.8, mask), dict(x=x))
    y64, grads64, _ = run(lambda x: independent(x, causal, 0.8, mask), dict(x=x), dy)
    dx, dx64 = grads["x"], grads64["x"]
    torch.testing.assert_close(y, y64, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dx, dx64, rtol=1e-12, atol=1e-14)
    if shape[-2] > 0:
        assert torch.allclose(y.sum(-1)[y.sum(-1) > 0], torch.ones((), dtype=torch.float64))


@pytest.mark.parametrize("n_q,n_k", [(5, 5), (3, 11), (1, 9), (6, 6)])
def test_causal_alignment_matches_sdpa_lower_right(device, n_q, n_k):
    """softmax(scale * q @ k^T, causal) @ v equals SDPA with torch's causal_lower_right bias."""
    from torch.nn.attention.bias import causal_lower_right

    q = torch.randn(2, 3, n_q, 8, dtype=torch.float64)
    k = torch.randn(2, 3, n_k, 8, dtype=torch.float64)
    v = torch.randn(2, 3, n_k, 8, dtype=torch.float64)
    expected = TF.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n_q, n_k), scale=0.3)
    probs_ref = reference.softmax(q @ k.transpose(-1, -2), causal=True, scale=0.3)
    torch.testing.assert_close(probs_ref @ v, expected, rtol=1e-10, atol=1e-12)
    scores = (q @ k.transpose(-1, -2)).float().to(device)
    probs = F.softmax(scores, causal=True, scale=0.3)
    torch.testing.assert_close(probs.double().cpu() @ v, expected, rtol=1e-5, atol=1e-5)


# The square causal case (every visible limit from 1 to 66 across the chunks) in fp32 only: the
# others cover each dtype, and at 66 rows it is a third of this test's interpreter time.
LOOPED_SHAPES = [(2, 3, 5, 67), (1, 3, 401), (1, 1, 66, 66), (1, 2, 9, 70)]
LOOPED_CASES = [(dtype, shape) for dtype in DTYPES for shape in LOOPED_SHAPES
                if shape != (1, 1, 66, 66) or dtype == torch.float32]


@pytest.mark.parametrize("dtype,shape", LOOPED_CASES, ids=str)
@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (True, True)])
def test_looped_path(device, looped, dtype, shape, causal, masked):
    assert not rules.tile(1, shape[-1], looped.softmax)[2], "expected the looped path"
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    mask = random_padding(shape[0], shape[-1], device, all_padded=0 if shape[0] > 1 else None) if masked else None
    check_against_torch(x, causal, 1.3, mask, name=f"looped {shape} {dtype}")


# Scores whose tiles (8 rows of 128 columns, 4 rows of 256) see a quarter, a half and all of
# the row, square and bottom-right aligned (Nq < Nk: every row sees at least Nk - Nq keys).
PREFIX_SHAPES = [(2, 1, 70, 70), (1, 2, 40, 100), (1, 1, 130, 130)]


@pytest.mark.parametrize("splits,dtype", [(2, torch.float32), (4, torch.float32), (4, torch.bfloat16)], ids=str)
@pytest.mark.parametrize("shape", PREFIX_SHAPES, ids=str)
@pytest.mark.parametrize("masked", [False, True])
def test_causal_prefix_splits(device, splits, dtype, shape, masked, monkeypatch):
    """causal_prefix_splits 2 and 4: tiles whose rows see at most half (a quarter) of the
    columns compute on that part and write zeros past it; forward and dx as with the whole row,
    and the same bits as the default launch, which computes every tile over its whole rows."""
    cfg = launch_config.DEFAULT.with_knobs("softmax", causal_prefix_splits=splits)
    assert rules.prefix_splits(128, True, True, cfg.softmax) == splits
    assert rules.prefix_splits(32, True, True, cfg.softmax) == 2  # parts of 16 columns at least
    assert rules.prefix_splits(128, True, False, cfg.softmax) == 1  # plain softmax: whole rows
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    mask = random_padding(shape[0], shape[-1], device) if masked else None
    dy = torch.randn_like(x)

    def run_once():
        leaf = x.detach().requires_grad_()
        y = F.softmax(leaf, causal=True, scale=0.7, key_padding_mask=mask)
        return y, torch.autograd.grad(y, leaf, dy)[0]
    launched = []  # PREFIX_SPLITS of every kernel launch
    direct = _fast_launch.direct

    def spy(kernel):
        launcher = direct(kernel)

        class Recording:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launched.append(kwargs["PREFIX_SPLITS"])
                    return launcher[grid](*args, **kwargs)
                return launch
        return Recording()
    monkeypatch.setattr(_doors, "direct", spy)
    with launch_config.use_config(cfg):
        check_against_torch(x, True, 0.7, mask, name=f"prefix splits {splits} {shape} {dtype}")
        y, dx = run_once()
    assert set(launched) == {splits}  # forward and backward launches
    whole = dataclasses.replace(cfg, softmax=dataclasses.replace(cfg.softmax, causal_prefix_splits=1))
    with launch_config.use_config(whole):
        y_whole, dx_whole = run_once()
    assert torch.equal(y, y_whole)
    if device == "cuda":  # a GPU's tree sum over a narrower block rounds dx's row sum otherwise
        torch.testing.assert_close(dx, dx_whole, rtol=1e-5 if dtype == torch.float32 else 2 ** -7, atol=1e-6)
    else:
        assert torch.equal(dx, dx_whole)


def test_causal_classes_rule():
    """The causal forward's launches by class of rows (softmax_causal_classes): from
    causal_class_min_cols on, the queries whose rows see at most half the block, then the
    others, each with the warps for its width; one launch otherwise."""
    cfg = launch_config.DEFAULT.softmax
    classes = rules.causal_classes
    assert cfg.causal_class_min_cols == 32768 and cfg.causal_class_thread_bytes == 64
    assert classes(32768, 32768, 2, 32768, True, True, cfg) == ((0, 16384, 16384, 16), (16384, 16384, 32768, 32))
    assert classes(32768, 32768, 4, 32768, True, True, cfg) == ((0, 16384, 16384, 32), (16384, 16384, 32768, 32))
    assert classes(20000, 20000, 2, 32768, True, True, cfg) == ((0, 16384, 16384, 16), (16384, 3616, 32768, 32))
    # fewer queries than keys: every row sees over half the block (one class); more: the top rows see none
    assert classes(32768, 100, 2, 32768, True, True, cfg) == ((0, 100, 32768, 32),)
    assert classes(32768, 40000, 2, 32768, True, True, cfg) == ((0, 23616, 16384, 16), (23616, 16384, 32768, 32))
    for args in ((16384, 16384, 2, 16384, True, True), (32768, 32768, 2, 32768, True, False),
                 (65536, 65536, 2, 4096, False, True)):
        assert classes(*args, cfg) == ()


# (B, [H,] Nq, Nk) with 64-column blocks: square, Nq < Nk (two queries in the short class),
# Nq > Nk (the top rows see no key), several score matrices
CLASS_SHAPES = [(1, 2, 40, 40), (1, 2, 20, 50), (2, 40, 36), (3, 1, 33, 33)]
# The default config with the causal forward by classes from blocks of 64 columns.
BY_CLASSES = launch_config.DEFAULT.with_knobs("softmax", causal_class_min_cols=64)


@pytest.mark.parametrize("dtype,masked", [(torch.float32, True), (torch.bfloat16, False)], ids=str)
@pytest.mark.parametrize("shape", CLASS_SHAPES, ids=str)
def test_causal_forward_by_classes(device, dtype, shape, masked):
    """The causal forward in one launch per class of rows (causal_class_min_cols lowered to
    64): forward and dx against torch, the forward equal to the one launch's (the same rows
    computed over the same widths)."""
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    mask = random_padding(shape[0], shape[-1], device) if masked else None
    n_q, n_k = shape[-2], shape[-1]
    rows = x.reshape(-1, n_k)
    pad = None if mask is None else mask.view(torch.uint8)
    with launch_config.use_config(BY_CLASSES):
        launched = kernel_ops.softmax.record_launches(rows, pad, n_q, rows.shape[0] // shape[0], True, 0.7)
        expected = rules.causal_classes(n_k, n_q, x.element_size(), _common.next_power_of_2(n_k), True,
                                                  True, BY_CLASSES.softmax)
        assert [kw["WIDTH"] for _, _, kw in launched if "WIDTH" in kw] == [width for _, _, width, _ in expected]
        assert sum(a[-1] for _, a, kw in launched if "WIDTH" in kw) == n_q  # every query in one class
        check_against_torch(x, True, 0.7, mask, name=f"classes {shape} {dtype}")
        y = F.softmax(x, causal=True, scale=0.7, key_padding_mask=mask)
    assert torch.equal(y, F.softmax(x, causal=True, scale=0.7, key_padding_mask=mask))


def test_causal_forward_by_classes_both_doors(device):
    """The custom op (torch.compile's door) launches the classes as the eager door does."""
    x = torch.randn(2 * 40, 40, device=device)
    mask = random_padding(2, 40, device)
    with launch_config.use_config(BY_CLASSES):
        eager = kernel_ops.softmax(x, mask, 40, 40, True, 0.6)
        compiled = kernel_ops.softmax.forward_op(x, mask, 40, 40, True, 0.6)
    assert torch.equal(eager, compiled)


def test_backward_reload_rule():
    """RELOAD (softmax_bwd_reload): the backward of rows held whole in blocks of at least
    bwd_reload_min_cols reads y and dy again for dx; not narrower blocks, not looped rows."""
    cfg = launch_config.DEFAULT.softmax
    assert cfg.bwd_reload_min_cols == 32768
    assert rules.bwd_reload(32768, True, cfg)
    assert not rules.bwd_reload(16384, True, cfg)
    assert not rules.bwd_reload(4096, False, cfg)  # looped rows: their own two passes


# The default config with the backward's second read of y and dy from blocks of 64 columns.
RELOADING = launch_config.DEFAULT.with_knobs("softmax", bwd_reload_min_cols=64)


@pytest.mark.parametrize("dtype,causal,masked", [(torch.float32, True, True), (torch.bfloat16, False, False),
                                                 (torch.float16, True, False)], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 40, 40), (1, 37, 50)], ids=str)
def test_backward_reload(device, dtype, shape, causal, masked):
    """The backward that reads y and dy twice (bwd_reload_min_cols lowered to 64): forward and
    dx against torch in float64, its launch asked to reload, and dx the held kernel's (the
    same values summed in the same order: bitwise under the interpreter)."""
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    mask = random_padding(shape[0], shape[-1], device) if masked else None
    n_k = shape[-1]
    rows = x.reshape(-1, n_k).requires_grad_()
    pad = None if mask is None else mask.view(torch.uint8)
    dy = torch.randn_like(x)

    def dx_of():
        leaf = x.detach().requires_grad_()
        y = F.softmax(leaf, causal=causal, scale=0.7, key_padding_mask=mask)
        return torch.autograd.grad(y, leaf, dy)[0]
    with launch_config.use_config(RELOADING):
        launched = kernel_ops.softmax.record_launches(rows, pad, shape[-2], rows.shape[0] // shape[0], causal, 0.7)
        assert [kw["RELOAD"] for _, _, kw in launched if "RELOAD" in kw] == [True]
        check_against_torch(x, causal, 0.7, mask, name=f"reload {shape} {dtype}")
        reloaded = dx_of()
    held = dx_of()
    if device == "cuda":  # the compiler may contract the two kernels' products into FMAs otherwise
        torch.testing.assert_close(reloaded, held, rtol=1e-5 if dtype == torch.float32 else 2 ** -7, atol=1e-6)
    else:
        assert torch.equal(reloaded, held)


@pytest.mark.parametrize("dtype,n_k,causal", [(torch.float32, 262145, True), (torch.bfloat16, 262144, False)])
def test_very_long_rows(device, dtype, n_k, causal):
    """Rows longer than any block (>= 262,144 keys), at the real block limits."""
    x = (4 * torch.randn(1, 3, n_k, device=device)).to(dtype)
    check_against_torch(x, causal, None, None, name=f"long {n_k} {dtype}")


def test_largest_fused_row(device):
    cfg = launch_config.current().softmax
    n_k = cfg.max_fused_cols
    assert rules.tile(2, n_k, cfg)[2]
    x = 4 * torch.randn(2, n_k, device=device)
    check_against_torch(x, True, 0.5, None, name="largest fused row")


@pytest.mark.parametrize("looped", ["fused", "small"], indirect=True)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_give_zeros_and_zero_grad(device, dtype, looped):
    n_k = 6 if looped is launch_config.DEFAULT else 21  # looped: three chunks of the small preset, the last partial
    # Causal with Nq > Nk: the top Nq - Nk rows see no key; batch entry 1 is all padding.
    x = torch.randn(2, 1, n_k + 4, n_k, device=device).to(dtype).requires_grad_()
    mask = torch.zeros(2, n_k, dtype=torch.bool, device=device)
    mask[1] = True
    mask[0, 0] = True
    y = F.softmax(x, causal=True, key_padding_mask=mask)
    y.backward(torch.randn_like(y))
    assert not torch.isnan(y).any() and not torch.isnan(x.grad).any()
    assert (y[1] == 0).all() and (x.grad[1] == 0).all()
    # Rows 0..4 of batch 0: row 4 sees only key 0, which is padding; rows 0..3 see nothing.
    assert (y[0, :, :5] == 0).all() and (x.grad[0, :, :5] == 0).all()
    torch.testing.assert_close(y[0, :, 5:].float().sum(-1), torch.ones(1, n_k - 1, device=device),
                               rtol=0, atol=1e-2)
    check_against_torch(x.detach(), True, None, mask, name="fully masked")


@pytest.mark.parametrize("looped", ["fused", "small"], indirect=True)
def test_masked_entries_are_never_used(device, looped):
    """inf/NaN in masked scores and NaN in dy at masked keys leave every result finite."""
    n = 12 if looped is launch_config.DEFAULT else 70
    x = torch.randn(2, n, n, device=device)
    hidden = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    x = x.masked_fill(hidden, float("inf")).requires_grad_()
    y = F.softmax(x, causal=True)
    dy = torch.randn_like(y).masked_fill(hidden, float("nan"))
    y.backward(dy)
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert (y[:, hidden] == 0).all() and (x.grad[:, hidden] == 0).all()
    x_ok = x.detach().masked_fill(hidden, 0.0).requires_grad_()
    y_ok, grads_ok, _ = run(lambda x: independent(x, True, 1.0, None), dict(x=x_ok), dy.nan_to_num(0.0))
    agree(y, y_ok)
    agree(x.grad, grads_ok["x"])


@pytest.mark.parametrize("scale", [-0.7, 0.0, 2.5, 3])
def test_scale(device, scale):
    x = torch.randn(2, 3, 5, 9, device=device)
    check_against_torch(x, True, scale, random_padding(2, 9, device), name=f"scale {scale}")
    if scale == 0.0:  # uniform over the visible keys
        y = F.softmax(x, causal=True, scale=0.0)
        visible = torch.arange(1, 6, device=device) + 4
        torch.testing.assert_close(y[0, 0].max(-1).values, 1.0 / visible.float())


def test_non_contiguous_inputs(device, monkeypatch):
    seen = spy_main_inputs(monkeypatch, kernel_ops.softmax)
    base = torch.randn(2, 4, 6, 20, device=device)
    # A slice of the last dim keeps last stride 1: the kernels read it in place.
    sliced = base[..., 3:14]
    check_against_torch(sliced, True, None, None, name="sliced")
    assert seen[-1].data_ptr() == sliced.data_ptr() and seen[-1].stride() == (20, 1)
    # Last stride != 1, permuted batch dims, and a strided padding mask.
    for x in (base[..., ::2], base.transpose(0, 1), base.transpose(-1, -2)):
        check_against_torch(x, True, 0.5, None, name=f"strides {x.stride()}")
        assert seen[-1].stride(-1) == 1
    mask = random_padding(2, 40, device)[:, ::2]
    check_against_torch(base, True, 0.5, mask, name="strided mask")
    # An expanded (stride 0) gradient.
    x = base.clone().requires_grad_()
    F.softmax(x, causal=True).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape,causal,masked", [
    ((0, 3, 4, 4), True, True), ((2, 0, 5), True, False), ((2, 3, 0), True, True), ((0,), False, False),
    ((3, 0, 7), False, False),
])
def test_empty_inputs(device, shape, causal, masked):
    x = torch.randn(shape, device=device, requires_grad=True)
    mask = torch.zeros(shape[0], shape[-1], dtype=torch.bool, device=device) if masked else None
    y = F.softmax(x, causal=causal, key_padding_mask=mask)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 2, 3, 7)], ids=str)
def test_any_rank_plain_softmax(device, shape):
    x = torch.randn(shape, device=device)
    y, _ = check_against_torch(x, False, None, None, name=f"rank {len(shape)}")
    agree(y, torch.softmax(x, -1))


def test_bad_inputs(device, monkeypatch):
    x = torch.randn(2, 3, 4, 5, device=device)
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        F.softmax(torch.ones(2, 3, dtype=torch.long, device=device))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        F.softmax([[1.0, 2.0]])
    with pytest.raises(TypeError, match="key_padding_mask has dtype torch.float32"):
        F.softmax(x, key_padding_mask=torch.zeros(2, 5, device=device))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(2, 5\), got \(2, 4\)"):
        F.softmax(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(2, 5\), got \(5,\)"):
        F.softmax(x, key_padding_mask=torch.zeros(5, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="one device"):
        F.softmax(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match=r"\(B, Nq, Nk\) or \(B, H, Nq, Nk\)"):
        F.softmax(x[0, 0], key_padding_mask=torch.zeros(4, 5, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="causal=True needs"):
        F.softmax(x[0, 0, 0], causal=True)
    with pytest.raises(ValueError, match="finite"):
        F.softmax(x, scale=math.nan)
    with pytest.raises(TypeError, match="scale"):
        F.softmax(x, scale="0.5")
    with pytest.raises(TypeError, match="scale"):
        CausalSoftmax(scale=True)(x)
    monkeypatch.setattr(_checks, "TRITON_INTERPRET", False)
    with pytest.raises(ValueError, match="use_triton=True needs a CUDA tensor"):
        F.softmax(x.cpu(), use_triton=True)


def test_module(device):
    layer = CausalSoftmax(scale=0.25)
    assert "causal=True, scale=0.25" in repr(layer)
    assert list(layer.parameters()) == [] and layer.state_dict() == {}
    assert triton_layers.CausalSoftmax is CausalSoftmax
    x = torch.randn(2, 3, 6, 8, device=device, requires_grad=True)
    mask = random_padding(2, 8, device)
    y = layer(x, key_padding_mask=mask)
    torch.testing.assert_close(y, F.softmax(x, causal=True, scale=0.25, key_padding_mask=mask))
    y_ref = CausalSoftmax(scale=0.25, use_triton=False)(x, mask)
    agree(y, y_ref)
    plain = CausalSoftmax(causal=False)
    agree(plain(x), torch.softmax(x, -1))
    # Inside a tiny attention block, through nn.Sequential-style composition.
    q, k, v = (torch.randn(2, 3, 6, 4, device=device, requires_grad=True) for _ in range(3))
    out = CausalSoftmax(scale=0.5)(q @ k.transpose(-1, -2)) @ v
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_hugging_face_attention_mask_is_the_opposite(device):
    # HF's attention_mask has 1 at tokens to attend to; our key_padding_mask has True at
    # padding: the docstrings tell users to pass attention_mask == 0.
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], device=device)
    scores = torch.randn(2, 4, 5, device=device)
    y = CausalSoftmax(causal=False)(scores, key_padding_mask=attention_mask == 0)
    want = torch.softmax(scores.masked_fill(attention_mask[:, None] == 0, -math.inf), -1)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert (y[0, :, 3:] == 0).all()


def test_extended_attention_masks_get_the_conversion_in_the_error(device):
    """A Hugging Face / SDPA extended mask (B, 1, 1, Nk) is refused with
    the exact conversion to our (B, Nk) bool, True = padding, for both of its forms. Its
    bool form means True = attend (torch's scaled_dot_product_attention), the opposite of
    ours, so it is not taken as it is: squeezed, it would mask every real key."""
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], device=device)
    scores = torch.randn(2, 4, 5, device=device)
    want = F.softmax(scores, key_padding_mask=attention_mask == 0)
    keep = attention_mask[:, None, None, :].bool()  # (2, 1, 1, 5), True = attend
    with pytest.raises(ValueError, match=re.escape(
            "key_padding_mask of shape (2, 1, 1, 5) (torch.bool) looks like an extended attention mask; "
            "key_padding_mask is bool of shape (2, 5), True marking padding keys") + ".*"
            + re.escape("key_padding_mask=~mask[:, 0, 0, :]")):
        F.softmax(scores, key_padding_mask=keep)
    assert torch.equal(F.softmax(scores, key_padding_mask=~keep[:, 0, 0, :]), want)  # as the message says
    additive = (1.0 - keep.float()) * torch.finfo(torch.float32).min  # 0 = attend, very negative = masked
    with pytest.raises(TypeError, match=re.escape(
            "key_padding_mask of shape (2, 1, 1, 5) (torch.float32) looks like an extended attention mask")
            + ".*" + re.escape("key_padding_mask=mask[:, 0, 0, :] < 0")):
        CausalSoftmax(causal=False)(scores, key_padding_mask=additive)
    assert torch.equal(F.softmax(scores, key_padding_mask=additive[:, 0, 0, :] < 0), want)
    # A 2-D additive mask: its conversion, in the dtype's error.
    with pytest.raises(TypeError, match=r"key_padding_mask has dtype torch.float32; expected one of torch.bool.*"
                                        r"an additive mask .*pass mask < 0"):
        F.softmax(scores, key_padding_mask=additive[:, 0, 0, :])


def test_reference_path_compiles_fullgraph():
    fn = torch.compile(
        lambda x, m: F.softmax(x, causal=True, scale=0.5, key_padding_mask=m, use_triton=False), fullgraph=True
    )
    x = torch.randn(2, 3, 5, 7)
    mask = random_padding(2, 7, "cpu")
    torch.testing.assert_close(fn(x, mask), reference.softmax(x, True, 0.5, mask))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernels compile only on the GPU (see docs/ARCHITECTURE.md)")
def test_kernel_path_compiles_fullgraph(device):
    fn = torch.compile(lambda x, m: F.softmax(x, causal=True, scale=0.5, key_padding_mask=m), fullgraph=True)
    x = torch.randn(2, 3, 50, 70, device=device, requires_grad=True)
    mask = random_padding(2, 70, device)
    y = fn(x, mask)
    y.backward(torch.ones_like(y))
    agree(y, reference.softmax(x, True, 0.5, mask))


@pytest.mark.parametrize("dtype,big", [(torch.float16, 6e4), (torch.bfloat16, 1e30), (torch.float32, 1e30)], ids=str)
def test_large_scores_do_not_overflow(device, dtype, big):
    x = (big * torch.rand(2, 5, 9, device=device)).to(dtype)
    y, dx = check_against_torch(x, True, None, None, name=f"large {dtype}")
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_softmax_tuning_times_each_config_on_cpu(monkeypatch, capsys):
    """tune_softmax with the timer patched out: plain and causal, forward and backward, under
    each combination (a spy sees the warps each launch got from elems_per_thread)."""
    from benchmarks.dev import tune_softmax
    from triton_layers import launch_config

    from triton_layers.kernels import _softmax_rules

    runs = fake_gpu_timer(monkeypatch)
    warps = []
    softmax_tile = _softmax_rules.tile

    def spy(rows, cols, cfg, causal=False):
        tile = softmax_tile(rows, cols, cfg, causal)
        warps.append((cfg.elems_per_thread, tile[3]))
        return tile
    monkeypatch.setattr(_softmax_rules, "tile", spy)
    monkeypatch.setattr(tune_softmax, "GRIDS", {"triton_layers": {"tile_elements": [4096], "elems_per_thread": [1, 16]},
                                                "triton_layers-causal": {"causal_tile_elements": [4096],
                                                                         "elems_per_thread": [1, 16]}})
    tune_softmax.main(["--shapes", "2x64", "--dtypes", "float32"])
    assert len(runs) == 2 * 2 * 2  # directions x (plain, causal) x combinations
    assert {(1, 32), (16, 8)} == set(warps)  # tiles of 64 rows x 64: 4096 elements, 32 warps at most
    out = capsys.readouterr().out
    assert out.count("causal/plain at each one's best: 1.00") == 2
    assert launch_config.current() is launch_config.DEFAULT


# ------------------------------------------------ past 2**31 elements (tests/big_tensors.py; GPU: run alone)


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
    ((rows_past(cols(32768)), cols(32768)), False, False),  # rows in registers
    ((2, rows_past(cols(32768)) // 2, cols(32768)), True, True),  # causal + padding; Nq > Nk: top rows see no key
    ((rows_past(cols(131072), 4), cols(131072)), False, False),  # chunked rows
], ids=["plain", "causal-padding", "chunked"])
def test_softmax_past_2_31(gpu_memory, shape, causal, padded):
    gpu_memory(24)
    n_k = shape[-1]
    x = (3 * randn(shape)).requires_grad_()
    pad = None
    if padded:
        pad = randn((shape[0], n_k), torch.float32, 4) > 1.0  # ~16% padding
        pad[:, 0] = False
    y = F.softmax(x, causal=causal, scale=0.5, key_padding_mask=pad)
    dy = randn(shape, seed=5)
    y.backward(dy)
    n_rows = math.prod(shape[:-1])
    rows = sample_rows(n_rows, n_k)
    flat = lambda t: t.reshape(n_rows, n_k)  # noqa: E731
    n_q = shape[-2] if len(shape) == 3 else 1
    pad_rows = None if pad is None else pad[rows // n_q]
    y64, dx64 = _softmax_rows_reference(flat(x.detach())[rows], flat(dy)[rows], rows, n_q, causal, 0.5, pad_rows)
    compare(flat(y.detach())[rows], y64, name="y")
    compare(flat(x.grad)[rows], dx64, name="dx")


# ------------------------------------------------ NaN and inf (its section of docs/API.md; helpers: nonfinite.py)

def torch_masked_softmax(x, causal, mask):
    """torch's masked softmax: masked_fill(-inf) then softmax (no fix-up of empty rows)."""
    keep = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    if causal:
        n_q, n_k = x.shape[-2:]
        keep = keep & torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).tril(n_k - n_q)
    if mask is not None:
        keep = keep & ~mask[:, None, :]
    return torch.softmax((0.7 * x).masked_fill(~keep, -INF), dim=-1), keep


@SILENT
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True), (True, True)])
def test_nonfinite_as_torch(device, n_cols, value, causal, masked):
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


@SILENT
def test_nonfinite_rows_with_nothing_to_attend_to_are_zero(device, n_cols):
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


@SILENT
@pytest.mark.parametrize("value", [NAN, INF])
def test_nonfinite_backward_ignores_hidden_causal_keys(device, n_cols, value):
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


# ------------------------------------------------ properties (hypothesis; strategies: strategies.py)

@pytest.mark.parametrize("looped", ["fused", "tiny"], ids=["fused", "looped"], indirect=True)
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padding"])
@bounded(6)
@given(c=common(min_dims=3, max_dims=4, max_n=40), data=st.data())
def test_properties(looped, causal, masked, c, data):
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


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

def _all_padded_softmax():
    x = bad.x_(2, 3, 5, grad=True)
    mask = torch.zeros(2, 5, dtype=torch.bool, device=DEVICE)
    mask[1] = True
    y = F.softmax(x, key_padding_mask=mask)
    y.backward(torch.randn_like(y))
    return y, x.grad


def _check_all_padded(result):
    y, dx = result
    assert (y[1] == 0).all() and (dx[1] == 0).all() and torch.isfinite(y).all()
    torch.testing.assert_close(y[0].sum(-1), torch.ones(3, device=DEVICE))


x_, mask_, OTHER = bad.x_, bad.mask_, bad.OTHER
BAD_INPUTS = [
    bad.Case("sm-dtype-int", lambda: F.softmax(torch.ones(2, 5, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"x has dtype torch.int64")),
    bad.Case("sm-mask-dtype", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=torch.zeros(2, 5, device=DEVICE)),
         (TypeError, r"key_padding_mask has dtype torch.float32; expected one of torch.bool")),
    bad.Case("sm-mask-4d-bool", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=mask_(2, 1, 1, 5)),
         (ValueError, r"key_padding_mask of shape \(2, 1, 1, 5\) \(torch.bool\) looks like an extended attention "
                      r"mask; key_padding_mask is bool of shape \(2, 5\), True marking padding keys. If True marks "
                      r"keys to attend .* pass key_padding_mask=~mask\[:, 0, 0, :\]")),
    bad.Case("sm-mask-4d-additive", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=torch.zeros(2, 1, 1, 5, device=DEVICE)),
         (TypeError, r"key_padding_mask of shape \(2, 1, 1, 5\) \(torch.float32\) looks like an extended attention "
                     r"mask; .* pass key_padding_mask=mask\[:, 0, 0, :\] < 0")),
    bad.Case("sm-mask-shape", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=mask_(2, 4)),
         (ValueError, r"key_padding_mask must have shape \(2, 5\), got \(2, 4\)")),
    bad.Case("sm-mask-rank", lambda: F.softmax(x_(3, 5), key_padding_mask=mask_(3, 5)),
         (ValueError, r"key_padding_mask needs scores of shape \(B, Nq, Nk\) or \(B, H, Nq, Nk\); "
                      r"got x of shape \(3, 5\)")),
    bad.Case("sm-causal-1d", lambda: F.softmax(x_(5), causal=True), (ValueError, r"causal=True needs scores of shape")),
    bad.Case("sm-scale-nonfinite", lambda: F.softmax(x_(2, 5), scale=float("inf")),
         (ValueError, r"scale must be finite")),
    bad.Case("sm-scale-type", lambda: F.softmax(x_(2, 5), scale=torch.tensor(0.5)),
         (TypeError, r"scale must be a number or None, got .* \(Tensor\)")),
    bad.Case("sm-mixed-devices", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=mask_(2, 5, device=OTHER)),
         (ValueError, rf"one device; got x on {DEVICE}.*, key_padding_mask on {OTHER}")),
    bad.Case("sm-wrong-device", lambda: F.softmax(x_(2, 5, device="meta"), use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor")),
    bad.Case("sm-empty", lambda: bad.with_x(lambda x: F.softmax(x, causal=True), x_(2, 0, 5)), bad.empty_result((2, 0, 5))),
    bad.Case("sm-noncontiguous", *bad.same_as_contiguous(lambda x: F.softmax(x, causal=True), 2, 6, 5)),
    bad.Case("sm-all-padded", _all_padded_softmax, _check_all_padded),
    bad.Case("sm-module-scale", lambda: CausalSoftmax(scale="0.5"),
         (TypeError, r"scale must be a number or None, got '0.5' \(str\)")),
    bad.Case("sm-module-scale-nonfinite", lambda: CausalSoftmax(scale=float("nan")),
         (ValueError, r"scale must be finite, got nan")),
    bad.Case("sm-module-causal", lambda: CausalSoftmax(causal="no"),
         (TypeError, r"causal must be True or False, got 'no' \(str\)")),
]
BAD_CONFIGS = [
    (CausalSoftmax, (), {"use_triton": 1}, TypeError, r"use_triton must be None, True or False, got 1"),
    (CausalSoftmax, (), {"scale": True}, TypeError, r"scale must be a number or None, got True \(bool\)"),
]
test_bad_input = bad.tests_of(BAD_INPUTS)
test_bad_module_config = bad.config_tests_of(BAD_CONFIGS)
