"""Weighted sum y = (x * w).sum(-1), forward and backward (dx + dweight), against torch.

Peers: ``x @ w`` (cuBLAS gemv), ``(x * w).sum(-1)`` in eager torch, and torch.compile of
the latter. Bytes model: forward reads x (M*D*s); backward reads x and writes dx
(2*M*D*s); the D-sized weight and the M-sized y / dy are left out. w has x's dtype for
every implementation. Run: python -m benchmarks.bench_weighted_sum --out $OUT
(benchmarks/dev/tune_weighted_sum.py sweeps our launch knobs at these cases.)
"""
from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import harness
from benchmarks.sanitizing import around, fwd_bwd, rand
from triton_layers import functional as TF
from triton_layers import reference

OP = "weighted_sum"
# What python -m benchmarks, its report, plots and benchmarks.dev.registers make of this part (benchmarks/parts.py).
PART = {
    "order": 40,
    "ops": {"weighted_sum": {
        "title": "WeightedSum y = (x * w).sum(-1)", "note": "bytes: fwd MDs, bwd 2MDs; `matmul` is `x @ w`",
        "measure": "bandwidth", "kernel_ops": ("weighted_sum",)}},
    "cpu_shapes": [(5, 70)],
}
# The four target shapes, then few rows of the longest D (the column-split path).
SHAPES = [(262144, 1024), (65536, 4096), (16384, 16384), (2048, 131072), (32, 262144)]
QUICK_SHAPES = [(65536, 4096), (2048, 131072)]
OURS = "triton_layers"


def _mul_sum(x, w):
    return (x * w).sum(-1)


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, label: str) -> None:
    """Warn (do not stop) if our forward disagrees with a float32 matmul."""
    ref = x.float() @ w.float()
    err = ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if err > (1e-5 if x.dtype == torch.float32 else 1e-2):
        print(f"    WARNING {label}: relative error {err:.2e} against x.float() @ w.float()", file=sys.stderr)


def host_cases(r, dev) -> dict:
    """``benchmarks.bench_host``'s cases of this op: label -> (leaf inputs drawn by ``r(*shape)`` on ``dev``,
    ours, torch's), each a function of the leaves."""
    return {"weighted_sum 8x256": ([r(8, 256), r(256)], lambda x, w: TF.weighted_sum(x, w), lambda x, w: x @ w)}


def sanitize_cases(C) -> dict:
    """``scripts/sanitize.py``'s cases of this op (``benchmarks/sanitizing.py``) under the launch config ``C``:
    tiles of several rows, column ranges split over programs when rows are few (tile_max_cols),
    aligned (16-element) and unaligned rows, partial gradients."""
    out = {}
    tile = C.weighted_sum.tile_max_cols
    for rows, n in [(1, 1), (7, 17), (1000, 7), (3, tile + 1), (2, 16 * tile + 5), (5, 2 * tile)]:
        for dtype, sliced, needs in [(torch.float32, False, [True, True, True]),
                                     (torch.bfloat16, True, [True, True, True]),
                                     (torch.float32, False, [False, True, False]),
                                     (torch.float32, False, [True, False, False])]:
            def ws(rows=rows, n=n, dtype=dtype, sliced=sliced, needs=needs):
                x, w, b = rand(rows, n, dtype=dtype, sliced=sliced), rand(n), rand()
                return fwd_bwd(lambda x, w, b: TF.weighted_sum(x, w, b, use_triton=True), reference.weighted_sum,
                               [x, w, b], needs)
            out[f"weighted_sum {rows}x{n} {str(dtype)[6:]}{' sliced' if sliced else ''} "
                f"grads={''.join('xwb'[i] for i in range(3) if needs[i])}"] = ws
    return {"weighted_sum": out}


def kernel_inputs(shape: tuple[int, int], dtype: torch.dtype, t) -> list:
    """``benchmarks.dev.registers``' kernel forms of one case: (label, kernel op, its description
    inputs), leaves drawn by ``t(*shape, dtype=)`` (meta tensors)."""
    m, d = shape
    return [("weighted_sum", "weighted_sum", (t(m, d, dtype=dtype), t(d, dtype=dtype), t(dtype=dtype)))]


def cases(opts: argparse.Namespace) -> list[tuple[torch.dtype, tuple[int, int]]]:
    """The (dtype, (rows, dim)) pairs a run measures, in order."""
    return harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and the peers, name -> f(x, w)."""
    impls = {
        OURS: lambda x, w: TF.weighted_sum(x, w),
        "matmul": lambda x, w: x @ w,
        "mul-sum": _mul_sum,
    }
    if not opts.no_compile:
        impls["compile"] = harness.compiled(_mul_sum)
    return impls


def build(key: tuple[torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """x (M, D), w (D,) in x's dtype, dy (M,); forward and backward; our forward is checked."""
    dtype, (m, d) = key
    x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
    w = (torch.randn(d, device=device) / d**0.5 + 0.01).to(dtype).requires_grad_()
    dy = torch.randn(m, device=device, dtype=dtype)
    nbytes = m * d * harness.element_size(dtype)
    shape = f"{m}x{d}"

    def check(impl: str, y: torch.Tensor) -> None:
        if impl == OURS:
            _check(y, x, w, f"{shape} {dtype}")

    return harness.Case(shape, dtype, harness.fwd_bwd(lambda op: op(x, w), dy, [x, w], nbytes, 2 * nbytes), check)


if __name__ == "__main__":
    harness.run_alone(sys.modules[__name__])
