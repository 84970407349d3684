"""LayerNorm forward and backward (dx + dweight + dbias) against torch, torch.compile, Liger.

Bytes model: forward reads x and writes y (2*M*D*s); backward reads x and dy and writes
dx (3*M*D*s); the D-sized parameters are left out. Run: python -m benchmarks.bench_layernorm
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks import harness
from triton_layers import functional as TF

SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 32768), (1024, 131072), (512, 262144)]
QUICK_SHAPES = [(16384, 4096), (4096, 32768)]
EPS = 1e-5


def _liger():
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except ImportError:
        return None
    return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)


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


def run(opts: argparse.Namespace, copy_gbps: float, progress: harness.Progress = harness.no_progress) -> list:
    """Time every implementation at every case; returns the Results."""
    device = harness.device()
    impls = implementations(opts)
    results: list = []
    for dtype, (m, d) in cases(opts):
        shape, s = f"{m}x{d}", torch.finfo(dtype).bits // 8
        progress(f"layernorm {shape} {harness.dtype_name(dtype)}")
        x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
        w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
        b = (0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
        dy = torch.randn_like(x)
        for name, op in impls.items():
            harness.measure_fwd_bwd(results, "layernorm", shape, dtype, name, lambda: op(x, w, b), dy,
                                    [x, w, b], 2 * m * d * s, 3 * m * d * s, copy_gbps, opts.quick)
        del x, w, b, dy
        torch.cuda.empty_cache()
    return results


def main() -> None:
    harness.run_alone("layernorm", __doc__, run)


if __name__ == "__main__":
    main()
