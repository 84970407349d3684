"""Serving-sized norms: RMSNorm and the fused residual add + RMSNorm at decode shapes, forward
only under torch.no_grad (no statistics written: our inference path), against torch,
torch.compile and Liger.

Shapes, bf16 by default (``--dtypes`` as the other benchmarks):

- the decoder's norms: rows (tokens in flight) 1, 8, 64, 512 at hidden 2048, 4096, 8192;
- QK-norm (Qwen3, Gemma3, OLMo2): rows = tokens x heads, 1 x 32 and 64 x 32, at head_dim 64,
  128 and 256.

Ops and bytes as ``bench_norms`` (rmsnorm: 2*M*D*s; add_rmsnorm: 4*M*D*s), forward alone.
Each cell, as every benchmark here: the eager call's time (at these sizes the host's pace) and
the GPU time of the same call replayed from a CUDA graph, side by side, with the copy
bandwidth of the run (``harness``). Run: ``python -m benchmarks.bench_decode --out DIR``
(``--quick``: two shapes). GPU only; a few minutes with the compiled peers.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

import torch

from benchmarks import bench_norms, harness

OP = "decode_norms"
HIDDEN_SHAPES = [(rows, d) for d in (2048, 4096, 8192) for rows in (1, 8, 64, 512)]
QK_SHAPES = [(tokens * 32, head_dim) for head_dim in (64, 128, 256) for tokens in (1, 64)]
SHAPES = HIDDEN_SHAPES + QK_SHAPES
QUICK_SHAPES = [(8, 4096), (32, 128)]
OPS = ("rmsnorm", "add_rmsnorm")


def cases(opts: argparse.Namespace) -> list[tuple[str, torch.dtype, tuple[int, int]]]:
    """(op, dtype, (rows, row length)) of a run; the QK-norm shapes take no residual."""
    keys = harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)
    return [(op, dtype, shape) for op in OPS for dtype, shape in keys
            if op == "rmsnorm" or shape in HIDDEN_SHAPES or shape in QUICK_SHAPES[:1]]


def implementations(opts: argparse.Namespace) -> dict:
    """bench_norms' implementations of these ops (ours, torch, torch.compile, Liger)."""
    return {name: {op: fns[op] for op in OPS if op in fns}
            for name, fns in bench_norms.implementations(opts).items()}


def build(key: tuple[str, torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """x (M, D), a weight away from 1 (and the residual), nothing requiring a gradient; the
    forward under torch.no_grad."""
    op, dtype, (m, d) = key
    x = torch.randn(m, d, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype)
    inputs = [x, w] if op == "rmsnorm" else [x, torch.randn_like(x), w]
    nbytes = (2 if op == "rmsnorm" else 4) * m * d * harness.element_size(dtype)

    def make(impl):
        def call():
            with torch.no_grad():
                return impl(*inputs)
        return call

    return harness.Case(f"{m}x{d}", dtype, [harness.Direction("fwd", nbytes, make)], op=op)


def main(argv: Optional[list[str]] = None) -> None:
    harness.run_alone(sys.modules[__name__], argv=sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
