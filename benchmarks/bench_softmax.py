"""Softmax forward and backward, plain and causal, against torch, torch.compile, Liger.

Attention-shaped scores (B*H, N, N). Bytes model: forward reads x and writes y
(2*rows*N*s); backward reads y and dy and writes dx (3*rows*N*s); causal is counted as
full (the same model for every implementation), so a causal run that skips the masked
half shows more than 100% of the copy bandwidth. Peers: torch eager and torch.compile of
``softmax`` and of the causal ``masked_fill(triu) + softmax``; Liger (plain) if installed.
Run: python -m benchmarks.bench_softmax [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import harness, report
from triton_layers import functional as TF

OP = "softmax"
# What python -m benchmarks, its report, plots and benchmarks.dev.registers make of this part (benchmarks/parts.py).
PART = {
    "order": 30,
    "ops": {"softmax": {
        "title": "Softmax over (B*H, N, N) scores",
        "note": "bytes: fwd 2MNs, bwd 3MNs; causal counted as full, so a causal kernel that skips the masked half "
                "can pass 100%",
        "measure": "bandwidth", "kernel_ops": ("softmax",)}},
    "cpu_shapes": [(2, 33)],
}
# (B*H, N): B*H*N*N fixed at 2**28 up to N = 8192, as in the peers files.
SHAPES = [(256, 1024), (64, 2048), (16, 4096), (4, 8192), (1, 32768)]
QUICK_SHAPES = [(256, 1024), (16, 4096)]
OURS, OURS_CAUSAL = "triton_layers", "triton_layers-causal"


def _liger():
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except ImportError:
        return None
    return LigerSoftmaxFunction.apply


def _torch_causal(x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(hidden, float("-inf")).softmax(-1)


def _targets(opts: argparse.Namespace, results: list) -> str:
    """The issue's targets, one line per (shape, dtype, direction), from the GPU times."""
    by = {(r.shape, r.dtype, r.direction, r.impl): r for r in results}
    lines = [
        "## softmax targets (GPU time)",
        "",
        f"plain >= {report.TARGET_PCT:.0f}% of copy; causal/plain time <= {report.CAUSAL_RATIO['fwd']} (fwd) / "
        f"{report.CAUSAL_RATIO['bwd']} (bwd) at every N; "
        "compile-causal/causal time >= 1.5",
        "",
        "| shape | dtype | dir | plain % copy | causal/plain | compile-causal/causal |",
        "|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r.shape, r.dtype, r.direction) for r in results):
        plain, causal, peer = (by.get(key + (impl,)) for impl in (OURS, OURS_CAUSAL, "compile-causal"))
        cells = [
            f"{plain.pct_copy:.0f}%" if plain else "",
            f"{causal.gpu_us / plain.gpu_us:.2f}" if plain and causal else "",
            f"{peer.gpu_us / causal.gpu_us:.2f}" if peer and causal and peer.gpu_us == peer.gpu_us else "",
        ]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return harness.emit(lines)


def host_cases(r, dev) -> dict:
    """``benchmarks.bench_host``'s cases of this op: label -> (leaf inputs drawn by ``r(*shape)`` on ``dev``,
    ours, torch's), each a function of the leaves."""
    sm = [r(2, 4, 64, 64)]
    hidden = torch.ones(64, 64, dtype=torch.bool, device=dev).triu(1)
    return {
        "softmax 2x4x64x64": (sm, lambda x: TF.softmax(x), lambda x: torch.softmax(x, -1)),
        "causal softmax 2x4x64x64, scale": (sm, lambda x: TF.softmax(x, causal=True, scale=0.125),
                                            lambda x: _torch_causal(x * 0.125, hidden)),
    }


def cases(opts: argparse.Namespace) -> list[tuple[torch.dtype, tuple[int, int]]]:
    """The (dtype, (B*H, N)) pairs a run measures, in order."""
    return harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)


def implementations(opts: argparse.Namespace) -> dict:
    """Ours (plain and causal) and the peers, name -> f(x, hidden) with hidden = the causal mask."""
    impls = {
        OURS: lambda x, hidden: TF.softmax(x),
        OURS_CAUSAL: lambda x, hidden: TF.softmax(x, causal=True),
        "torch": lambda x, hidden: torch.softmax(x, -1),
    }
    if not opts.no_compile:
        impls["compile"] = harness.compiled(lambda x, hidden: torch.softmax(x, -1))
    impls["torch-causal"] = _torch_causal
    if not opts.no_compile:
        impls["compile-causal"] = harness.compiled(_torch_causal)
    liger = _liger()
    if liger is not None:
        impls["liger"] = lambda x, hidden: liger(x)
    return impls


def build(key: tuple[torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """Scores x (B*H, N, N), dy and the causal mask (True above the diagonal); forward and backward."""
    dtype, (bh, n) = key
    x = torch.randn(bh, n, n, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn_like(x)
    hidden = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
    nbytes = bh * n * n * harness.element_size(dtype)
    return harness.Case(f"{bh}x{n}x{n}", dtype, harness.fwd_bwd(lambda op: op(x, hidden), dy, [x],
                                                                2 * nbytes, 3 * nbytes))


if __name__ == "__main__":
    harness.run_alone(sys.modules[__name__], _targets)
