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
import dataclasses
import sys

import torch

from benchmarks import harness, report
from benchmarks.sanitizing import DEVICE, around, fwd_bwd, rand
from triton_layers import functional as TF
from triton_layers import launch_config, reference

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


def sanitize_cases(C) -> dict:
    """``scripts/sanitize.py``'s cases of this op (``benchmarks/sanitizing.py``) under the launch config ``C``:
    rows in registers (several a tile) up to max_fused_cols, one program walking loop_block chunks
    beyond; causal (Nq <, =, > Nk) and padding masks; the forms only long rows take, at short ones."""
    out = {}
    bf = torch.bfloat16
    for n_k in [1, 17, *around(C.softmax.max_fused_cols), C.softmax.max_fused_cols + C.softmax.loop_block + 3]:
        for n_q, causal, masked, dtype in [(3, False, False, torch.float32), (5, True, True, torch.float16),
                                           (n_k + 2, True, False, bf)]:
            def sm(n_k=n_k, n_q=min(n_q, 40), causal=causal, masked=masked, dtype=dtype):
                x = rand(2, n_q, n_k, dtype=dtype, scale=3.0)
                mask = None
                if masked:
                    mask = torch.rand(2, n_k, device=DEVICE) < 0.3
                    mask[1] = True  # a batch entry that is all padding
                return fwd_bwd(lambda x: TF.softmax(x, causal, 0.7, mask, use_triton=True),
                               lambda x: reference.softmax(x, causal, 0.7, mask), [x], [True])
            out[f"softmax nk={n_k} nq={min(n_q, 40)} {str(dtype)[6:]}{' causal' if causal else ''}"
                f"{' padding' if masked else ''}"] = sm

    # Softmax forms that only long rows take, reached at small ones: C with these softmax
    # knobs and rows of up to 128 columns held whole.
    def softmax_under(knobs: dict, n_q: int, n_k: int, causal: bool, masked: bool, dtype: torch.dtype):
        config = dataclasses.replace(C, softmax=dataclasses.replace(
            C.softmax, max_fused_cols=max(C.softmax.max_fused_cols, 128), **knobs))

        def case():
            x = rand(2, n_q, n_k, dtype=dtype, scale=3.0)
            mask = torch.rand(2, n_k, device=DEVICE) < 0.3 if masked else None
            with launch_config.use_config(config):
                return fwd_bwd(lambda x: TF.softmax(x, causal, 0.7, mask, use_triton=True),
                               lambda x: reference.softmax(x, causal, 0.7, mask), [x], [True])
        return case

    # The causal forward by classes of rows (softmax_causal_classes) from 64 columns: the short
    # class alone (Nq > Nk), both, the long class alone (Nq < Nk/2).
    for n_k, n_q in [(40, 48), (64, 40), (100, 12)]:
        out[f"softmax causal by classes nk={n_k} nq={n_q} bfloat16 padding"] = softmax_under(
            dict(causal_class_min_cols=64), n_q, n_k, True, True, bf)
    # The backward reading y and dy twice (softmax_bwd_reload) from 64 columns: plain, causal
    # with padding.
    for n_k, causal in [(50, False), (100, True)]:
        out[f"softmax backward reloaded nk={n_k}{' causal padding' if causal else ''} float32"] = softmax_under(
            dict(bwd_reload_min_cols=64), 40, n_k, causal, causal, torch.float32)
    return {"softmax": out}


def kernel_inputs(shape: tuple[int, int], dtype: torch.dtype, t) -> list:
    """``benchmarks.dev.registers``' kernel forms of one case: (label, kernel op, its description
    inputs), leaves drawn by ``t(*shape, dtype=)`` (meta tensors)."""
    bh, n = shape  # (x, key_padding_mask, rows per head, keys, causal, scale)
    return [(f"softmax{' causal' if causal else ''}", "softmax", (t(bh * n, n, dtype=dtype), None, n, n, causal, 1.0))
            for causal in (False, True)]


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
