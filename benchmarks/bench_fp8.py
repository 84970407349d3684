"""The FP8-output norms (``rms_norm_fp8``, ``layer_norm_fp8``): the norm and its e4m3
quantization in one pass, against the same norm followed by the quantize, unfused, and
against torch.compile of the whole reference. Forward only, under torch.no_grad.

Ops, one table each (the ``op`` column of fp8.csv), each named by its recipe:

- ``rmsnorm_fp8_per_token``: a scale per row; ``rmsnorm_fp8_per_tensor``: one dynamic scale
  (the whole output's amax); ``rmsnorm_fp8_static``: one given scale; ``rmsnorm_fp8_per_group``:
  a scale per 1x128 block, row-major; ``rmsnorm_fp8_per_group_colmajor``: the same scales
  column-major (DeepGEMM's layout); ``rmsnorm_fp8_per_group_transposed``: per_group, also
  writing the transposed 128x1-block copy (``FP8Recipe(transposed=True)``: what a weight-gradient
  GEMM reads), every implementation writing both;
- ``add_rmsnorm_fp8_per_token`` and ``add_rmsnorm_fp8_static``: h = x + r, then the norm of h,
  returning h too;
- ``layernorm_fp8_per_token``: LayerNorm with weight and bias.

Shapes: the training rows 16384x4096 (the headline) and 4096x8192; decode rows 1, 8, 64, 512
at hidden 4096 and 8192 (``--quick``: 8x4096 and 16384x4096). bf16 input unless ``--dtypes``
names others (the harness's default, bf16 and fp32, means bf16 alone here: an FP8 recipe
quantizes a bf16 activation; give e.g. ``--dtypes float32,bfloat16`` for both).

Implementations, side by side: ``triton_layers`` (ours: the fused op); ``unfused`` (our bf16
norm, then ``reference.quantize_fp8`` eager: torch ops reading the bf16 output back as
fp32); ``unfused_compiled_quant`` (our bf16 norm, then the same quantize under torch.compile);
``compile`` (torch.compile of ``reference.norm_fp8`` returning data, scales and h: Inductor
fuses norm, amax and cast); ``flashinfer`` where it imports (``rmsnorm_quant`` and
``fused_add_rmsnorm_quant``: static per-tensor scales only, so the two static ops; its fused
add writes h over r in place).

Bytes model: what each op must move, M rows of D elements of s bytes (s = 2 for bf16), FP8
data 1 byte an element, fp32 scales, the weight (and bias) read once:

- rmsnorm_fp8_per_token: M*D*s + M*D + 4*M + D*s (reads x, writes data and a scale a row);
- rmsnorm_fp8_per_tensor: M*D*s + M*D + 4 + D*s (the minimum, one read of x: our kernel reads
  x twice, as a per-tensor scale depends on every row, and is charged one);
- rmsnorm_fp8_static: M*D*s + M*D + 4 + D*s (the scale read instead of written);
- rmsnorm_fp8_per_group: M*D*s + M*D + 4*M*D/128 + D*s;
- rmsnorm_fp8_per_group_colmajor: as per_group (the layout's padding of M to 4 not counted);
- rmsnorm_fp8_per_group_transposed: per_group + M*D + 4*D*ceil(M/128) (the transposed data and
  its scales; the minimum, one read of x: our copy's launch reads x a second time, and the
  rows' statistics, and is charged one);
- add_rmsnorm_fp8_per_token: 3*M*D*s + M*D + 4*M + D*s (also reads r and writes h);
- add_rmsnorm_fp8_static: 3*M*D*s + M*D + 4 + D*s;
- layernorm_fp8_per_token: M*D*s + M*D + 4*M + 2*D*s (weight and bias).

Each cell, as every benchmark here: the eager call's time and the GPU time of the same call
replayed from a CUDA graph, with the copy bandwidth of the run (``harness``); each
implementation's first output is checked against the fp32 norm (a warning, not a stop).
Run: ``python -m benchmarks.bench_fp8 --out DIR`` (``--quick``, ``--no-compile``), or as the
``fp8`` part of ``python -m benchmarks``. Needs an FP8 GPU (compute capability 8.9+). Time,
estimated before any GPU run: about 8-12 minutes, most of it compiling the two compiled peers
(one compile each per op and shape); ``--quick`` about 2-3 minutes.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from typing import NamedTuple, Optional

import torch

from benchmarks import harness
from triton_layers import FP8Recipe, reference
from triton_layers import functional as TF
from triton_layers.fp8 import GROUP_SIZE, dequantize

OP = "fp8"
# What python -m benchmarks, its report, plots and benchmarks.dev.registers make of this part (benchmarks/parts.py).
# kernel_ops: the FP8 kernel op (kernels.ops.norm_fp8) is not among the ops the registers tool builds
# (kernels.ops.__all__, the differentiable ones), so these name the unfused peers' bf16 norms only.
PART = {
    "order": 25,
    "plot": "recipes",  # (one fp8.png: every recipe's % of copy at each shape, side by side)
    "ops": {
        "rmsnorm_fp8_per_token": {
            "title": "RMSNorm to FP8 e4m3, a scale per row (dynamic)",
            "note": "bytes: MDs + MD + 4M + Ds (reads x, writes data and scales, reads the weight)",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
        "rmsnorm_fp8_per_tensor": {
            "title": "RMSNorm to FP8 e4m3, one scale from the whole output's amax (dynamic)",
            "note": "bytes: MDs + MD + 4 + Ds, the minimum (x read once; our kernel reads it twice)",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
        "rmsnorm_fp8_static": {
            "title": "RMSNorm to FP8 e4m3, one given scale (static)",
            "note": "bytes: MDs + MD + 4 + Ds",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
        "rmsnorm_fp8_per_group": {
            "title": "RMSNorm to FP8 e4m3, a scale per 1x128 block (row-major scales)",
            "note": "bytes: MDs + MD + 4MD/128 + Ds",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
        "rmsnorm_fp8_per_group_colmajor": {
            "title": "RMSNorm to FP8 e4m3, a scale per 1x128 block (column-major scales)",
            "note": "bytes: MDs + MD + 4MD/128 + Ds",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
        "rmsnorm_fp8_per_group_transposed": {
            "title": "RMSNorm to FP8 e4m3, 1x128 blocks and their transposed 128x1-block copy",
            "note": "bytes: MDs + 2MD + 4MD/128 + 4D*ceil(M/128) + Ds",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
        "add_rmsnorm_fp8_per_token": {
            "title": "Fused residual add + RMSNorm to FP8 e4m3, a scale per row: returns (data, scales, h)",
            "note": "bytes: 3MDs + MD + 4M + Ds (reads x, r; writes h, data, scales)",
            "measure": "bandwidth", "kernel_ops": ("residual_norm",)},
        "add_rmsnorm_fp8_static": {
            "title": "Fused residual add + RMSNorm to FP8 e4m3, one given scale: returns (data, scale, h)",
            "note": "bytes: 3MDs + MD + 4 + Ds",
            "measure": "bandwidth", "kernel_ops": ("residual_norm",)},
        "layernorm_fp8_per_token": {
            "title": "LayerNorm (weight and bias) to FP8 e4m3, a scale per row",
            "note": "bytes: MDs + MD + 4M + 2Ds",
            "measure": "bandwidth", "kernel_ops": ("norm",)},
    },
    "cpu_shapes": [(3, 256)],
}
SHAPES = [(16384, 4096), (4096, 8192)] + [(rows, d) for d in (4096, 8192) for rows in (1, 8, 64, 512)]
QUICK_SHAPES = [(8, 4096), (16384, 4096)]
EPS = 1e-6
OURS = "triton_layers"
STATIC_SCALE = 1 / 32  # the static recipes' dequantization scale: outputs up to 448 / 32 = 14 are not clipped


class Spec(NamedTuple):
    """An op: RMSNorm or LayerNorm, with the fused residual add or not, its recipe, a static scale or not."""

    rms: bool
    residual: bool
    recipe: FP8Recipe
    static: bool = False


PER_TOKEN, PER_TENSOR = FP8Recipe("per_token"), FP8Recipe("per_tensor")
OPS = {
    "rmsnorm_fp8_per_token": Spec(True, False, PER_TOKEN),
    "rmsnorm_fp8_per_tensor": Spec(True, False, PER_TENSOR),
    "rmsnorm_fp8_static": Spec(True, False, PER_TENSOR, static=True),
    "rmsnorm_fp8_per_group": Spec(True, False, FP8Recipe("per_group")),
    "rmsnorm_fp8_per_group_colmajor": Spec(True, False, FP8Recipe("per_group", column_major_scales=True)),
    "rmsnorm_fp8_per_group_transposed": Spec(True, False, FP8Recipe("per_group", transposed=True)),
    "add_rmsnorm_fp8_per_token": Spec(True, True, PER_TOKEN),
    "add_rmsnorm_fp8_static": Spec(True, True, PER_TENSOR, static=True),
    "layernorm_fp8_per_token": Spec(False, False, PER_TOKEN),
}

# Every implementation is f(x, w, b, r, scale) -> (data, scales, h): b, r, scale None where the op has none.


def _ours(spec: Spec):
    """Our fused op: ``rms_norm_fp8`` or ``layer_norm_fp8``."""
    def f(x, w, b, r, scale):
        if spec.rms:
            out = TF.rms_norm_fp8(x, w, EPS, recipe=spec.recipe, scale=scale, residual=r)
        else:
            out = TF.layer_norm_fp8(x, w, b, EPS, recipe=spec.recipe, scale=scale, residual=r)
        return out.data, out.scale, out.h  # (with the transposed copy: written, and kept in ``out``)
    return f


def _unfused(spec: Spec, quantize):
    """Our bf16 norm (with the residual: its fused add), then ``quantize(y, recipe, scale)``,
    which reads the bf16 output and takes it to fp32 itself."""
    def f(x, w, b, r, scale):
        out = TF.rms_norm(x, w, EPS, residual=r) if spec.rms else TF.layer_norm(x, w, b, EPS, residual=r)
        y, h = out if r is not None else (out, None)
        if spec.recipe.transposed:  # (the copy's quantize too: the same work as ours)
            quantize(y, spec.recipe, scale, transposed=True)
        return (*quantize(y, spec.recipe, scale), h)
    return f


def _reference(spec: Spec):
    """The whole reference (``reference.norm_fp8``), less the fp32 y it also returns: for torch.compile."""
    def f(x, w, b, r, scale):
        data, scales, h, y = reference.norm_fp8(x, w, b, EPS, spec.recipe, scale, rms=spec.rms, residual=r)
        if spec.recipe.transposed:  # (returned, so that Inductor keeps it)
            return data, scales, h, reference.quantize_fp8_transposed(y.detach(), spec.recipe)
        return data, scales, h
    return f


def _quantize(y, recipe: FP8Recipe, scale, transposed: bool = False):
    """``reference.quantize_fp8`` of ``y``, or (``transposed``) its transposed copy
    (``reference.quantize_fp8_transposed``): the unfused peers' quantize."""
    return reference.quantize_fp8_transposed(y, recipe) if transposed else reference.quantize_fp8(y, recipe, scale)


def _flashinfer() -> Optional[dict]:
    """FlashInfer's static per-tensor RMSNorm + FP8 (its scale a dequantization scale, as ours),
    or None where flashinfer does not import. Its current API takes the scale as a (1,) fp32 tensor
    (``scale: float | Tensor``), older releases as a float: the annotation says which."""
    try:
        from flashinfer.norm import fused_add_rmsnorm_quant, rmsnorm_quant
    except ImportError:
        return None
    try:  # (no annotation to read: the current API)
        annotation = inspect.signature(rmsnorm_quant).parameters["scale"].annotation
        takes_tensor = annotation is inspect.Parameter.empty or "Tensor" in str(annotation)
    except (TypeError, ValueError, KeyError):
        takes_tensor = True

    def arg(scale):
        """The scale as the installed release takes it."""
        return scale if takes_tensor else STATIC_SCALE

    def norm(x, w, b, r, scale):
        """rmsnorm_fp8_static: ``rmsnorm_quant`` into a new e4m3 tensor."""
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        rmsnorm_quant(out, x, w, arg(scale), EPS)
        return out, scale, None

    def add_norm(x, w, b, r, scale):
        """add_rmsnorm_fp8_static: ``fused_add_rmsnorm_quant``, h written over r (r += x; the last
        implementation of a case, after the others have read r)."""
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        fused_add_rmsnorm_quant(out, x, r, w, arg(scale), EPS)
        return out, scale, r

    return {"rmsnorm_fp8_static": norm, "add_rmsnorm_fp8_static": add_norm}


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and the peers, name -> {op: f(x, w, b, r, scale)}."""
    impls = {OURS: {op: _ours(s) for op, s in OPS.items()},
             "unfused": {op: _unfused(s, _quantize) for op, s in OPS.items()}}
    if not opts.no_compile:
        quantize = harness.compiled(_quantize)
        impls["unfused_compiled_quant"] = {op: _unfused(s, quantize) for op, s in OPS.items()}
        impls["compile"] = {op: harness.compiled(_reference(s)) for op, s in OPS.items()}
    flashinfer = _flashinfer()
    if flashinfer is not None:
        impls["flashinfer"] = flashinfer
    return impls


def dtypes(opts: argparse.Namespace) -> list[torch.dtype]:
    """``--dtypes``, where given; bf16 alone where it is the harness's default."""
    default = harness.add_common_args(argparse.ArgumentParser()).get_default("dtypes")
    return [torch.bfloat16] if opts.dtypes == default else harness.dtypes(opts)


def cases(opts: argparse.Namespace) -> list[tuple[str, torch.dtype, tuple[int, int]]]:
    """(op, dtype, (rows, hidden)) of a run, op by op."""
    shapes = QUICK_SHAPES if opts.quick else SHAPES
    return [(op, dtype, shape) for op in OPS for dtype in dtypes(opts) for shape in shapes]


def nbytes(op: str, m: int, d: int, s: int) -> int:
    """The op's bytes model (the module's docstring): x (and r, h), the FP8 data, the scales, the parameters."""
    spec = OPS[op]
    scales = {"per_token": m, "per_group": m * (d // GROUP_SIZE), "per_tensor": 1}[spec.recipe.granularity]
    if spec.recipe.transposed:  # the copy's data and its scales (a column's 128-row blocks)
        scales += d * -(-m // GROUP_SIZE)
    return ((3 if spec.residual else 1) * m * d * s + m * d * (2 if spec.recipe.transposed else 1) + 4 * scales
            + (1 if spec.rms else 2) * d * s)


def _check(op: str, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], label: str):
    """Case.check: warn (do not stop) where an output's dequantized data is further from the fp32
    norm of its h (the residual ops: the h it returned) or of x than e4m3 rounding allows
    (2**-4 of the largest value)."""
    spec = OPS[op]

    def check(impl: str, out: tuple) -> None:
        data, scales, h = out[:3]  # (the transposed op's compiled peer returns its copy too)
        y = reference.norm(x if h is None else h, w, b, EPS, rms=spec.rms, out_dtype=torch.float32)
        err = ((dequantize(data, scales, spec.recipe.granularity, torch.float32) - y).abs().max()
               / y.abs().max().clamp_min(1e-30)).item()
        if not err <= 2**-4:
            print(f"    WARNING {op} {label} {impl}: error {err:.2e} of the largest value", file=sys.stderr)
    return check


def build(key: tuple[str, torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """x (M, D), a weight away from 1 (a bias away from 0 for LayerNorm), the residual and the
    static scale where the op has them; nothing requiring a gradient; the forward under no_grad."""
    op, dtype, (m, d) = key
    spec = OPS[op]
    x = torch.randn(m, d, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype)
    b = None if spec.rms else (0.1 * torch.randn(d, device=device)).to(dtype)
    r = torch.randn_like(x) if spec.residual else None
    scale = torch.tensor([STATIC_SCALE], device=device, dtype=torch.float32) if spec.static else None
    inputs = (x, w, b, r, scale)

    def make(impl):
        def call():
            with torch.no_grad():
                return impl(*inputs)
        return call

    direction = harness.Direction("fwd", nbytes(op, m, d, harness.element_size(dtype)), make)
    return harness.Case(f"{m}x{d}", dtype, [direction], check=_check(op, x, w, b, f"{m}x{d}"), op=op)


def main(argv: Optional[list[str]] = None) -> None:
    """This file run alone: a table per op, then fp8.csv."""
    harness.run_alone(sys.modules[__name__], argv=sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
