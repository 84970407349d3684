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
from benchmarks.sanitizing import DEVICE, around, fwd_bwd, rand
from triton_layers import functional as TF
from triton_layers import reference

OP = "coor_descent"
# What python -m benchmarks, its report, plots and benchmarks.dev.registers make of this part (benchmarks/parts.py):
# times only (not bytes-bound).
PART = {
    "order": 50,
    "ops": {"coor_descent": {
        "title": "coor_descent (n_iters 20, k = n/8 * 9/8, eps 0.03, eps_init 4, eps_decay 0.7, float32)",
        "note": "bound by its 20 dependent row reductions, not by bytes: times only",
        "measure": "time", "kernel_ops": ("coor_descent",)}},
    "cpu_shapes": [(3, 50)],
}
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


def _memory_table(opts: argparse.Namespace, results: list) -> str:
    impls = list(dict.fromkeys(r.impl for r in results))
    lines = [f"## coor_descent on {harness.device_name()}: peak memory (MiB)", "",
             "| shape | dir | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    index = {(r.shape, r.direction, r.impl): r.peak_mib for r in results}
    for shape, direction in dict.fromkeys((r.shape, r.direction) for r in results):
        cells = [index.get((shape, direction, impl), float("nan")) for impl in impls]
        lines.append(f"| {shape} | {direction} | " + " | ".join(f"{c:.1f}" if c == c else "" for c in cells) + " |")
    return harness.emit(lines)


def host_cases(r, dev) -> dict:
    """``benchmarks.bench_host``'s cases of this op: label -> (leaf inputs drawn by ``r(*shape)`` on ``dev``,
    ours, torch's), each a function of the leaves."""
    try:
        from colt5_attention.triton_coor_descent import triton_coor_descent
        peer = lambda s: triton_coor_descent(s, k=64, **SETTINGS)  # noqa: E731
    except ImportError:  # the torch definition stands in
        from triton_layers import reference
        peer = lambda s: reference.coor_descent(s, 20, 64.0, 0.03, 4.0, 0.7, None)  # noqa: E731
    return {"coor_descent 4x1024, 20 iters": ([r(4, 1024)], lambda s: TF.coor_descent(s, k=64.0, **SETTINGS), peer)}


def sanitize_cases(C) -> dict:
    """``scripts/sanitize.py``'s cases of this op (``benchmarks/sanitizing.py``) under the launch config ``C``:
    rows in registers up to max_fused_cols, chunked beyond; the backward splits rows into
    split_min_block..loop_block chunks; masks, k per row with a gradient."""
    out = {}
    for n in [1, 7, *around(C.coor_descent.max_fused_cols), 3 * C.coor_descent.loop_block + 5]:
        for rows, n_iters, masked, dtype in [(3, 3, True, torch.float32), (2, 1, False, torch.bfloat16)]:
            def cd(n=n, rows=rows, n_iters=n_iters, masked=masked, dtype=dtype):
                s, k = rand(rows, n, dtype=dtype, scale=1.5), torch.rand(rows, device=DEVICE) * n / 4 + 0.5
                mask = None
                if masked:
                    mask = torch.rand(rows, n, device=DEVICE) > 0.3
                    mask[0] = False  # a fully masked row
                kw = dict(n_iters=n_iters, eps=0.1, eps_init=1.0, eps_decay=0.7, mask=mask)
                return fwd_bwd(lambda s, k: TF.coor_descent(s, k=k, use_triton=True, **kw),
                               lambda s, k: reference.coor_descent(s, n_iters, k, 0.1, 1.0, 0.7, mask),
                               [s, k], [True, True])
            out[f"coor_descent n={n} rows={rows} iters={n_iters} {str(dtype)[6:]}{' mask' if masked else ''}"] = cd
    return {"coor_descent": out}


def kernel_inputs(shape: tuple[int, int], dtype: torch.dtype, t) -> list:
    """``benchmarks.dev.registers``' kernel forms of one case: (label, kernel op, its description
    inputs), leaves drawn by ``t(*shape, dtype=)`` (meta tensors)."""
    if dtype != torch.float32:
        return []  # (float32 only, as the benchmark)
    m, n = shape  # (s, mask, k tensor, k, n_iters, eps, eps_init, eps_decay)
    return [("coor_descent", "coor_descent", (t(m, n), None, None, n / 8 * 9 / 8, SETTINGS["n_iters"], SETTINGS["eps"],
                                              SETTINGS["eps_init"], SETTINGS["eps_decay"]))]


def cases(opts: argparse.Namespace) -> list[tuple[torch.dtype, tuple[int, int]]]:
    """The (float32, (rows, n)) cases a run measures, in order."""
    return [(torch.float32, shape) for shape in (QUICK_SHAPES if opts.quick else SHAPES)]


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and colt5-attention's, name -> f(s, k=..., n_iters=..., ...)."""
    return {"triton_layers": TF.coor_descent, **_peers(opts.no_compile)}


def build(key: tuple[torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """Scores s (M, N); the inference forward and forward+backward, with their peak memory;
    every implementation's forward is compared with a float64 run (printed on stderr)."""
    dtype, (m, n) = key
    kw = dict(k=n / 8 * 9 / 8, **SETTINGS)
    s = torch.randn(m, n, device=device, dtype=dtype)
    s_grad = s.clone().requires_grad_()
    dy = torch.randn_like(s)
    exact = TF.coor_descent(s.double(), **kw)
    shape = f"{m}x{n}"

    def check(impl: str, y: torch.Tensor) -> None:
        print(f"{shape} {impl}: max abs error vs float64 {(y.double() - exact).abs().max().item():.2e}",
              file=sys.stderr)

    return harness.Case(shape, dtype, [
        harness.Direction("fwd", 2 * m * n * 4, lambda op: (lambda: op(s, **kw)), memory=True),
        harness.Direction("fwd+bwd", 5 * m * n * 4, lambda op: (lambda: op(s_grad, **kw).backward(dy)),
                          grad_to_none=[s_grad], memory=True),
    ], check)


if __name__ == "__main__":
    harness.run_alone(sys.modules[__name__], _memory_table)
