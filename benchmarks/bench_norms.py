"""RMSNorm, and RMSNorm with the fused residual add, forward and backward, against torch,
torch.compile and Liger.

Two ops, one table each:

- ``rmsnorm``: y = rms_norm(x) * w. Bytes: forward reads x, writes y (2*M*D*s); backward
  reads x (h) and dy, writes dx (3*M*D*s).
- ``add_rmsnorm``: h = x + r, y = rms_norm(h) * w, returning (y, h), the residual stream
  of a pre-norm transformer. Bytes: forward reads x and r, writes y and h (4*M*D*s);
  backward reads dy, dh and h, writes dx, which is also the residual's gradient (4*M*D*s).
  Peers: torch eager and torch.compile of ``h = x + r; F.rms_norm(h)``, Liger's
  LigerFusedAddRMSNormFunction.

The D-sized weight is left out of the bytes. Run: python -m benchmarks.bench_norms
(--quick, --dtypes, --out, --no-compile as the other benchmarks; GPU only).
``--sweep-residual-limits`` adds our add_rmsnorm under the other choice of each of the
residual's row limits (kernels/_launch.py: fwd_residual_max_fused_cols 32768 instead of
16384, bwd_residual_max_fused_cols 4096 instead of 8192), so that one run decides them.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch
import torch.nn.functional as F

from benchmarks import harness
from triton_layers import functional as TF
from triton_layers.kernels import _launch

SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 131072)]
QUICK_SHAPES = [(16384, 4096), (4096, 16384)]
EPS = 1e-6
OPS = ("rmsnorm", "add_rmsnorm")


def _torch_add_rms_norm(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, EPS), h


def _liger():
    """Liger's two functions (positional arguments: eps, offset, casting mode, in place), or None."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    return {
        "rmsnorm": lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False),
        "add_rmsnorm": lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False),
    }


def cases(opts: argparse.Namespace) -> list[tuple[str, torch.dtype, tuple[int, int]]]:
    """The (op, dtype, (rows, row length)) triples a run measures, in order."""
    return [(op, dtype, shape) for op in OPS for dtype, shape in harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)]


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and the peers: op -> {name: f(x, w) or f(x, r, w)}."""
    impls = {
        "rmsnorm": {
            "triton_layers": lambda x, w: TF.rms_norm(x, w, EPS),
            "torch": lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS),
        },
        "add_rmsnorm": {
            "triton_layers": lambda x, r, w: TF.rms_norm(x, w, EPS, residual=r),
            "torch": _torch_add_rms_norm,
        },
    }
    if not opts.no_compile:
        impls["rmsnorm"]["compile"] = harness.compiled(lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS))
        impls["add_rmsnorm"]["compile"] = harness.compiled(_torch_add_rms_norm)
    liger = _liger()
    if liger is not None:
        for op in OPS:
            impls[op]["liger"] = liger[op]
    if getattr(opts, "sweep_residual_limits", False):
        for name in LIMIT_VARIANTS:
            impls["add_rmsnorm"][name] = impls["add_rmsnorm"]["triton_layers"]
    return impls


# impl name -> the residual's row limits it runs under (--sweep-residual-limits)
LIMIT_VARIANTS = {"triton_layers[res-fwd<=32768]": {"fwd_residual_max_fused_cols": 32768},
                  "triton_layers[res-bwd<=4096]": {"bwd_residual_max_fused_cols": 4096}}


def _config(impl: str):
    """The launch config of ``impl``: ours under other row limits, or the current one."""
    knobs = LIMIT_VARIANTS.get(impl)
    if knobs is None:
        return contextlib.nullcontext()
    default = _launch.DEFAULT
    return _launch.use_config(dataclasses.replace(default, layer_norm=dataclasses.replace(default.layer_norm, **knobs)))


def _measure_two_outputs(results, op, shape, dtype, impl, forward, grads, inputs, nbytes, copy_gbps, quick):
    """As harness.measure_fwd_bwd for an op returning (y, h): the backward takes both gradients."""
    with _config(impl):  # forward and backward (the launchers read the config when they run)
        fwd = harness.try_peer(lambda: forward)
        harness.measure(results, op, shape, dtype, "fwd", impl, fwd, nbytes, copy_gbps, quick=quick)
        if fwd is None:
            harness.measure(results, op, shape, dtype, "bwd", impl, None, 0, copy_gbps)
            return
        outputs = forward()
        bwd = harness.try_peer(lambda: (lambda: torch.autograd.backward(outputs, grads, retain_graph=True)))
        harness.measure(results, op, shape, dtype, "bwd", impl, bwd, nbytes, copy_gbps, grad_to_none=inputs,
                        quick=quick)


def run(opts: argparse.Namespace, copy_gbps: float, progress: harness.Progress = harness.no_progress) -> list:
    """Time every implementation at every case; returns the Results."""
    device = harness.device()
    impls = implementations(opts)
    results: list = []
    for op, dtype, (m, d) in cases(opts):
        shape, s = f"{m}x{d}", torch.finfo(dtype).bits // 8
        progress(f"{op} {shape} {harness.dtype_name(dtype)}")
        x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
        w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
        dy = torch.randn_like(x)
        if op == "rmsnorm":
            for name, fn in impls[op].items():
                harness.measure_fwd_bwd(results, op, shape, dtype, name, lambda: fn(x, w), dy, [x, w],
                                        2 * m * d * s, 3 * m * d * s, copy_gbps, opts.quick)
        else:
            r = torch.randn_like(x).requires_grad_()
            dh = torch.randn_like(x)
            for name, fn in impls[op].items():
                _measure_two_outputs(results, op, shape, dtype, name, lambda: fn(x, r, w), (dy, dh), [x, r, w],
                                     4 * m * d * s, copy_gbps, opts.quick)
            del r, dh
        del x, w, dy
        torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = harness.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--sweep-residual-limits", action="store_true",
                        help="also time our add_rmsnorm under the other residual row limits")
    opts = parser.parse_args()
    copy = harness.copy_bandwidth_gbps(harness.require_cuda())
    results = run(opts, copy)
    for op in OPS:
        rows = [r for r in results if r.op == op]
        impls = list(dict.fromkeys(r.impl for r in rows))
        harness.print_table(rows, impls, f"{op} on {torch.cuda.get_device_name()}", copy)
    harness.write_csv(results, f"{opts.out}/norms.csv")


if __name__ == "__main__":
    main()
