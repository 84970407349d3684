"""One card per op (``CARDS``): the facts about it that the cross-cutting tests read, so that a
new op adds its card here rather than a row to each test file's table. ``test_every_op_has_a_card``
(tests/test_doors.py) fails for a kernel op or a public op without one.

A card's training case, for the training-setup tests and the plan fuzz: fresh inputs in a chosen
layout, our call, and a float64 definition to compare with (torch's own op where it has one).

``make(name, device, dtype, layout, gen)`` returns ``(ours, exact, inputs)``: ``ours(*inputs)``
and ``exact(*inputs)`` each return one tensor (an op with two outputs returns a mix of both,
so that both gradients flow); ``inputs`` are leaves that require a gradient (and, for
softmax and coor_descent, masks that do not). ``layout`` is how the main input is laid out:
``"contiguous"``, ``"strided"`` (rows of a wider buffer: another row stride) or
``"misaligned"`` (one element into its buffer: not 16-byte aligned).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as TF

from triton_layers import functional as F
from triton_layers import (CausalSoftmax, CoordinateDescentRouter, FP8Recipe, TritonLayerNorm, TritonRMSNorm,
                           WeightedSum, reference)

from .conftest import DEVICE

LAYOUTS = ("contiguous", "strided", "misaligned")
RMS_EPS = torch.finfo(torch.float32).eps


def misaligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` one element into its buffer (not 16-byte aligned)."""
    out = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    return out.copy_(t.detach())


def laid_out(values: torch.Tensor, layout: str, gen: torch.Generator) -> torch.Tensor:
    """A leaf holding ``values`` in ``layout`` (the strided one pads the last dim: a 2-D one
    reaches the kernels as rows with a row stride, an N-D one is copied first)."""
    if layout == "strided":
        cols = values.shape[-1]
        pad = 1 + int(torch.randint(0, 7, (), generator=gen))
        wide = torch.randn(*values.shape[:-1], cols + pad, generator=gen).to(values)
        leaf = wide[..., :cols]
        leaf.copy_(values)
    elif layout == "misaligned":
        leaf = misaligned_copy(values)
    else:
        leaf = values.clone()
    return leaf.requires_grad_()


def _randn(gen, *shape, device, dtype, scale=1.0, shift=0.0):
    return (shift + scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)


def make(name: str, device: str, dtype: torch.dtype, layout: str, gen: torch.Generator,
         rows: int = 6, cols: int = 24) -> tuple[Callable, Callable, list]:
    """The op ``name``'s case (see the module's docstring), from its card."""
    r = lambda *s, **k: _randn(gen, *s, device=device, **k)  # noqa: E731
    return CARDS[name].case(name, r, device, dtype, layout, gen, rows, cols)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.double()


def randn_leaf(*shape, device, dtype=torch.float32, grad=True):
    """A random tensor of ``shape`` that requires a gradient (or not)."""
    return torch.randn(shape, device=device).to(dtype).requires_grad_(grad)


_r = randn_leaf


def f64_leaf(*shape, scale=1.0):
    """A float64 leaf of ``shape`` on the tests' device."""
    return (scale * torch.randn(*shape, dtype=torch.float64, device=DEVICE)).requires_grad_()


def causal_softmax(x, scale):
    """Torch's softmax of ``scale * x`` over the last dim with a causal mask (bottom-right aligned)."""
    n_q, n_k = x.shape[-2:]
    hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).triu(1 + n_k - n_q)
    return TF.softmax((scale * x).masked_fill(hidden, float("-inf")), -1)
BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16


# ------------------------------------------------------------------------------ the cases, per op
# Each takes (name, r, device, dtype, layout, gen, rows, cols); r(*shape, dtype=, scale=, shift=)
# draws from gen on the device.

def _norm_case(name, r, device, dtype, layout, gen, rows, cols):
    f64 = _f64
    x = laid_out(r(rows, cols, dtype=dtype, scale=2.0), layout, gen)
    w = r(cols, dtype=dtype, shift=1.0, scale=0.5).requires_grad_()
    if name == "layer_norm":
        b = r(cols, dtype=dtype).requires_grad_()
        return (lambda x, w, b: F.layer_norm(x, w, b),
                lambda x, w, b: TF.layer_norm(f64(x), (cols,), f64(w), f64(b)), [x, w, b])
    if name == "rms_norm":
        return (lambda x, w: F.rms_norm(x, w),
                lambda x, w: TF.rms_norm(f64(x), (cols,), f64(w), RMS_EPS), [x, w])
    res = r(rows, cols, dtype=dtype).requires_grad_()
    rms = name == "add_rms_norm"
    norm = F.rms_norm if rms else F.layer_norm

    def ours(x, res, w):
        y, h = norm(x, w, residual=res)
        return y.float() + 0.5 * h.float()

    def exact(x, res, w):
        h = f64(x) + f64(res)
        y = TF.rms_norm(h, (cols,), f64(w), RMS_EPS) if rms else TF.layer_norm(h, (cols,), f64(w))
        return y + 0.5 * h

    return ours, exact, [x, res, w]


def _norm_fp8_case(name, r, device, dtype, layout, gen, rows, cols):
    # The FP8 output dequantized (its values: the reference's quantization of the fp32 norm),
    # its gradient the float64 norm's (straight through the quantization).
    f64 = _f64
    x = laid_out(r(rows, cols, dtype=dtype, scale=2.0), layout, gen)
    w = r(cols, dtype=dtype, shift=1.0, scale=0.5).requires_grad_()
    rms = name == "rms_norm_fp8"
    recipe = FP8Recipe("per_token")

    def ours(x, w):
        out = F.rms_norm_fp8(x, w, recipe=recipe) if rms else F.layer_norm_fp8(x, w, recipe=recipe)
        return out.activation.float() if out.activation is not None else out.data.float() * out.scale

    def exact(x, w):
        y = TF.rms_norm(f64(x), (cols,), f64(w), RMS_EPS) if rms else TF.layer_norm(f64(x), (cols,), f64(w))
        data, scale, _, _ = reference.norm_fp8(x.detach(), w.detach(), None, RMS_EPS if rms else 1e-5, recipe,
                                               rms=rms)
        return data.double() * scale.double() + (y - y.detach())

    return ours, exact, [x, w]


def _softmax_case(name, r, device, dtype, layout, gen, rows, cols):
    f64 = _f64
    x = laid_out(r(2, 3, 5, cols, dtype=dtype, scale=2.0), layout, gen)
    pad = torch.rand(2, cols, generator=gen).to(device) < 0.2
    scale = 0.3 + float(torch.rand((), generator=gen))
    return (lambda x: F.softmax(x, causal=True, scale=scale, key_padding_mask=pad),
            lambda x: reference.softmax(f64(x.reshape(2, 3, 5, cols)), True, scale, pad), [x])


def _weighted_sum_case(name, r, device, dtype, layout, gen, rows, cols):
    f64 = _f64
    x = laid_out(r(rows, cols, dtype=dtype), layout, gen)
    w = r(cols, dtype=dtype).requires_grad_()
    b = r(1, dtype=dtype).requires_grad_()
    return (lambda x, w, b: F.weighted_sum(x, w, b),
            lambda x, w, b: TF.linear(f64(x), f64(w)[None], f64(b))[..., 0], [x, w, b])


def _coor_descent_case(name, r, device, dtype, layout, gen, rows, cols):
    f64 = _f64
    s = laid_out(r(rows, cols, dtype=dtype), layout, gen)
    # k one value a row, read through a stride (a column of a wider tensor)
    k = laid_out(r(rows, 1, scale=0.5, shift=3.0, dtype=torch.float32).abs() + 1, "strided", gen)
    mask = torch.rand(rows, cols, generator=gen).to(device) < 0.85
    return (lambda s, k: F.coor_descent(s, n_iters=3, k=k[:, 0], eps=0.3, mask=mask),
            lambda s, k: reference.coor_descent(f64(s), 3, f64(k[:, 0]), 0.3, None, 1.0, mask), [s, k])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a - b‖ / ‖b‖ in float64 (NaN never passes)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def tolerance(name: str, dtype: torch.dtype) -> float:
    """The normwise relative error allowed against float64: rounding, far under the error of a
    kernel run on tensors its plan was not made for (0.1 to 1.7 when the issue was found)."""
    if name.endswith("_fp8"):  # (an FP8 step in a value where our statistics round otherwise)
        return 3e-2
    if dtype == torch.float32:
        return 2e-3 if name == "coor_descent" else 2e-4
    return 3e-2


def check_grads(name: str, dtype: torch.dtype, ours: Callable, exact: Callable, inputs: list,
                gen: torch.Generator, run: Callable = None) -> None:
    """Our output and the gradient of every input against float64, for one random upstream
    gradient. ``run(fn, inputs, dy)`` (default a plain forward and backward) returns the output
    and the gradients: a test wraps it in the setup it tests."""
    run = run or plain_run
    leaves = [t for t in inputs if t.requires_grad]
    want_y = exact(*inputs)
    # (dy in the op's dtype for both: ours reads it rounded, so the exact gradient does too;
    # else a sum of dy, the bias's gradient, is off by the rounding of dy, not ours)
    dy = torch.randn(want_y.shape, generator=gen).to(device=want_y.device, dtype=dtype).double()
    want = torch.autograd.grad(want_y, leaves, dy)
    got_y, got = run(ours, inputs, dy)
    tol = tolerance(name, dtype)
    assert rel_err(got_y, want_y) <= tol, f"{name} output: {rel_err(got_y, want_y):.3g}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None and g.shape == w.shape, f"{name} grad {i}: {None if g is None else g.shape}"
        assert rel_err(g, w) <= tol, f"{name} grad {i} of {len(want)}: relative error {rel_err(g, w):.3g}"


def plain_run(fn: Callable, inputs: list, dy: torch.Tensor):
    leaves = [t for t in inputs if t.requires_grad]
    y = fn(*inputs)
    return y, torch.autograd.grad(y, leaves, dy.to(y.dtype))


# (on_device: tests/test_devices.py, on a GPU)
def _layer_norm_on_device(dev):
    return [randn_leaf(37, 300, device=dev), randn_leaf(300, device=dev), randn_leaf(300, device=dev)], F.layer_norm


def _softmax_on_device(dev):
    mask = torch.rand(2, 70, device=dev) > 0.8
    return [randn_leaf(2, 3, 50, 70, device=dev)], lambda x: F.softmax(x, causal=True, scale=0.3, key_padding_mask=mask)


def _weighted_sum_on_device(dev):
    return [randn_leaf(33, 500, device=dev), randn_leaf(500, device=dev), randn_leaf(1, device=dev)], F.weighted_sum


def _coor_descent_on_device(dev):
    mask = torch.rand(5, 900, device=dev) > 0.2
    k = (torch.rand(5, device=dev) * 40 + 2).requires_grad_()
    return ([randn_leaf(5, 900, device=dev), k],
            lambda s, k: F.coor_descent(s, n_iters=12, k=k, eps=0.05, eps_init=2.0, eps_decay=0.7, mask=mask))


# (decisions: tests/test_launch_decisions.py) t(shape, dtype) -> a tensor; big: the benchmarks'
# shapes and the limits around them (meta tensors), else small ones (the CPU)
def _norm_decisions(label: str, args: Callable) -> Callable:
    """The norms' cases at one set of shapes, ``args(x, w, dtype)`` their arguments from builders."""
    def decisions(t, big):
        shapes = ([(4096, 1024), (65536, 512), (2048, 4096), (8192, 8192), (2048, 16384), (4096, 32768),
                   (1024, 131072), (512, 262144), (4, 300000)] if big else [(6, 300), (5, 70), (3, 40), (2, 9)])
        out = {}
        for m, d in shapes:
            for dtype in (BF16, FP32) + ((FP16,) if (m, d) in ((8192, 8192), (5, 70)) else ()):
                x = lambda m=m, d=d, dtype=dtype: t((m, d), dtype)  # noqa: E731
                w = lambda d=d, dtype=dtype: t((d,), dtype)  # noqa: E731
                out[f"{label} {m}x{d} {dtype}"] = lambda x=x, w=w, dtype=dtype: args(x, w, dtype)
        return out
    return decisions


def _softmax_decisions(t, big):
    shapes = [(4, 1024), (2, 4096), (1, 16384), (1, 32768), (1, 65536)] if big else [(2, 33), (1, 70), (3, 20)]
    return {f"softmax{' causal' if causal else ''} {bh}x{n} {dtype}": lambda bh=bh, n=n, dtype=dtype, causal=causal: (
        t((bh * n, n), dtype), None, n, n, causal, 1.0)
        for bh, n in shapes for dtype in (BF16, FP32) for causal in (False, True)}


def _weighted_sum_decisions(t, big):
    shapes = ([(262144, 1024), (2048, 131072), (32, 262144), (4096, 4096), (3, 1000), (100000, 70)] if big
              else [(9, 300), (3, 1000), (200, 70)])
    return {f"weighted_sum {m}x{d} {dtype}": lambda m=m, d=d, dtype=dtype: (
        t((m, d), dtype), t((d,), dtype), t((), dtype)) for m, d in shapes for dtype in (BF16, FP32)}


def _coor_descent_decisions(t, big):
    shapes = ([(256, 1024), (16, 32768), (16, 65536), (1024, 4096), (1, 100000)] if big
              else [(3, 90), (1, 1000), (4, 40)])
    return {f"coor_descent {m}x{n}": lambda m=m, n=n: (t((m, n), FP32), None, None, n / 8 * 9 / 8, 5, 0.03, 4.0, 0.7)
            for m, n in shapes}


# (pdl_launches: tests/test_pdl.py) the norms' at short and long rows
def _norm_pdl_launches(meta):
    return [("norm", (meta(64, d), meta(d), None, 1e-6, True, False, False, False, BF16)) for d in (1024, 131072)]


def _residual_norm_pdl_launches(meta):
    return [("residual_norm", (meta(64, d), meta(64, d), meta(d), meta(d), 1e-5, False, False, False, False, BF16,
                               BF16)) for d in (1024, 131072)]


# (tp_rows: tests/test_tensor_parallel.py)
def _weighted_sum_tp_rows(device, shard):
    from torch.distributed.tensor import Replicate, Shard
    x, w, b = torch.randn(5, 3, 16, device=device), torch.randn(16, device=device), torch.randn(1, device=device)
    return lambda x, w, b: F.weighted_sum(x, w, b), (x, w, b), (Shard(0), Replicate(), Replicate())


def _coor_descent_tp_rows(device, shard):
    from torch.distributed.tensor import DTensor, Shard
    s = torch.randn(5, 3, 16, device=device)
    k = 1.5 + torch.rand(5, 3, device=device)
    mask = torch.rand(5, 3, 16, device=device) < 0.9
    dmask = shard(mask)
    return (lambda s, k: F.coor_descent(s, n_iters=3, k=k, eps=0.3, mask=dmask if isinstance(s, DTensor) else mask),
            (s, k), (Shard(0), Shard(0)))


# (penalty_modules: tests/test_training_setups.py)
def _weighted_sum_penalty(device):
    ours = WeightedSum(24).to(device)
    return ours, lambda x: TF.linear(x, ours.weight[None], ours.bias)[..., 0]


# (zoo_modules: tests/test_subclass_zoo.py) weights away from 1, biases away from 0
def _layer_norm_zoo(r):
    ln = TritonLayerNorm(24).to(DEVICE)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.3 * r(24))
        ln.bias.copy_(r(24))
    return [("TritonLayerNorm", ln, (r(2, 5, 24),), {})]


def _rms_norm_zoo(r):
    rms = TritonRMSNorm(24).to(DEVICE)
    with torch.no_grad():
        rms.weight.copy_(1 + 0.3 * r(24))
    return [("TritonRMSNorm", rms, (r(2, 5, 24),), {}), ("TritonRMSNorm+residual", rms, (r(2, 5, 24), r(2, 5, 24)), {})]


# (default_modules: tests/test_default_devices.py)
def _router_on_meta(module, x, scores):
    out = module(x, num_tokens=2)
    assert out.routed_tokens.shape == (2, 2, 2, 8)
    return out.routed_tokens


# tests/test_gpu_reliability.py's determinism cases: big (on the GPU: shapes that use many programs and
# the partial-sum reductions) -> (fn, its inputs, whether to run under the "small" limits, which
# send the CPU's small rows down the chunked paths of the "-long" cases).
def _pick(big, gpu, cpu):
    return gpu if big else cpu


def _layer_norm_determinism(long: bool) -> Callable:
    def case(big):
        rows, n = _pick(big, (257, 20000), (9, 100)) if long else _pick(big, (4099, 1000), (37, 50))
        inputs = [_r(rows, n, device=DEVICE, dtype=FP32 if long else BF16), _r(n, device=DEVICE), _r(n, device=DEVICE)]
        return (lambda x, w, b: F.layer_norm(x, w, b, stable=long)), inputs, long and not big
    return case


def _residual_determinism(long: bool) -> Callable:
    # bf16 x on an fp32 residual stream: dx and dresidual written apart; y and h summed into one
    # output so that gradients flow back through both.
    def case(big):
        rows, n = _pick(big, (257, 20000), (9, 100)) if long else _pick(big, (4099, 1000), (37, 50))

        def fn(x, r, w):
            y, h = F.rms_norm(x, w, residual=r)
            return y.float() + h
        return fn, [_r(rows, n, device=DEVICE, dtype=BF16), _r(rows, n, device=DEVICE), _r(n, device=DEVICE)], \
            long and not big
    return case


def _softmax_causal_padding_determinism(big):
    shape = _pick(big, (8, 4, 257, 1000), (2, 3, 9, 40))
    pad = torch.rand(shape[0], shape[-1], device=DEVICE) < 0.3
    fn = lambda x: F.softmax(x, causal=True, scale=0.3, key_padding_mask=pad)  # noqa: E731
    return fn, [_r(*shape, device=DEVICE, dtype=FP16)], False


def _softmax_long_determinism(big):
    x = _r(*_pick(big, (3, 5, 40000), (2, 3, 100)), device=DEVICE, dtype=BF16)
    return (lambda x: F.softmax(x, causal=True)), [x], not big


def _weighted_sum_determinism(split: bool) -> Callable:
    def case(big):
        rows, n = _pick(big, (7, 100000), (3, 5000)) if split else _pick(big, (100003, 64), (203, 16))
        inputs = [_r(rows, n, device=DEVICE, dtype=BF16), _r(n, device=DEVICE), _r(device=DEVICE)]
        return (lambda x, w, b: F.weighted_sum(x, w, b)), inputs, False
    return case


def _coor_descent_determinism(big):
    shape = _pick(big, (64, 5000), (6, 40))
    mask = torch.rand(shape, device=DEVICE) > 0.3
    k = (torch.rand(shape[0], device=DEVICE) * 50 + 1).requires_grad_()
    fn = lambda s, k: F.coor_descent(s, n_iters=20, k=k, eps=0.03, eps_init=4.0, eps_decay=0.7, mask=mask)  # noqa
    return fn, [_r(*shape, device=DEVICE), k], False


def _coor_descent_long_determinism(big):
    s = _r(*_pick(big, (4, 20000), (3, 100)), device=DEVICE, dtype=BF16)
    return (lambda s: F.coor_descent(s, n_iters=10, k=100.0)), [s], not big


# ------------------------------------------------------------------------------ the cards

@dataclass(frozen=True)
class Card:
    """What the cross-cutting tests need to know about one op (a public op, or one of its
    forms: ``add_rms_norm`` is ``rms_norm`` with a residual)."""
    name: str
    # the op of kernels/ops.py's __all__ its kernels run as (None: the FP8 norms' own door)
    kernel_op: str | None
    # make()'s case: (name, r, device, dtype, layout, gen, rows, cols) -> (ours, exact, inputs)
    case: Callable
    # tests/test_doors.py: forms of the kernel op, "<kernel op>-<form>" -> a builder of its
    # 2-D inputs (in the description's order) on a device
    doors: dict = field(default_factory=dict)
    # tests/test_doors.py: a public call of an N-D x that reaches the kernel op
    public_call: Callable | None = None
    # tests/test_doors.py: calls whose plan is found again, case -> (r(*shape), a bool mask of
    # (2, 24)) -> (fn, its inputs): bitwise what planning gave
    planned_calls: dict = field(default_factory=dict)
    # tests/test_doors.py: under torch.func's grad and vmap, w of (24,) -> (ours(t), the
    # reference(t)) for t of (3, 5, 24) (or one sample of it, under vmap)
    under_func: Callable | None = None
    # tests/test_training_setups.py: references in float64 (where gradgradcheck checks their own
    # second derivatives: the double backward's torch ops), name -> (the reference, its
    # arguments from r(*shape), a float64 leaf, and the generator g)
    references: dict = field(default_factory=dict)
    # tests/test_training_setups.py: a gradient penalty through its module, module name ->
    # device -> (ours, the torch layer or definition it must match)
    penalty_modules: dict = field(default_factory=dict)
    # tests/test_training_setups.py: (x of (3, 5, 24), w of (24,)) -> [(an output, the shape it
    # must have)], called under FakeTensorMode
    fake_shapes: Callable | None = None
    # tests/test_integrations.py: its module (use_triton -> the layer), under autocast(bfloat16)
    # with fp32 parameters; a norm's autocast_bf16(module, x), what it computes there: the same
    # call outside autocast with out_dtype=bfloat16 (a module without it keeps x's dtype)
    layer: Callable | None = None
    autocast_bf16: Callable | None = None
    # tests/test_subclass_zoo.py: its modules on each kind of tensor subclass, r(*shape) ->
    # [(name, module, inputs, keyword arguments)]; r draws their inputs and parameters
    zoo_modules: Callable | None = None
    # tests/test_subclass_zoo.py: on fake and meta tensors, (factory(shape, requires_grad), w of
    # (24,)) -> (the main input's shape, call(x) -> one output)
    meta_call: Callable | None = None
    # tests/test_subclass_zoo.py: a call of a jagged NestedTensor nt of (2, j, 24) (a TypeError)
    jagged_call: Callable | None = None
    # tests/test_bad_inputs.py: its plain values, argument -> (its doors: name -> a call with the
    # value, [(bad value, the exception)]): the op, the module and the reference raise alike
    value_doors: dict = field(default_factory=dict)
    # tests/test_default_devices.py: float64 through it, name -> (inputs, ours(*inputs,
    # use_triton=...), torch's definition(*inputs)); small shapes (gradcheck)
    float64: dict = field(default_factory=dict)
    # tests/test_default_devices.py: its modules built under a default device or dtype, name ->
    # (ours(), what torch would build in its place or None, how many parameters, a run on meta
    # (module, x of (2, 5, 8), scores of (2, 5, 5)) -> an output)
    default_modules: dict = field(default_factory=dict)
    # tests/test_default_devices.py: an fp32 x of (3, 8) with one float64 argument, name ->
    # (call(x, w, use_triton=...), the argument its error names)
    mixed_float64: dict = field(default_factory=dict)
    # tests/test_default_devices.py: float64 modules against torch's, name -> (torch's layer(dim),
    # ours(dim, **kwargs) that loads its state_dict, torch's output as ours gives it)
    float64_modules: dict = field(default_factory=dict)
    # tests/test_devices.py (GPU: launches on the tensors' device and stream, CUDA graphs):
    # device -> (leaves, fn(*leaves) -> output), fresh random inputs each call
    on_device: Callable | None = None
    # tests/test_devices.py (two GPUs): (its call(x, w), the pattern of its ValueError) for x of
    # (4, 16) on cuda:0 and w of (16,) on cuda:1: the error names both devices
    two_devices: tuple | None = None
    # tests/test_launch_decisions.py: (t, big) -> {label: a builder of the kernel op's arguments},
    # t(shape, dtype) a tensor; big for the GPUs' shapes (meta tensors), else the CPU's small ones.
    # The labels are launch_decisions.json's keys: a new op's cases are recorded anew there.
    decisions: Callable | None = None
    # tests/test_pdl.py: meta(*shape, dtype=bfloat16, grad=True) -> [(kernel op, its arguments)]:
    # launches planned on meta tensors, which together launch every kernel of pdl_kernels' names
    pdl_launches: Callable | None = None
    pdl_kernels: tuple = ()
    # tests/test_tensor_parallel.py: an op on row-sharded inputs (data-sharded DTensors),
    # (device, shard) -> (fn, its values, each value's placement), shard(t) a DTensor of t's rows
    tp_rows: Callable | None = None
    # tests/test_gpu_reliability.py: bitwise the same twice, case -> big -> (fn, its inputs, under
    # the "small" limits?); every kernel op has some
    determinism: dict = field(default_factory=dict)


# (value_doors' inputs and the values they pass)
NAN, INF = float("nan"), float("inf")
_S = lambda: randn_leaf(2, 6, device=DEVICE, grad=False)  # noqa: E731
CD = {"n_iters": 3, "k": 2.0, "eps": 0.1}
# norm's flags after the parameters: eps, rms, stable, unit_offset, cast_before_weight, out_dtype.
CARDS = {card.name: card for card in (
    Card("layer_norm", "norm", _norm_case, on_device=_layer_norm_on_device, determinism={
        "layer_norm": _layer_norm_determinism(False), "layer_norm-long-stable": _layer_norm_determinism(True)},
         two_devices=(F.layer_norm, r"x on cuda:0.*weight on cuda:1"), decisions=_norm_decisions(
        "layernorm", lambda x, w, dtype: (x(), w(), w(), 1e-5, False, False, False, False, dtype)), doors={
        "norm-layer": lambda dev: (_r(6, 300, device=dev), _r(300, device=dev), _r(300, device=dev),
                                   1e-5, False, True, False, False, FP32),
        "norm-layer-no-bias": lambda dev: (_r(5, 70, device=dev, dtype=BF16), _r(70, device=dev), None,
                                           1e-5, False, False, False, False, BF16),
    }, public_call=lambda x: F.layer_norm(x, torch.randn(x.shape[-1], device=x.device)), planned_calls={
        "layer_norm": lambda r, mask: (lambda x, w, b: F.layer_norm(x, w, b), (r(3, 5, 24), 1 + r(24), r(24))),
    }, under_func=lambda w: (lambda t: F.layer_norm(t, w), lambda t: TF.layer_norm(t, (24,), w)), references={
        "norm": (lambda x, w, b: reference.norm(x, w, b, 1e-5), lambda r, g: (r(3, 6), r(6), r(6))),
    }, penalty_modules={"TritonLayerNorm": lambda d: (TritonLayerNorm(24).to(d), torch.nn.LayerNorm(24).to(d))},
        fake_shapes=lambda x, w: [(F.layer_norm(x, w, w), x.shape)], zoo_modules=_layer_norm_zoo,
        meta_call=lambda factory, w: ((4, 24), lambda x: F.layer_norm(x, w, factory((24,), True))),
        jagged_call=lambda nt: F.layer_norm(nt, torch.ones(24, device=DEVICE)), default_modules={
        "layer_norm": (lambda: TritonLayerNorm(8), lambda: torch.nn.LayerNorm(8), 2, lambda m, x, s: m(x)),
        "layer_norm_no_bias": (lambda: TritonLayerNorm((2, 4), bias=False),
                               lambda: torch.nn.LayerNorm((2, 4), bias=False), 1,
                               lambda m, x, s: m(x.reshape(2, 5, 2, 4))),
    }, mixed_float64={
        "weight": (lambda x, w, **kw: F.layer_norm(x, w.double(), **kw), "weight"),
        "bias": (lambda x, w, **kw: F.layer_norm(x, w, w.double(), **kw), "bias"),
    }, float64_modules={"layer_norm": (torch.nn.LayerNorm, TritonLayerNorm, lambda y: y)},
        layer=lambda use_triton: TritonLayerNorm(24, bias=True, use_triton=use_triton),
        autocast_bf16=lambda m, x: F.layer_norm(x, m.weight, m.bias, m.eps, use_triton=m.use_triton,
                                                out_dtype=torch.bfloat16), value_doors={
        # (the norms' eps: both norms' doors, on this card)
        "norm eps": ({
            "F.layer_norm": lambda v: F.layer_norm(_S(), eps=v),
            "F.rms_norm": lambda v: F.rms_norm(_S(), eps=v),
            "TritonLayerNorm": lambda v: TritonLayerNorm(6, eps=v),
            "TritonRMSNorm": lambda v: TritonRMSNorm(6, eps=v),
            "reference.layer_norm": lambda v: reference.layer_norm(_S(), None, None, v, False),
            "reference.rms_norm": lambda v: reference.rms_norm(_S(), None, v),
        }, [(-1e-5, ValueError), (NAN, ValueError), (INF, ValueError), ("1e-5", TypeError), (True, TypeError)]),
        "stable": ({
            "F.layer_norm": lambda v: F.layer_norm(_S(), stable=v),
            "TritonLayerNorm": lambda v: TritonLayerNorm(6, stable=v),
            "reference.layer_norm": lambda v: reference.layer_norm(_S(), None, None, 1e-5, v),
        }, [(1, TypeError), ("yes", TypeError), (None, TypeError)]),
    }, float64={
        "layer_norm": (lambda: (f64_leaf(3, 8), f64_leaf(8), f64_leaf(8)),
                       lambda x, w, b, **kw: F.layer_norm(x, w, b, **kw),
                       lambda x, w, b: TF.layer_norm(x, (8,), w, b)),
    }),
    Card("rms_norm", "norm", _norm_case, decisions=_norm_decisions(
        "rmsnorm", lambda x, w, dtype: (x(), w(), None, 1e-6, True, False, False, False, dtype)),
        pdl_launches=_norm_pdl_launches, pdl_kernels=("_norm_fwd_kernel", "_norm_bwd_kernel", "_partials_sum_kernel",
                                                      "_norm_fwd_split_kernel", "_norm_bwd_split_kernel"), doors={
        "norm-rms": lambda dev: (_r(5, 70, device=dev, dtype=BF16), _r(70, device=dev), None,
                                 1e-6, True, False, True, False, FP32),
        "norm-rms-llama": lambda dev: (_r(5, 70, device=dev, dtype=BF16), _r(70, device=dev, dtype=BF16), None,
                                       1e-6, True, False, False, True, BF16),
    }, references={
        "norm stable unit_offset": (
            lambda x, w: reference.norm(x, w, None, 1e-5, rms=True, stable=True, unit_offset=True),
            lambda r, g: (r(3, 6), r(6))),
    }, penalty_modules={"TritonRMSNorm": lambda d: (TritonRMSNorm(24).to(d), torch.nn.RMSNorm(24).to(d))},
        zoo_modules=_rms_norm_zoo, meta_call=lambda factory, w: ((4, 24), lambda x: F.rms_norm(x, w)),
        jagged_call=lambda nt: F.rms_norm(nt, torch.ones(24, device=DEVICE)), default_modules={
        "rms_norm": (lambda: TritonRMSNorm(8), lambda: torch.nn.RMSNorm(8), 1, lambda m, x, s: m(x)),
        "rms_norm_unit_offset": (lambda: TritonRMSNorm(8, unit_offset=True), None, 1, lambda m, x, s: m(x)),
    }, mixed_float64={"out_dtype": (lambda x, w, **kw: F.rms_norm(x, w, out_dtype=torch.float64, **kw), "out_dtype")},
        # (eps=None: float64's epsilon, as torch)
        float64_modules={"rms_norm": (torch.nn.RMSNorm, TritonRMSNorm, lambda y: y)},
        layer=lambda use_triton: TritonRMSNorm(24, use_triton=use_triton),
        autocast_bf16=lambda m, x: F.rms_norm(x, m.weight, m.eps, use_triton=m.use_triton,
                                              out_dtype=torch.bfloat16), value_doors={
        "unit_offset": ({
            "F.rms_norm": lambda v: F.rms_norm(_S(), torch.ones(6, device=DEVICE), unit_offset=v),
            "TritonRMSNorm": lambda v: TritonRMSNorm(6, unit_offset=v),
            "reference.rms_norm": lambda v: reference.rms_norm(_S(), torch.ones(6, device=DEVICE), 1e-6, v),
        }, [(1, TypeError), ("False", TypeError)]),
    }, float64={
        "rms_norm": (lambda: (f64_leaf(3, 8), f64_leaf(8)),
                     lambda x, w, **kw: F.rms_norm(x, w, **kw),
                     lambda x, w: TF.rms_norm(x, (8,), w)),
        # eps=None is float64's epsilon for float64, as torch: rows this small tell it from fp32's
        "rms_norm_default_eps": (lambda: (f64_leaf(3, 8, scale=1e-6),),
                                 lambda x, **kw: F.rms_norm(x, **kw),
                                 lambda x: TF.rms_norm(x, (8,))),
    }),
    # + residual and residual_dtype: bf16 x, fp32 residual stream (dx and dresidual differ)
    Card("add_rms_norm", "residual_norm", _norm_case, decisions=_norm_decisions(
        "add_rmsnorm", lambda x, w, dtype: (x(), x(), w(), None, 1e-6, True, False, False, False, dtype, dtype)),
        determinism={"rms_norm-residual": _residual_determinism(False),
                     "rms_norm-residual-long": _residual_determinism(True)}, doors={
        "residual_norm-rms": lambda dev: (_r(5, 70, device=dev, dtype=BF16), _r(5, 70, device=dev),
                                          _r(70, device=dev), None, 1e-6, True, False, False, False, BF16, FP32),
    }, public_call=lambda x: F.rms_norm(x, residual=torch.randn_like(x))[0],
        fake_shapes=lambda x, w: [(t, x.shape) for t in F.rms_norm(x, w, residual=x)],
        meta_call=lambda factory, w: ((4, 24), lambda x: F.rms_norm(x, w, residual=factory((4, 24), True))[0]),
        mixed_float64={"residual": (lambda x, w, **kw: F.rms_norm(x, w, residual=x.double(), **kw), "residual")},
        planned_calls={
        "rms_norm+residual": lambda r, mask: (
            lambda x, res, w: F.rms_norm(x, w, residual=res, residual_dtype=torch.float32)[0],
            (r(6, 24), r(6, 24), 1 + r(24))),
    }, references={
        "rms_norm+residual": (
            lambda x, r, w: torch.cat(reference.norm(x, w, None, 1e-5, rms=True, residual=r), -1),
            lambda r, g: (r(3, 6), r(3, 6), r(6))),
    }, float64={
        "rms_norm_residual": (lambda: (f64_leaf(3, 8), f64_leaf(3, 8), f64_leaf(8)),
                              lambda x, r, w, **kw: F.rms_norm(x, w, residual=r, **kw),
                              lambda x, r, w: (TF.rms_norm(x + r, (8,), w), x + r)),
    }),
    # one dtype: dx and dresidual are one tensor (returned once by the custom op)
    Card("add_layer_norm", "residual_norm", _norm_case, decisions=_norm_decisions(
        "add_layernorm", lambda x, w, dtype: (x(), x(), w(), w(), 1e-5, False, False, False, False, dtype, dtype)),
        pdl_launches=_residual_norm_pdl_launches, doors={
        "residual_norm-layer": lambda dev: (_r(6, 300, device=dev), _r(6, 300, device=dev), _r(300, device=dev),
                                            _r(300, device=dev), 1e-5, False, False, False, False, FP32, FP32),
    }, float64={
        "layer_norm_residual": (lambda: (f64_leaf(2, 3, 8), f64_leaf(2, 3, 8), f64_leaf(8), f64_leaf(8)),
                                lambda x, r, w, b, **kw: F.layer_norm(x, w, b, residual=r, **kw),
                                lambda x, r, w, b: (TF.layer_norm(x + r, (8,), w, b), x + r)),
    }),
    Card("softmax", "softmax", _softmax_case, on_device=_softmax_on_device, decisions=_softmax_decisions,
         determinism={"softmax-causal-padding": _softmax_causal_padding_determinism,
                      "softmax-long": _softmax_long_determinism},
         pdl_launches=lambda meta: [("softmax", (meta(8 * 64, 64), None, 64, 64, True, 1.0))],
         pdl_kernels=("_softmax_fwd_kernel", "_softmax_bwd_kernel"), doors={
        "softmax": lambda dev: (_r(30, 70, device=dev, dtype=torch.bfloat16), torch.rand(2, 70, device=dev) > 0.7,
                                5, 15, True, 0.6),
    }, public_call=lambda x: F.softmax(x, causal=True), planned_calls={
        "softmax causal+mask": lambda r, mask: (
            lambda x: F.softmax(x, causal=True, scale=0.3, key_padding_mask=mask), (r(2, 3, 7, 24),)),
    }, under_func=lambda w: (lambda t: F.softmax(t, causal=True, scale=0.5),
                             lambda t: reference.softmax(t, True, 0.5, None)), references={
        "softmax": (lambda x: reference.softmax(x, True, 0.7, None), lambda r, g: (r(2, 3, 5),)),
    }, penalty_modules={"CausalSoftmax": lambda d: (CausalSoftmax().to(d),
                                                    lambda x: reference.softmax(x, True, None, None))},
        fake_shapes=lambda x, w: [(F.softmax(x, causal=True), x.shape)],
        zoo_modules=lambda r: [("CausalSoftmax", CausalSoftmax(), (r(2, 3, 7, 7),), {})],
        meta_call=lambda factory, w: ((2, 3, 5, 5), lambda x: F.softmax(x, causal=True)),
        jagged_call=lambda nt: F.softmax(nt, causal=True),
        default_modules={"softmax": (lambda: CausalSoftmax(), None, 0, lambda m, x, s: m(s))},
        layer=lambda use_triton: CausalSoftmax(scale=0.3, use_triton=use_triton), value_doors={
        "causal": ({
            "F.softmax": lambda v: F.softmax(_S(), causal=v),
            "CausalSoftmax": lambda v: CausalSoftmax(causal=v),
            "reference.softmax": lambda v: reference.softmax(_S(), v),
        }, [(1, TypeError), ("no", TypeError), (None, TypeError)]),
        "scale": ({
            "F.softmax": lambda v: F.softmax(_S(), scale=v),
            "CausalSoftmax": lambda v: CausalSoftmax(scale=v),
            "reference.softmax": lambda v: reference.softmax(_S(), False, v),
        }, [(NAN, ValueError), (INF, ValueError), ("0.5", TypeError), (True, TypeError)]),
    }, float64={
        "softmax": (lambda: (f64_leaf(3, 7),),
                    lambda x, **kw: F.softmax(x, **kw),
                    lambda x: TF.softmax(x, -1)),
        "causal_softmax": (lambda: (f64_leaf(2, 3, 5),),
                           lambda x, **kw: F.softmax(x, causal=True, scale=0.5, **kw),
                           lambda x: causal_softmax(x, 0.5)),
    }),
    Card("weighted_sum", "weighted_sum", _weighted_sum_case, on_device=_weighted_sum_on_device, determinism={
        "weighted_sum": _weighted_sum_determinism(False), "weighted_sum-split": _weighted_sum_determinism(True)},
         two_devices=(F.weighted_sum, r"cuda:0.*cuda:1"),
         decisions=_weighted_sum_decisions,
         pdl_launches=lambda meta: [("weighted_sum", (meta(64, 1024), meta(1024), meta()))],
         pdl_kernels=("_weighted_sum_fwd_kernel", "_weighted_sum_bwd_kernel"), tp_rows=_weighted_sum_tp_rows, doors={
        "weighted_sum": lambda dev: (_r(9, 300, device=dev), _r(300, device=dev), _r(device=dev)),
    }, public_call=lambda x: F.weighted_sum(x, torch.randn(x.shape[-1], device=x.device)), planned_calls={
        "weighted_sum bias (1,)": lambda r, mask: (lambda x, w, b: F.weighted_sum(x, w, b),
                                                   (r(4, 5, 24), r(24), r(1))),
    }, under_func=lambda w: (lambda t: F.weighted_sum(t, w), lambda t: reference.weighted_sum(t, w, None)),
        references={
        "weighted_sum": (lambda x, w, b: reference.weighted_sum(x, w, b), lambda r, g: (r(3, 6), r(6), r(()))),
    }, penalty_modules={"WeightedSum": _weighted_sum_penalty},
        fake_shapes=lambda x, w: [(F.weighted_sum(x, w), x.shape[:-1])],
        zoo_modules=lambda r: [("WeightedSum", WeightedSum(24).to(DEVICE), (r(2, 5, 24),), {})],
        meta_call=lambda factory, w: ((4, 24), lambda x: F.weighted_sum(x, w, factory((1,), True))),
        jagged_call=lambda nt: F.weighted_sum(nt, torch.ones(24, device=DEVICE)), default_modules={
        "weighted_sum": (lambda: WeightedSum(8, bias=True), lambda: torch.nn.Linear(8, 1), 2, lambda m, x, s: m(x)),
    }, mixed_float64={"weighted_sum": (lambda x, w, **kw: F.weighted_sum(x, w.double(), **kw), "weight")},
        float64_modules={"weighted_sum": (lambda d: torch.nn.Linear(d, 1),
                                          lambda d, **kw: WeightedSum(d, bias=True, **kw), lambda y: y[..., 0])},
        layer=lambda use_triton: WeightedSum(24, bias=True, use_triton=use_triton), value_doors={
        "use_triton": ({
            "F.weighted_sum": lambda v: F.weighted_sum(_S(), torch.ones(6, device=DEVICE), use_triton=v),
            "WeightedSum": lambda v: WeightedSum(6, use_triton=v),
        }, [(1, TypeError), ("yes", TypeError)]),
    }, float64={
        "weighted_sum": (lambda: (f64_leaf(3, 8), f64_leaf(8), f64_leaf(1)),
                         lambda x, w, b, **kw: F.weighted_sum(x, w, b, **kw),
                         lambda x, w, b: TF.linear(x, w[None], b)[..., 0]),
    }),
    Card("coor_descent", "coor_descent", _coor_descent_case, on_device=_coor_descent_on_device, determinism={
        "coor_descent": _coor_descent_determinism, "coor_descent-long": _coor_descent_long_determinism},
         decisions=_coor_descent_decisions, pdl_launches=lambda meta: [
             ("coor_descent", (meta(4, 1000, dtype=FP32), None, None, 100.0, 5, 0.03, 4.0, 0.7))],
         pdl_kernels=("_coor_descent_fwd_kernel", "_coor_descent_bwd_kernel"), tp_rows=_coor_descent_tp_rows, doors={
        "coor_descent": lambda dev: (_r(3, 90, device=dev), torch.rand(3, 90, device=dev) > 0.2,
                                     (torch.rand(3, device=dev) * 20 + 2).requires_grad_(), None, 8, 0.03, 4.0, 0.7),
    }, public_call=lambda x: F.coor_descent(x, n_iters=2, k=3.0), planned_calls={
        "coor_descent k per row+mask": lambda r, mask: (
            lambda s, k: F.coor_descent(s, n_iters=3, k=k, mask=mask[:, None, :].expand(2, 3, 24).contiguous()),
            (r(2, 3, 24), 1 + r(2, 1).abs())),
    }, under_func=lambda w: (lambda t: F.coor_descent(t, n_iters=3, k=2.0),
                             lambda t: reference.coor_descent(t, 3, 2.0, 0.1, None, 1.0, None)),
        fake_shapes=lambda x, w: [(F.coor_descent(x, n_iters=2, k=2.0), x.shape)],
        zoo_modules=lambda r: [("CoordinateDescentRouter", CoordinateDescentRouter(24, n_iters=3).to(DEVICE),
                                (r(2, 11, 24),), {"num_tokens": 4})],
        meta_call=lambda factory, w: ((4, 24), lambda x: F.coor_descent(x, n_iters=2, k=2.0)),
        jagged_call=lambda nt: F.coor_descent(nt, n_iters=2, k=2.0), default_modules={
        "router": (lambda: CoordinateDescentRouter(8, num_routing_tokens=2, n_iters=3), None, 1, _router_on_meta),
    }, references={
        "coor_descent": (lambda s, k: reference.coor_descent(s, 2, k, 0.5, None, 1.0, None),
                         lambda r, g: (r(3, 6), (torch.rand(3, generator=g, dtype=torch.float64) + 1.5)
                                       .requires_grad_())),
    }, value_doors={name: ({
        "F.coor_descent": lambda v, name=name: F.coor_descent(_S(), **{**CD, name: v}),
        **({"CoordinateDescentRouter": lambda v, name=name: CoordinateDescentRouter(8, **{name: v})}
           if name != "k" else {}),
        "reference.coor_descent": lambda v, name=name: reference.coor_descent(_S(), **{**CD, "eps_init": None,
                                                                                   "eps_decay": 1.0, name: v},
                                                                               mask=None),
    }, bad) for name, bad in {
        "n_iters": [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError), ("2", TypeError)],
        "k": [(0, ValueError), (-1.0, ValueError), (INF, ValueError), (7.0, ValueError), ("2", TypeError),
              (True, TypeError)],
        "eps": [(0, ValueError), (-0.1, ValueError), (NAN, ValueError), ("0.1", TypeError), (True, TypeError)],
        "eps_init": [(0, ValueError), (INF, ValueError), ("4", TypeError)],
        "eps_decay": [(0, ValueError), (-0.7, ValueError), (None, TypeError), (False, TypeError)],
    }.items()}, float64={
        # (the float64 reference is coor_descent's definition; tests/test_coor_descent.py checks it
        # against an independent one)
        "coor_descent": (lambda: (f64_leaf(3, 6),),
                         lambda s, **kw: F.coor_descent(s, n_iters=3, k=2.0, **kw),
                         lambda s: reference.coor_descent(s, 3, 2.0, 0.1, None, 1.0, None)),
    }),
    Card("rms_norm_fp8", None, _norm_fp8_case, pdl_launches=lambda meta: [("norm_fp8", (
        meta(64, 1024, grad=False), None, meta(1024, grad=False), None, None, 1e-6, True, False, False, BF16,
        torch.float8_e4m3fn, "per_tensor", False, 0.0, False, False, False))], pdl_kernels=("_norm_fp8_kernel",)),
    Card("layer_norm_fp8", None, _norm_fp8_case),
)}
OPS = tuple(CARDS)


def rows(attr: str) -> dict:
    """One table from every card's dict ``attr`` (its rows, in the cards' order); a row's name
    is unique across the cards."""
    out = {}
    for card in CARDS.values():
        for key, value in getattr(card, attr).items():
            assert key not in out, f"{key!r} on two cards"
            out[key] = value
    return out
