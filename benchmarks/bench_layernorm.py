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
from benchmarks.sanitizing import DEVICE, around, fwd_bwd, rand
from triton_layers import functional as TF
from triton_layers import reference

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


def sanitize_cases(C) -> dict:
    """``scripts/sanitize.py``'s cases of this op (``benchmarks/sanitizing.py``) under the launch config ``C``:
    backward rows in registers up to bwd_max_fused_cols, chunked beyond (two kernels, several row groups);
    forward rows in registers up to fwd_max_fused_cols, chunked beyond; several rows a tile and tiles a
    program; partial gradients."""
    out = {}
    bf = torch.bfloat16
    for n in [1, 7, 33, *around(C.layer_norm.bwd_max_fused_cols), *around(C.layer_norm.fwd_max_fused_cols),
              2 * C.layer_norm.loop_block + 5]:
        # (67 rows: several row groups and tiles per program; 23 still are with the tiny limits,
        # at a third of the interpreter's time)
        many = 67 if DEVICE == "cuda" else 23
        for rows, dtype, stable, sliced in [(3, torch.float32, False, False), (many, bf, True, True)]:
            def ln(n=n, rows=rows, dtype=dtype, stable=stable, sliced=sliced):
                x = rand(rows, n, dtype=dtype, sliced=sliced, scale=2.0)
                w, b = 1 + 0.5 * rand(n), 0.5 * rand(n)
                return fwd_bwd(lambda x, w, b: TF.layer_norm(x, w, b, stable=stable, use_triton=True),
                               lambda x, w, b: reference.layer_norm(x, w, b, 1e-5, stable),
                               [x, w, b], [True, True, True])
            flags = (" stable" if stable else "") + (" sliced" if sliced else "")
            out[f"layer_norm n={n} rows={rows} {str(dtype)[6:]}{flags}"] = ln
        for needs in ([True, False, False], [False, True, True]):
            def ln_partial(n=n, needs=needs):
                x, w, b = rand(5, n), rand(n), rand(n)
                return fwd_bwd(lambda x, w, b: TF.layer_norm(x, w, b, use_triton=True),
                               lambda x, w, b: reference.layer_norm(x, w, b, 1e-5, False), [x, w, b], needs)
            out[f"layer_norm n={n} grads={''.join('xwb'[i] for i in range(3) if needs[i])}"] = ln_partial
    return {"norm": out}


def kernel_inputs(shape: tuple[int, int], dtype: torch.dtype, t) -> list:
    """``benchmarks.dev.registers``' kernel forms of one case: (label, kernel op, its description
    inputs), leaves drawn by ``t(*shape, dtype=)`` (meta tensors)."""
    m, d = shape
    # (x, weight, bias, eps, rms, stable, unit_offset, cast_before_weight, out_dtype)
    return [("layernorm", "norm", (t(m, d, dtype=dtype), t(d, dtype=dtype), t(d, dtype=dtype), 1e-5, False,
                                   False, False, False, dtype))]


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
