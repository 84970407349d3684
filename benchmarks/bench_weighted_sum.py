"""Weighted sum y = (x * w).sum(-1), forward and backward (dx + dweight), against torch.

Peers: ``x @ w`` (cuBLAS gemv), ``(x * w).sum(-1)`` in eager torch, and torch.compile of
the latter. Bytes model: forward reads x (M*D*s); backward reads x and writes dx
(2*M*D*s); the D-sized weight and the M-sized y / dy are left out. w has x's dtype for
every implementation. Run: python -m benchmarks.bench_weighted_sum --out $OUT

``--sweep`` instead times only our kernels over a few launch settings of
``triton_layers.kernels._launch.WeightedSumLaunch`` (tile bytes, elements per thread, programs per SM)
and writes weighted_sum_sweep.csv: the data to choose the defaults there.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys

import torch

from benchmarks import harness
from triton_layers import functional as TF
from triton_layers.kernels import _launch

# The four target shapes, then few rows of the longest D (the column-split path).
SHAPES = [(262144, 1024), (65536, 4096), (16384, 16384), (2048, 131072), (32, 262144)]
QUICK_SHAPES = [(65536, 4096), (2048, 131072)]


def _mul_sum(x, w):
    return (x * w).sum(-1)


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, label: str) -> None:
    """Warn (do not stop) if our forward disagrees with a float32 matmul."""
    ref = x.float() @ w.float()
    err = ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if err > (1e-5 if x.dtype == torch.float32 else 1e-2):
        print(f"    WARNING {label}: relative error {err:.2e} against x.float() @ w.float()", file=sys.stderr)


# Fields of _launch.WeightedSumLaunch tried by --sweep, and their values.
SWEEP_KNOBS = ("tile_bytes", "elems_per_thread", "fwd_programs_per_sm", "bwd_programs_per_sm")
SWEEP = list(itertools.product([8192, 16384, 32768], [16, 32], [8], [4, 8, 16]))


def sweep(args, device: torch.device, copy: float) -> None:
    """Our kernels only, over the SWEEP launch settings; one table row per setting."""
    results: list = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for m, d in QUICK_SHAPES if args.quick else SHAPES:
            s = torch.finfo(dtype).bits // 8
            x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
            w = (torch.randn(d, device=device) / d**0.5 + 0.01).to(dtype).requires_grad_()
            dy = torch.randn(m, device=device, dtype=dtype)
            for setting in SWEEP:
                knobs = dataclasses.replace(_launch.DEFAULT.weighted_sum, **dict(zip(SWEEP_KNOBS, setting)))
                config = dataclasses.replace(_launch.DEFAULT, weighted_sum=knobs)
                label = f"{m}x{d} tile={setting[0]} ept={setting[1]} bwd/sm={setting[3]}"
                with _launch.use_config(config):
                    fwd = lambda: TF.weighted_sum(x, w)  # noqa: E731
                    harness.measure(results, "weighted_sum", label, dtype, "fwd", "triton_layers", fwd,
                                    m * d * s, copy, quick=True)
                    y = fwd()
                    harness.measure(results, "weighted_sum", label, dtype, "bwd", "triton_layers",
                                    lambda: y.backward(dy, retain_graph=True), 2 * m * d * s, copy,
                                    grad_to_none=[x, w], quick=True)
                    del y
            del x, w, dy
            torch.cuda.empty_cache()
    harness.print_table(results, ["triton_layers"], f"weighted_sum launch sweep on {torch.cuda.get_device_name()}",
                        copy)
    harness.write_csv(results, f"{args.out}/weighted_sum_sweep.csv")


def cases(opts: argparse.Namespace) -> list[tuple[torch.dtype, tuple[int, int]]]:
    """The (dtype, (rows, dim)) pairs a run measures, in order."""
    return harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and the peers, name -> f(x, w)."""
    impls = {
        "triton_layers": lambda x, w: TF.weighted_sum(x, w),
        "matmul": lambda x, w: x @ w,
        "mul-sum": _mul_sum,
    }
    if not opts.no_compile:
        impls["compile"] = harness.compiled(_mul_sum)
    return impls


def run(opts: argparse.Namespace, copy_gbps: float, progress: harness.Progress = harness.no_progress) -> list:
    """Time every implementation at every case; returns the Results."""
    device = harness.device()
    impls = implementations(opts)
    results: list = []
    for dtype, (m, d) in cases(opts):
        shape, s = f"{m}x{d}", torch.finfo(dtype).bits // 8
        progress(f"weighted_sum {shape} {harness.dtype_name(dtype)}")
        x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
        w = (torch.randn(d, device=device) / d**0.5 + 0.01).to(dtype).requires_grad_()
        dy = torch.randn(m, device=device, dtype=dtype)
        with torch.no_grad():
            _check(TF.weighted_sum(x, w), x, w, f"{shape} {dtype}")
        for name, op in impls.items():
            harness.measure_fwd_bwd(results, "weighted_sum", shape, dtype, name, lambda: op(x, w), dy,
                                    [x, w], m * d * s, 2 * m * d * s, copy_gbps, opts.quick)
        del x, w, dy
        torch.cuda.empty_cache()
    return results


def main() -> None:
    if "--sweep" not in sys.argv:
        harness.run_alone("weighted_sum", __doc__, run)
        return
    # --sweep is this script's own option: taken out of argv before the harness parses the rest.
    opts = harness.parse_args(__doc__, [a for a in sys.argv[1:] if a != "--sweep"])
    device = harness.require_cuda()
    sweep(opts, device, harness.copy_bandwidth_gbps(device))


if __name__ == "__main__":
    main()
