"""Weighted sum y = (x * w).sum(-1), forward and backward (dx + dweight), against torch.

Peers: ``x @ w`` (cuBLAS gemv), ``(x * w).sum(-1)`` in eager torch, and torch.compile of
the latter. Bytes model: forward reads x (M*D*s); backward reads x and writes dx
(2*M*D*s); the D-sized weight and the M-sized y / dy are left out. w has x's dtype for
every implementation. Run: python -m benchmarks.bench_weighted_sum --out $OUT
"""
from __future__ import annotations

import sys

import torch

from benchmarks import harness
from triton_layers import functional as TF

# The four target shapes, then few rows of the longest D (the column-split path).
SHAPES = [(262144, 1024), (65536, 4096), (16384, 16384), (2048, 131072), (32, 262144)]
QUICK_SHAPES = [(65536, 4096), (2048, 131072)]


def _mul_sum(x, w):
    return (x * w).sum(-1)


def _allow_recompiles(limit: int = 64) -> None:
    """dynamic=False compiles once per shape and dtype: more than dynamo's default of 8."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, label: str) -> None:
    """Warn (do not stop) if our forward disagrees with a float32 matmul."""
    ref = x.float() @ w.float()
    err = ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if err > (1e-5 if x.dtype == torch.float32 else 1e-2):
        print(f"    WARNING {label}: relative error {err:.2e} against x.float() @ w.float()", file=sys.stderr)


def main() -> None:
    args = harness.parse_args(__doc__)
    device = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(device)
    impls = {
        "triton_layers": lambda x, w: TF.weighted_sum(x, w),
        "matmul": lambda x, w: x @ w,
        "mul-sum": _mul_sum,
    }
    if not args.no_compile:
        _allow_recompiles()
        impls["compile"] = harness.compiled(_mul_sum)
    results: list = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for m, d in QUICK_SHAPES if args.quick else SHAPES:
            shape, s = f"{m}x{d}", torch.finfo(dtype).bits // 8
            x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
            w = (torch.randn(d, device=device) / d**0.5 + 0.01).to(dtype).requires_grad_()
            dy = torch.randn(m, device=device, dtype=dtype)
            with torch.no_grad():
                _check(TF.weighted_sum(x, w), x, w, f"{shape} {dtype}")
            for name, op in impls.items():
                fwd = harness.try_peer(lambda: (lambda: op(x, w)))
                harness.measure(results, "weighted_sum", shape, dtype, "fwd", name, fwd, m * d * s, copy,
                                quick=args.quick)
                if fwd is None:
                    harness.measure(results, "weighted_sum", shape, dtype, "bwd", name, None, 0, copy)
                    continue
                y = op(x, w)
                bwd = harness.try_peer(lambda: (lambda: y.backward(dy, retain_graph=True)))
                harness.measure(results, "weighted_sum", shape, dtype, "bwd", name, bwd, 2 * m * d * s, copy,
                                grad_to_none=[x, w], quick=args.quick)
                del y
            del x, w, dy
            torch.cuda.empty_cache()
    harness.print_table(results, list(impls), f"weighted_sum on {torch.cuda.get_device_name()}", copy)
    harness.write_csv(results, f"{args.out}/weighted_sum.csv")


if __name__ == "__main__":
    main()
