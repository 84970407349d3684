"""LayerNorm forward and backward (dx + dweight + dbias) against torch, torch.compile, Liger.

Bytes model: forward reads x and writes y (2*M*D*s); backward reads x and dy and writes
dx (3*M*D*s); the D-sized parameters are left out. Run: python -m benchmarks.bench_layernorm
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from benchmarks import harness
from triton_layers import functional as TF

OP = "layernorm"
# What python -m benchmarks, its report, plots and benchmarks.dev.registers make of this part (benchmarks/parts.py).
PART = {
    "order": 10,
    "ops": {"layernorm": {
        "title": "LayerNorm (weight and bias; backward = dx, dweight, dbias)",
        "note": "bytes: fwd 2MDs, bwd 3MDs (M rows of D elements of s bytes)",
        "measure": "bandwidth", "kernel_ops": ("norm",)}},
    "cpu_shapes": [(3, 40)],
}
SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (4096, 32768), (1024, 131072), (512, 262144)]
QUICK_SHAPES = [(16384, 4096), (4096, 32768)]
EPS = 1e-5


def _liger():
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except ImportError:
        return None
    return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)


def host_cases(r, dev) -> dict:
    """``benchmarks.bench_host``'s cases of this op: label -> (leaf inputs drawn by ``r(*shape)`` on ``dev``,
    ours, torch's), each a function of the leaves."""
    return {"layer_norm 8x256": ([r(8, 256), r(256), r(256)], lambda x, w, b: TF.layer_norm(x, w, b),
                                 lambda x, w, b: F.layer_norm(x, (256,), w, b))}


def cases(opts: argparse.Namespace) -> list[tuple[torch.dtype, tuple[int, int]]]:
    """The (dtype, (rows, row length)) pairs a run measures, in order."""
    return harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and the peers, name -> f(x, w, b)."""
    impls = {
        "triton_layers": lambda x, w, b: TF.layer_norm(x, w, b, EPS),
        "torch": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS),
    }
    if not opts.no_compile:
        impls["compile"] = harness.compiled(lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS))
    liger = _liger()
    if liger is not None:
        impls["liger"] = liger
    return impls


def build(key: tuple[torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """x (M, D), weight and bias (D,) away from 1 and 0, dy; forward and backward."""
    dtype, (m, d) = key
    x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
    dy = torch.randn_like(x)
    nbytes = m * d * harness.element_size(dtype)
    return harness.Case(f"{m}x{d}", dtype, harness.fwd_bwd(lambda op: op(x, w, b), dy, [x, w, b],
                                                           2 * nbytes, 3 * nbytes))


if __name__ == "__main__":
    harness.run_alone(sys.modules[__name__])
