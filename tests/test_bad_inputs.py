"""The "Bad inputs" tables (docs/API.md: one for every op, one in each op's section), one test per
row (the row's id is the test id).

Each case calls an op or module with one bad (or edge-case) input and states what it
gets: an exception type and a pattern of its message, or a check of the result. A last
test keeps the tables and these cases in step: every id of the tables has a case and back.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Callable, NamedTuple, Union

import pytest
import torch
import torch.nn.functional as TF

from triton_layers import CausalSoftmax, CoordinateDescentRouter, FP8Recipe, TritonLayerNorm, TritonRMSNorm, WeightedSum
from triton_layers import functional as F

from .conftest import DEVICE
from .training_cases import rows

# A second device for mixed-device calls: "meta" where the kernels run on the CPU.
OTHER = "meta" if DEVICE == "cpu" else "cpu"
DOC = Path(__file__).resolve().parents[1] / "docs" / "API.md"
TABLE_HEAD = "| id | input | gets |"


def x_(*shape, dtype=torch.float32, device=DEVICE, grad=False):
    return torch.randn(shape, device=device).to(dtype).requires_grad_(grad)


def mask_(*shape, device=DEVICE):
    return torch.rand(shape, device=device) > 0.3


class Case(NamedTuple):
    id: str
    call: Callable[[], object]
    # (exception type, regex of its message) or a check of the result (raises if wrong).
    expect: Union[tuple, Callable[[object], None]]


def same_as_contiguous(op: Callable, *shape_t) -> Case:
    """A case checking that ``op(x)`` on a transposed view equals ``op`` on its contiguous
    copy, bitwise, in the output and in x's gradient."""
    def call():
        x = x_(*shape_t).transpose(-1, -2)
        assert not x.is_contiguous()
        grads = []
        for inp in (x, x.contiguous()):
            inp = inp.detach().requires_grad_()
            y = op(inp)
            y.backward(torch.ones_like(y))
            grads.append((y.detach(), inp.grad))
        return grads

    def check(grads):
        (y1, g1), (y2, g2) = grads
        assert torch.equal(y1, y2) and torch.equal(g1, g2)
    return call, check


def empty_result(shape: tuple, grad_shape: tuple | None = None) -> Callable:
    """Check: the result has ``shape``; its backward gives x a gradient of ``grad_shape``."""
    def check(result):
        y, x = result
        assert tuple(y.shape) == shape
        y.sum().backward()
        assert x.grad is not None and tuple(x.grad.shape) == (grad_shape or tuple(x.shape))
    return check


def with_x(op: Callable, x: torch.Tensor):
    x = x.detach().requires_grad_()
    return op(x), x


def _all_padded_softmax():
    x = x_(2, 3, 5, grad=True)
    mask = torch.zeros(2, 5, dtype=torch.bool, device=DEVICE)
    mask[1] = True
    y = F.softmax(x, key_padding_mask=mask)
    y.backward(torch.randn_like(y))
    return y, x.grad


def _check_all_padded(result):
    y, dx = result
    assert (y[1] == 0).all() and (dx[1] == 0).all() and torch.isfinite(y).all()
    torch.testing.assert_close(y[0].sum(-1), torch.ones(3, device=DEVICE))


def _k_tensor_nonpositive():
    k = torch.tensor([0.0, -2.0, 3.0], device=DEVICE)
    return F.coor_descent(x_(3, 10), n_iters=5, k=k)


def _check_k_nonpositive(y):
    # log k of k clamped to 1e-20: those rows' scores sum to ~1e-20; the last row's to about 3.
    assert y[:2].sum() < 1e-6 and y[2].sum() > 1


def _check_k_tensor_above_n(y):
    # Scores in [0, 1]: the row asking for 6 of 5 entries sums to at most 5.
    assert 0 <= y.min() and y.max() <= 1 and (y.sum(-1) <= 5 + 1e-3).all()


def cd_(**kw):
    """coor_descent of a (2, 5) s with n_iters=3, k=2.0 unless ``kw`` says otherwise."""
    return F.coor_descent(x_(2, 5), **{"n_iters": 3, "k": 2.0, **kw})


def w8(device=DEVICE):
    return torch.randn(8, device=device)


def _float64_like_torch():
    """float64 through every op: the reference, in float64, with torch's answer."""
    x, w, b = x_(3, 8, dtype=torch.float64), w8().double(), w8().double()
    return [(F.layer_norm(x, w, b), TF.layer_norm(x, (8,), w, b)), (F.rms_norm(x, w), TF.rms_norm(x, (8,), w)),
            (F.softmax(x), TF.softmax(x, -1)), (F.weighted_sum(x, w, b[:1]), TF.linear(x, w[None], b[:1])[..., 0]),
            (TritonLayerNorm(8, device=DEVICE).double()(x), torch.nn.LayerNorm(8, device=DEVICE).double()(x))]


def _check_like_torch(pairs):
    for ours, torchs in pairs:
        assert ours.dtype == torchs.dtype
        torch.testing.assert_close(ours, torchs)


def _mixed_float64():
    x, w = x_(3, 8), w8().double()
    with warnings.catch_warnings():  # (torch's: "Mismatch dtype between input and weight")
        warnings.simplefilter("ignore")
        return F.rms_norm(x, w), TF.rms_norm(x, (8,), w)


def _router(**kw):
    return CoordinateDescentRouter(8, n_iters=5, device=DEVICE, **kw)


def _empty_router():
    x = x_(0, 10, 8, grad=True)
    return _router()(x, num_tokens=2), x


def _check_empty_router(result):
    out, x = result
    assert tuple(out.indices.shape) == (0, 2) and tuple(out.routed_tokens.shape) == (0, 2, 8)


ln_nc = same_as_contiguous(lambda x: F.layer_norm(x, torch.ones(8, device=DEVICE) * 0.5), 8, 5)
rms_nc = same_as_contiguous(lambda x: F.rms_norm(x, torch.ones(8, device=DEVICE) * 0.5), 8, 5)
sm_nc = same_as_contiguous(lambda x: F.softmax(x, causal=True), 2, 6, 5)
ws_nc = same_as_contiguous(lambda x: F.weighted_sum(x, torch.linspace(-1, 1, 8, device=DEVICE)), 8, 5)
cd_nc = same_as_contiguous(lambda x: F.coor_descent(x, n_iters=5, k=3.0), 10, 4)

CASES = [
    # --- layer_norm / TritonLayerNorm
    Case("ln-dtype-int", lambda: F.layer_norm(torch.ones(2, 8, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"x has dtype torch.int64; expected one of torch.float32")),
    Case("ln-dtype-f64", _float64_like_torch, _check_like_torch),
    Case("f64-use-triton", lambda: F.layer_norm(x_(2, 8, dtype=torch.float64), use_triton=True),
         (ValueError, r"use_triton=True cannot compute in torch.float64 \(x has dtype torch.float64\)")),
    Case("f64-mixed", _mixed_float64, lambda pair: _check_like_torch([pair])),
    Case("ln-not-tensor", lambda: F.layer_norm([[1.0, 2.0]]), (TypeError, r"x must be a torch.Tensor, got list")),
    Case("ln-sparse", lambda: F.layer_norm(x_(2, 8).to_sparse()),
         (TypeError, r"x must be a dense tensor \(layout torch.strided\), got layout torch.sparse_coo")),
    Case("ln-weight-dtype", lambda: F.layer_norm(x_(2, 8), torch.ones(8, dtype=torch.int32, device=DEVICE)),
         (TypeError, r"weight has dtype torch.int32")),
    Case("ln-weight-shape", lambda: F.layer_norm(x_(2, 8), torch.ones(7, device=DEVICE)),
         (ValueError, r"x of shape \(2, 8\) does not end with normalized_shape \(7,\)")),
    Case("ln-weight-bias-shape", lambda: F.layer_norm(x_(2, 8), w8(), torch.ones(7, device=DEVICE)),
         (ValueError, r"bias must have shape \(8,\), got \(7,\)")),
    Case("ln-x-shape", lambda: TritonLayerNorm(8, device=DEVICE)(x_(2, 7)),
         (ValueError, r"x of shape \(2, 7\) does not end with normalized_shape \(8,\)")),
    Case("ln-0dim", lambda: F.layer_norm(torch.tensor(1.5, device=DEVICE)),
         (ValueError, r"normalized_shape must have at least one dim; got \(\) for x of shape \(\)")),
    Case("ln-normalized-shape-type", lambda: F.layer_norm(x_(2, 8), normalized_shape=8.0),
         (TypeError, r"normalized_shape must be an int or a sequence of ints, got 8.0")),
    Case("ln-eps", lambda: F.layer_norm(x_(2, 8), eps=-1e-5), (ValueError, r"eps must be >= 0, got -1e-05")),
    Case("ln-mixed-devices", lambda: F.layer_norm(x_(2, 8), w8(device=OTHER)),
         (ValueError, rf"all tensors must be on one device; got x on {DEVICE}.*, weight on {OTHER}")),
    Case("ln-wrong-device", lambda: F.layer_norm(x_(2, 8, device="meta"), use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor .* got a tensor on meta")),
    Case("functorch-use-triton", lambda: torch.func.grad(lambda x: F.layer_norm(x, use_triton=True).sum())(x_(2, 8)),
         (ValueError, r"use_triton=True cannot run under torch.func transforms")),
    Case("ln-empty-rows", lambda: with_x(lambda x: F.layer_norm(x, w8()), x_(0, 8)), empty_result((0, 8))),
    Case("ln-empty-cols", lambda: with_x(F.layer_norm, x_(3, 0)), empty_result((3, 0))),
    Case("ln-noncontiguous", *ln_nc),
    Case("ln-module-shape", lambda: TritonLayerNorm(-1), (ValueError, r"normalized_shape must be non-negative")),
    Case("ln-module-shape-float", lambda: TritonLayerNorm(8.0),
         (TypeError, r"normalized_shape must be an int or a sequence of ints, got 8.0 \(float\)")),
    Case("ln-module-shape-str", lambda: TritonLayerNorm("16"),
         (TypeError, r"normalized_shape must be an int or a sequence of ints, got '16' \(str\)")),
    Case("ln-module-shape-empty", lambda: TritonLayerNorm(()),
         (ValueError, r"normalized_shape must have at least one dim, got \(\)")),
    Case("ln-module-eps", lambda: TritonLayerNorm(8, eps=-1e-5), (ValueError, r"eps must be >= 0, got -1e-05")),
    Case("ln-module-flag", lambda: TritonLayerNorm(8, bias="False"),
         (TypeError, r"bias must be True or False, got 'False' \(str\)")),
    Case("ln-module-use-triton", lambda: TritonLayerNorm(8, use_triton="yes"),
         (TypeError, r"use_triton must be None, True or False, got 'yes' \(str\)")),
    # --- rms_norm / TritonRMSNorm
    Case("rms-dtype-int", lambda: F.rms_norm(torch.ones(2, 8, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"x has dtype torch.int64; expected one of torch.float32")),
    Case("rms-weight-shape", lambda: F.rms_norm(x_(2, 8), torch.ones(7, device=DEVICE)),
         (ValueError, r"x of shape \(2, 8\) does not end with normalized_shape \(7,\)")),
    Case("rms-x-shape", lambda: TritonRMSNorm(8, device=DEVICE)(x_(2, 7)),
         (ValueError, r"x of shape \(2, 7\) does not end with normalized_shape \(8,\)")),
    Case("rms-eps", lambda: F.rms_norm(x_(2, 8), eps=-1e-6), (ValueError, r"eps must be >= 0, got -1e-06")),
    Case("rms-unit-offset-no-weight", lambda: TritonRMSNorm(8, elementwise_affine=False, unit_offset=True),
         (ValueError, r"unit_offset=True multiplies by 1 \+ weight: it needs elementwise_affine=True")),
    Case("rms-empty-rows", lambda: with_x(lambda x: F.rms_norm(x, w8()), x_(0, 8)), empty_result((0, 8))),
    Case("rms-noncontiguous", *rms_nc),
    # --- the fused residual and out_dtype of both norms
    Case("norm-residual-shape", lambda: F.rms_norm(x_(2, 8), residual=x_(3, 8)),
         (ValueError, r"residual must have x's shape and device; got x of shape \(2, 8\) on .*, "
                      r"residual of shape \(3, 8\)")),
    Case("norm-residual-device", lambda: F.layer_norm(x_(2, 8), residual=x_(2, 8, device=OTHER)),
         (ValueError, rf"residual must have x's shape and device; got x of shape \(2, 8\) on {DEVICE}.*, "
                      rf"residual of shape \(2, 8\) on {OTHER}")),
    Case("norm-residual-dtype", lambda: F.rms_norm(x_(2, 8), residual=torch.ones(2, 8, dtype=torch.int64,
                                                                                device=DEVICE)),
         (TypeError, r"residual has dtype torch.int64")),
    Case("norm-out-dtype", lambda: F.layer_norm(x_(2, 8), out_dtype=torch.int64),
         (TypeError, r"out_dtype must be one of torch.float32, torch.float16, torch.bfloat16, torch.float64; "
                     r"got torch.int64")),
    Case("norm-residual-dtype-alone", lambda: F.rms_norm(x_(2, 8), residual_dtype=torch.float32),
         (ValueError, r"residual_dtype=torch.float32 is given without a residual")),
    # --- softmax / CausalSoftmax
    Case("sm-dtype-int", lambda: F.softmax(torch.ones(2, 5, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"x has dtype torch.int64")),
    Case("sm-mask-dtype", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=torch.zeros(2, 5, device=DEVICE)),
         (TypeError, r"key_padding_mask has dtype torch.float32; expected one of torch.bool")),
    Case("sm-mask-4d-bool", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=mask_(2, 1, 1, 5)),
         (ValueError, r"key_padding_mask of shape \(2, 1, 1, 5\) \(torch.bool\) looks like an extended attention "
                      r"mask; key_padding_mask is bool of shape \(2, 5\), True marking padding keys. If True marks "
                      r"keys to attend .* pass key_padding_mask=~mask\[:, 0, 0, :\]")),
    Case("sm-mask-4d-additive", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=torch.zeros(2, 1, 1, 5, device=DEVICE)),
         (TypeError, r"key_padding_mask of shape \(2, 1, 1, 5\) \(torch.float32\) looks like an extended attention "
                     r"mask; .* pass key_padding_mask=mask\[:, 0, 0, :\] < 0")),
    Case("sm-mask-shape", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=mask_(2, 4)),
         (ValueError, r"key_padding_mask must have shape \(2, 5\), got \(2, 4\)")),
    Case("sm-mask-rank", lambda: F.softmax(x_(3, 5), key_padding_mask=mask_(3, 5)),
         (ValueError, r"key_padding_mask needs scores of shape \(B, Nq, Nk\) or \(B, H, Nq, Nk\); "
                      r"got x of shape \(3, 5\)")),
    Case("sm-causal-1d", lambda: F.softmax(x_(5), causal=True), (ValueError, r"causal=True needs scores of shape")),
    Case("sm-scale-nonfinite", lambda: F.softmax(x_(2, 5), scale=float("inf")),
         (ValueError, r"scale must be finite")),
    Case("sm-scale-type", lambda: F.softmax(x_(2, 5), scale=torch.tensor(0.5)),
         (TypeError, r"scale must be a number or None, got .* \(Tensor\)")),
    Case("sm-mixed-devices", lambda: F.softmax(x_(2, 3, 5), key_padding_mask=mask_(2, 5, device=OTHER)),
         (ValueError, rf"one device; got x on {DEVICE}.*, key_padding_mask on {OTHER}")),
    Case("sm-wrong-device", lambda: F.softmax(x_(2, 5, device="meta"), use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor")),
    Case("sm-empty", lambda: with_x(lambda x: F.softmax(x, causal=True), x_(2, 0, 5)), empty_result((2, 0, 5))),
    Case("sm-noncontiguous", *sm_nc),
    Case("sm-all-padded", _all_padded_softmax, _check_all_padded),
    Case("sm-module-scale", lambda: CausalSoftmax(scale="0.5"),
         (TypeError, r"scale must be a number or None, got '0.5' \(str\)")),
    Case("sm-module-scale-nonfinite", lambda: CausalSoftmax(scale=float("nan")),
         (ValueError, r"scale must be finite, got nan")),
    Case("sm-module-causal", lambda: CausalSoftmax(causal="no"),
         (TypeError, r"causal must be True or False, got 'no' \(str\)")),
    # --- weighted_sum / WeightedSum
    Case("ws-dtype-int", lambda: F.weighted_sum(torch.ones(2, 8, dtype=torch.int64, device=DEVICE), w8()),
         (TypeError, r"x has dtype torch.int64")),
    Case("ws-weight-dtype", lambda: F.weighted_sum(x_(2, 8), torch.ones(8, dtype=torch.int32, device=DEVICE)),
         (TypeError, r"weight has dtype torch.int32")),
    Case("ws-weight-shape", lambda: F.weighted_sum(x_(2, 8), torch.ones(1, 8, device=DEVICE)),
         (ValueError, r"weight must have shape \(8,\), got \(1, 8\)")),
    Case("ws-bias-shape", lambda: F.weighted_sum(x_(2, 8), w8(), torch.ones(2, device=DEVICE)),
         (ValueError, r"bias must be a scalar: shape \(\) or \(1,\), got \(2,\)")),
    Case("ws-0dim", lambda: F.weighted_sum(torch.tensor(1.0, device=DEVICE), torch.ones((), device=DEVICE)),
         (ValueError, r"x must have at least one dim")),
    Case("ws-mixed-devices", lambda: F.weighted_sum(x_(2, 8), w8(device=OTHER)),
         (ValueError, rf"one device; got x on {DEVICE}.*, weight on {OTHER}")),
    Case("ws-wrong-device", lambda: F.weighted_sum(x_(2, 8, device="meta"), w8(device="meta"), use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor")),
    Case("ws-empty-rows", lambda: with_x(lambda x: F.weighted_sum(x, w8()), x_(0, 8)), empty_result((0,))),
    Case("ws-empty-dim",
         lambda: F.weighted_sum(x_(3, 0), torch.ones(0, device=DEVICE), torch.tensor(0.5, device=DEVICE)),
         lambda y: torch.testing.assert_close(y, torch.full((3,), 0.5, device=DEVICE))),
    Case("ws-noncontiguous", *ws_nc),
    Case("ws-module-dim", lambda: WeightedSum(-1), (ValueError, r"dim must be an int >= 0, got -1")),
    Case("ws-module-dim-type", lambda: WeightedSum(8.0), (TypeError, r"dim must be an int, got 8.0 \(float\)")),
    Case("ws-module-x-dim", lambda: WeightedSum(8, device=DEVICE)(x_(2, 7)),
         (ValueError, r"x of shape \(2, 7\) must end with dim=8")),
    # --- coor_descent
    Case("cd-dtype-int", lambda: F.coor_descent(torch.ones(2, 5, dtype=torch.int64, device=DEVICE), n_iters=3, k=2.0),
         (TypeError, r"s has dtype torch.int64")),
    Case("cd-0dim", lambda: F.coor_descent(torch.tensor(1.0, device=DEVICE), n_iters=3, k=2.0),
         (ValueError, r"s must have at least one dim")),
    Case("cd-n-iters-0", lambda: cd_(n_iters=0), (ValueError, r"n_iters must be an int >= 1, got 0")),
    Case("cd-n-iters-float", lambda: cd_(n_iters=2.0), (TypeError, r"n_iters must be an int, got 2.0 \(float\)")),
    Case("cd-k-0", lambda: cd_(k=0), (ValueError, r"k must be positive, got 0")),
    Case("cd-k-negative", lambda: cd_(k=-1.0), (ValueError, r"k must be positive")),
    Case("cd-k-inf", lambda: cd_(k=float("inf")), (ValueError, r"k must be finite")),
    Case("cd-k-tensor-shape", lambda: cd_(k=torch.ones(2, 1, device=DEVICE)),
         (ValueError, r"k of shape \(2, 1\) must broadcast to s's leading dims \(2,\)")),
    Case("cd-k-tensor-dtype", lambda: cd_(k=torch.ones(2, dtype=torch.int64, device=DEVICE)),
         (TypeError, r"k has dtype torch.int64")),
    Case("cd-k-tensor-nonpositive", _k_tensor_nonpositive, _check_k_nonpositive),
    Case("cd-k-above-n", lambda: cd_(k=6.0),
         (ValueError, r"k=6.0 is more than the 5 entries of each row of s \(shape \(2, 5\)\).*pass k <= 5")),
    Case("cd-k-tensor-above-n", lambda: cd_(k=torch.tensor([6.0, 2.0], device=DEVICE), n_iters=20),
         _check_k_tensor_above_n),
    Case("cd-eps-0", lambda: cd_(eps=0.0), (ValueError, r"eps must be positive")),
    Case("cd-mask-dtype", lambda: cd_(mask=torch.ones(2, 5, device=DEVICE)),
         (TypeError, r"mask has dtype torch.float32; expected one of torch.bool")),
    Case("cd-mask-shape", lambda: cd_(mask=mask_(5)), (ValueError, r"mask must have shape \(2, 5\), got \(5,\)")),
    Case("cd-mixed-devices", lambda: cd_(mask=mask_(2, 5, device=OTHER)),
         (ValueError, rf"one device; got s on {DEVICE}.*, mask on {OTHER}")),
    Case("cd-wrong-device", lambda: F.coor_descent(x_(2, 5, device="meta"), n_iters=3, k=2.0, use_triton=True),
         (ValueError, r"use_triton=True needs a CUDA tensor")),
    Case("cd-empty", lambda: with_x(lambda s: F.coor_descent(s, n_iters=3, k=2.0), x_(0, 5)), empty_result((0, 5))),
    Case("cd-noncontiguous", *cd_nc),
    # --- CoordinateDescentRouter
    Case("rt-n-iters-0", lambda: CoordinateDescentRouter(8, n_iters=0), (ValueError, r"n_iters must be an int >= 1")),
    Case("rt-module-dim", lambda: CoordinateDescentRouter(0), (ValueError, r"dim must be an int >= 1, got 0")),
    Case("rt-module-dim-type", lambda: CoordinateDescentRouter(True),
         (TypeError, r"dim must be an int, got True \(bool\)")),
    Case("rt-module-eps", lambda: CoordinateDescentRouter(8, eps=0), (ValueError, r"eps must be positive, got 0")),
    Case("rt-module-fetch-k-ratio", lambda: CoordinateDescentRouter(8, fetch_k_ratio=0.5),
         (ValueError, r"fetch_k_ratio must be >= 1, got 0.5")),
    Case("rt-x-rank", lambda: _router()(x_(10, 8), num_tokens=2),
         (ValueError, r"x must be \(batch, seq, dim=8\), got shape \(10, 8\)")),
    Case("rt-x-dim", lambda: _router()(x_(2, 10, 7), num_tokens=2),
         (ValueError, r"x must be \(batch, seq, dim=8\), got shape \(2, 10, 7\)")),
    Case("rt-x-dtype", lambda: _router()(torch.ones(2, 10, 8, dtype=torch.int64, device=DEVICE), num_tokens=2),
         (TypeError, r"x has dtype torch.int64")),
    Case("rt-dtype-mismatch", lambda: _router()(x_(2, 10, 8, dtype=torch.bfloat16), num_tokens=2),
         (TypeError, r"x has dtype torch.bfloat16 but the routing tokens have dtype torch.float32")),
    Case("rt-mask-shape", lambda: _router()(x_(2, 10, 8), num_tokens=2, mask=mask_(2, 9)),
         (ValueError, r"mask must be bool of shape \(2, 10\), got torch.bool \(2, 9\)")),
    Case("rt-num-tokens-0", lambda: _router()(x_(2, 10, 8), num_tokens=0),
         (ValueError, r"num_tokens must be an int >= 1, got 0")),
    Case("rt-empty", _empty_router, _check_empty_router),
    # --- rms_norm_fp8 / layer_norm_fp8 / FP8Recipe
    Case("fp8-group-cols", lambda: F.rms_norm_fp8(x_(4, 200), recipe=FP8Recipe("per_group")),
         (ValueError, r"x's last dim must be a multiple of 128; got 200")),
    Case("fp8-scale-nonpositive", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_tensor"),
                                                         scale=torch.tensor([0.0], device=DEVICE)),
         (ValueError, r"scale must be > 0 \(a dequantization scale\); got 0.0")),
    Case("fp8-scale-granularity", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_token"),
                                                         scale=torch.tensor([1.0], device=DEVICE)),
         (ValueError, r"a static scale is per tensor; the recipe's granularity is 'per_token'")),
    Case("fp8-scale-dtype", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_tensor"),
                                                   scale=torch.tensor([1], device=DEVICE)),
         (TypeError, r"scale has dtype torch.int64; expected one of torch.float32")),
    Case("fp8-scale-shape", lambda: F.rms_norm_fp8(x_(4, 256), recipe=FP8Recipe("per_tensor"),
                                                   scale=torch.ones(2, device=DEVICE)),
         (ValueError, r"scale must be one fp32 element on x's device")),
    Case("fp8-recipe-type", lambda: F.rms_norm_fp8(x_(4, 256), recipe="per_token"),
         (TypeError, r"recipe must be a triton_layers.FP8Recipe; got str")),
    Case("fp8-weight-shape", lambda: F.rms_norm_fp8(x_(4, 256), torch.ones(128, device=DEVICE)),
         (ValueError, r"weight must have shape \(256,\) \(x's last dim\); got \(128,\)")),
    Case("fp8-recipe-granularity", lambda: FP8Recipe("per_block"),
         (ValueError, r"granularity must be one of 'per_tensor', 'per_token', 'per_group'; got 'per_block'")),
    Case("fp8-recipe-dtype", lambda: FP8Recipe("per_token", torch.bfloat16),
         (TypeError, r"dtype must be torch.float8_e4m3fn or torch.float8_e5m2; got torch.bfloat16")),
    Case("fp8-recipe-scale-ub", lambda: FP8Recipe("per_token", scale_ub=0.0),
         (ValueError, r"scale_ub must be a finite number > 0; got 0.0")),
    Case("fp8-recipe-scale-ub-granularity", lambda: FP8Recipe("per_group", scale_ub=2.0),
         (ValueError, r"scale_ub bounds per-token scales; got it with granularity 'per_group'")),
    Case("fp8-recipe-column-major", lambda: FP8Recipe("per_token", column_major_scales=True),
         (ValueError, r"column_major_scales is a layout of per-group scales")),
    Case("fp8-recipe-transposed", lambda: FP8Recipe("per_token", transposed=True),
         (ValueError, r"transposed=True writes the 128x1-block copy of the 1x128 recipe \(granularity 'per_group'\); "
                      r"got it with granularity 'per_token'")),
    Case("fp8-module-shape", lambda: TritonRMSNorm((2, 128), fp8=FP8Recipe()),
         (ValueError, r"the FP8 norms normalize the last dim only; got normalized_shape \(2, 128\)")),
    Case("fp8-module-in-place", lambda: _fp8_in_place(),
         (ValueError, r"residual_in_place=True is not offered with an fp8 recipe")),
    Case("fp8-module-stable", lambda: TritonLayerNorm(256, stable=True, fp8=FP8Recipe())(x_(2, 256)),
         (ValueError, r"the FP8 norms have no stable mode")),
    Case("fp8-empty", lambda: F.rms_norm_fp8(x_(0, 256), recipe=FP8Recipe("per_group")),
         lambda rows: _check_fp8_empty(rows)),
]


def _fp8_in_place():
    with torch.no_grad():
        return TritonRMSNorm(256, fp8=FP8Recipe(), device=DEVICE)(x_(2, 256), x_(2, 256), residual_in_place=True)


def _check_fp8_empty(rows) -> None:
    assert rows.data.shape == (0, 256) and rows.data.dtype == torch.float8_e4m3fn and rows.scale.shape == (0, 2)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case):
    if isinstance(case.expect, tuple):
        exc, pattern = case.expect
        with pytest.raises(exc, match=pattern):
            case.call()
    else:
        case.expect(case.call())


# Beyond the table: every module's constructor arguments, one bad value each.
BAD_CONFIGS = [
    (TritonLayerNorm, (True,), {}, TypeError, r"normalized_shape .* got True \(bool\)"),
    (TritonLayerNorm, ((8, 2.0),), {}, TypeError, r"normalized_shape must be an int or a sequence of ints"),
    (TritonLayerNorm, (8,), {"eps": "1e-5"}, TypeError, r"eps must be a number, got '1e-5' \(str\)"),
    (TritonLayerNorm, (8,), {"eps": float("nan")}, ValueError, r"eps must be finite"),
    (TritonLayerNorm, (8,), {"elementwise_affine": None}, TypeError, r"elementwise_affine must be True or False"),
    (TritonLayerNorm, (8,), {"stable": 1}, TypeError, r"stable must be True or False, got 1 \(int\)"),
    (TritonRMSNorm, ("16",), {}, TypeError, r"normalized_shape must be an int or a sequence of ints, got '16'"),
    (TritonRMSNorm, (8.0,), {}, TypeError, r"normalized_shape must be an int or a sequence of ints, got 8.0"),
    (TritonRMSNorm, ((),), {}, ValueError, r"normalized_shape must have at least one dim"),
    (TritonRMSNorm, (8,), {"eps": -1e-6}, ValueError, r"eps must be >= 0, got -1e-06"),
    (TritonRMSNorm, (8,), {"eps": "1e-6"}, TypeError, r"eps must be a number or None, got '1e-6' \(str\)"),
    (TritonRMSNorm, (8,), {"unit_offset": "no"}, TypeError, r"unit_offset must be True or False, got 'no'"),
    (TritonRMSNorm, (8,), {"elementwise_affine": 0}, TypeError, r"elementwise_affine must be True or False"),
    (TritonRMSNorm, (8,), {"use_triton": "yes"}, TypeError, r"use_triton must be None, True or False"),
    (CausalSoftmax, (), {"use_triton": 1}, TypeError, r"use_triton must be None, True or False, got 1"),
    (CausalSoftmax, (), {"scale": True}, TypeError, r"scale must be a number or None, got True \(bool\)"),
    (WeightedSum, (True,), {}, TypeError, r"dim must be an int, got True \(bool\)"),
    (WeightedSum, ("8",), {}, TypeError, r"dim must be an int, got '8' \(str\)"),
    (WeightedSum, (8,), {"bias": "yes"}, TypeError, r"bias must be True or False"),
    (WeightedSum, (8,), {"use_triton": "auto"}, TypeError, r"use_triton must be None, True or False"),
    (CoordinateDescentRouter, (8.0,), {}, TypeError, r"dim must be an int, got 8.0 \(float\)"),
    (CoordinateDescentRouter, (8,), {"n_iters": 2.0}, TypeError, r"n_iters must be an int, got 2.0"),
    (CoordinateDescentRouter, (8,), {"num_routing_tokens": 0}, ValueError, r"num_routing_tokens must be an int >= 1"),
    (CoordinateDescentRouter, (8,), {"route_block_size": True}, TypeError, r"route_block_size must be an int"),
    (CoordinateDescentRouter, (8,), {"eps_decay": -0.7}, ValueError, r"eps_decay must be positive, got -0.7"),
    (CoordinateDescentRouter, (8,), {"eps_init": float("inf")}, ValueError, r"eps_init must be finite"),
    (CoordinateDescentRouter, (8,), {"cosine_sim_scale": 0}, ValueError, r"cosine_sim_scale must be positive"),
    (CoordinateDescentRouter, (8,), {"fetch_k_ratio": "9/8"}, TypeError, r"fetch_k_ratio must be a number"),
    (CoordinateDescentRouter, (8,), {"straight_through": "True"}, TypeError, r"straight_through must be True or False"),
    (CoordinateDescentRouter, (8,), {"learned_routing_tokens": 1}, TypeError, r"learned_routing_tokens must be True"),
    (CoordinateDescentRouter, (8,), {"cosine_sim_routing": None}, TypeError, r"cosine_sim_routing must be True"),
    (CoordinateDescentRouter, (8,), {"use_triton": "no"}, TypeError, r"use_triton must be None, True or False"),
]


@pytest.mark.parametrize("module,args,kwargs,exc,pattern", BAD_CONFIGS,
                         ids=[f"{m.__name__}-{','.join(k) or a[0]!r}" for m, a, k, *_ in BAD_CONFIGS])
def test_bad_module_config(module, args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        module(*args, **kwargs)


def test_good_module_configs_still_build():
    # Any int type (numpy's too), sequences of them, torch.Size; ints for float arguments.
    np = pytest.importorskip("numpy")
    assert TritonLayerNorm(np.int64(8)).normalized_shape == (8,)
    assert TritonLayerNorm([2, 4]).normalized_shape == TritonLayerNorm(torch.Size([2, 4])).normalized_shape == (2, 4)
    assert TritonLayerNorm(8, eps=0).eps == 0 and WeightedSum(0).weight.shape == (0,)
    assert CausalSoftmax(scale=1).scale == 1 and CausalSoftmax(scale=None).scale is None
    router = CoordinateDescentRouter(np.int32(8), n_iters=np.int64(3), eps_init=None, route_block_size=16)
    assert (router.dim, router.n_iters, router.eps_init, router.route_block_size) == (8, 3, None, 16)
    assert type(router.dim) is int and type(router.n_iters) is int


# One value checker (triton_layers/_values.py), one rule wherever a value enters: the wrong kind of
# value (a bool or a float for an int, a bool or a non-number for a number, anything but True or
# False for a flag) is a TypeError; the right kind out of range is a ValueError.
# argument -> (its doors: name -> a call with the value, [(bad value, the exception)]): the cards'
# value_doors (tests/training_cases.py)
VALUE_DOORS = rows("value_doors")
VALUE_CASES = [(arg, value, exc) for arg, (_, bad) in VALUE_DOORS.items() for value, exc in bad]


@pytest.mark.parametrize("arg,value,exc", VALUE_CASES, ids=[f"{a}={v!r}" for a, v, _ in VALUE_CASES])
def test_a_bad_value_gets_one_error_through_every_door(arg, value, exc):
    """The functional op, the module and the reference raise the same exception type for the
    same bad value (n_iters=2.0 was a ValueError through the op and a TypeError through the
    module; eps="1e-5" a ValueError through F.layer_norm, a TypeError through TritonLayerNorm;
    the references took n_iters=0, causal="no" or a negative eps without a word)."""
    raised = {}
    for door, call in VALUE_DOORS[arg][0].items():
        try:
            call(value)
        except (TypeError, ValueError) as err:
            raised[door] = type(err)
            assert arg.split()[-1] in str(err), (door, str(err))  # the message names the argument
        else:
            raised[door] = None
    assert raised == dict.fromkeys(raised, exc)


def documented_ids() -> list[str]:
    """The ids of every table of docs/API.md headed ``| id | input | gets |``, in order: each row
    of such a table opens with a backquoted id (a row that does not is an error, not skipped)."""
    ids, in_table = [], False
    for n, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() == TABLE_HEAD:
            in_table = True
        elif in_table and line.startswith("|"):
            if not line.startswith("|---"):
                row = re.match(r"\| `([a-z0-9-]+)` \|", line)
                assert row, f"docs/API.md:{n}: a bad-inputs row without an id: {line!r}"
                ids.append(row.group(1))
        else:
            in_table = False
    return ids


def test_the_tables_list_exactly_these_cases():
    ids = documented_ids()
    assert len(ids) == len(set(ids)), "ids documented twice in docs/API.md's bad-inputs tables"
    assert set(ids) == {c.id for c in CASES}
    assert len(CASES) == len({c.id for c in CASES})
