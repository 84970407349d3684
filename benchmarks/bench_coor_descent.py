"""coor_descent forward and forward+backward against colt5-attention (torch, torch.compile, Triton).

Settings of CoLT5's router: n_iters 20, k = n/8 * 9/8, eps 0.03, eps_init 4, eps_decay 0.7,
float32 (the --dtypes flag is not used: the op's reference numbers are fp32). "fwd" is the
inference forward (s needs no grad); "fwd+bwd" is forward then backward of a random dy
with s requiring grad. Peak memory is what the call allocates above what was allocated
before it. Bytes model (the op is bound by its 20 dependent row reductions, not by
bytes; the GB/s column is for reference only): fwd reads s and writes y (2*M*N*4),
fwd+bwd adds reading s and dy and writing ds (5*M*N*4).
Run: python -m benchmarks.bench_coor_descent [--quick] [--no-compile] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import harness
from triton_layers import functional as TF

SHAPES = [(8, 8192), (64, 4096), (16, 32768), (256, 1024)]
QUICK_SHAPES = [(8, 8192), (256, 1024)]
SETTINGS = dict(n_iters=20, eps=0.03, eps_init=4.0, eps_decay=0.7)


def _peers(no_compile: bool) -> dict:
    """colt5-attention's implementations that can be imported here (none if not installed)."""
    peers: dict = {}
    try:
        from colt5_attention.coor_descent import coor_descent as colt5_torch
    except Exception as exc:  # not installed, or a missing dependency of it
        print(f"colt5-attention not available ({type(exc).__name__}: {exc}); peers skipped", file=sys.stderr)
        return peers
    peers["colt5-torch"] = colt5_torch
    if not no_compile:
        peers["colt5-compile"] = harness.compiled(colt5_torch)
    try:
        from colt5_attention.triton_coor_descent import triton_coor_descent
    except Exception as exc:
        print(f"colt5-triton not available ({type(exc).__name__}: {exc})", file=sys.stderr)
    else:
        peers["colt5-triton"] = lambda s, **kw: triton_coor_descent(s, checkpoint_segments=4, **kw)
    return peers


def _memory_table(results: list, impls: list, title: str) -> str:
    lines = [f"## {title}: peak memory (MiB)", "", "| shape | dir | " + " | ".join(impls) + " |",
             "|---|---|" + "---|" * len(impls)]
    keys = []
    for r in results:
        if (r.shape, r.direction) not in keys:
            keys.append((r.shape, r.direction))
    for shape, direction in keys:
        cells = []
        for impl in impls:
            match = [r for r in results if (r.shape, r.direction, r.impl) == (shape, direction, impl)]
            ok = match and match[0].peak_mib == match[0].peak_mib
            cells.append(f"{match[0].peak_mib:.1f}" if ok else "")
        lines.append(f"| {shape} | {direction} | " + " | ".join(cells) + " |")
    return harness.emit(lines)


def cases(opts: argparse.Namespace) -> list[tuple[int, int]]:
    """The (rows, n) shapes a run measures, in order (float32 only)."""
    return QUICK_SHAPES if opts.quick else SHAPES


def run(opts: argparse.Namespace, copy_gbps: float, progress: harness.Progress = harness.no_progress) -> list:
    """Time and measure the peak memory of every implementation at every case; returns the Results."""
    device = harness.device()
    impls = {"triton_layers": TF.coor_descent, **_peers(opts.no_compile)}
    dtype = torch.float32
    results: list = []
    for m, n in cases(opts):
        shape = f"{m}x{n}"
        progress(f"coor_descent {shape}")
        kw = dict(k=n / 8 * 9 / 8, **SETTINGS)
        s = torch.randn(m, n, device=device, dtype=dtype)
        s_grad = s.clone().requires_grad_()
        dy = torch.randn_like(s)
        exact = TF.coor_descent(s.double(), **kw)
        for name, op in impls.items():
            fwd = harness.try_peer(lambda: (lambda: op(s, **kw)))
            if fwd is not None:
                err = (fwd().double() - exact).abs().max().item()
                print(f"{shape} {name}: max abs error vs float64 {err:.2e}", file=sys.stderr)
            res = harness.measure(results, "coor_descent", shape, dtype, "fwd", name, fwd, 2 * m * n * 4, copy_gbps,
                                  quick=opts.quick)
            if fwd is not None:
                res.peak_mib = harness.peak_memory_mib(fwd)
            both = harness.try_peer(lambda: (lambda: op(s_grad, **kw).backward(dy)))
            res = harness.measure(results, "coor_descent", shape, dtype, "fwd+bwd", name, both, 5 * m * n * 4,
                                  copy_gbps, grad_to_none=[s_grad], quick=opts.quick)
            if both is not None:
                s_grad.grad = None
                res.peak_mib = harness.peak_memory_mib(both)
        del s, s_grad, dy, exact
        torch.cuda.empty_cache()
    return results


def main() -> None:
    harness.run_alone("coor_descent", __doc__, run, lambda opts, results: _memory_table(
        results, list(dict.fromkeys(r.impl for r in results)), f"coor_descent on {torch.cuda.get_device_name()}"))


if __name__ == "__main__":
    main()
