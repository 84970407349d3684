"""Serving-sized norms: RMSNorm and the fused residual add + RMSNorm at decode shapes, forward
only under torch.no_grad (no statistics written: our inference path), against torch,
torch.compile and Liger.

Shapes, bf16 by default (``--dtypes`` as the other benchmarks):

- the decoder's norms: rows (tokens in flight) 1, 8, 64, 512 at hidden 2048, 4096, 8192;
- QK-norm (Qwen3, Gemma3, OLMo2): rows = tokens x heads, 1 x 32 and 64 x 32, at head_dim 64,
  128 and 256, and 4608 x 48 at 128 (a prefill), contiguous;
- ``qk_rmsnorm_strided``: the same norm of the q slice of a fused qkv projection, a
  ``(tokens, heads, head_dim)`` view with row stride ``(heads + 2 * kv_heads) * head_dim``
  (kv_heads = heads / 6, at least 1): 1 x 32, 64 x 32 and 4608 x 48 at 128. Each
  implementation gets the view as a model hands it (ours reads it in place; a peer that needs
  rows copies it, or fails: an empty cell). Bytes 2*T*H*D*s, as the contiguous rows.

Ops and bytes as ``bench_norms`` (rmsnorm: 2*M*D*s; add_rmsnorm: 4*M*D*s), forward alone;
``layernorm`` (weight and bias away from 1 and 0, bytes 2*M*D*s) at the decoder's shapes, with
``bench_layernorm``'s implementations (ours, torch, torch.compile, Liger).

``chain``: the norms between other kernels, as a decoder runs them: ``y = rmsnorm(h)``, then
``CHAIN_LAYERS`` times ``y, h = add_rmsnorm(y @ W, h)`` (W: D x D), all in one CUDA graph; rows
1, 8, 64 at hidden 2048 and 4096. Programmatic dependent launch can only show here (a norm's
launch overlapping the kernel before it), so ours runs twice: ``triton_layers`` (PDL on, the
default on Hopper) and ``triton_layers_no_pdl`` (``LaunchConfig.pdl`` False; the
config switches around each call, which empties the plan caches: compare its GPU time, not its
eager time). ``matmul_only`` runs the matmuls alone; after the tables, the GPU time a norm
call adds to the chain, ``(chain - matmul_only) / (CHAIN_LAYERS + 1)``, per implementation.
``compile`` compiles the whole chain. Bytes: the norms' and the weight's reads, a nominal
figure (the table's % of copy means little here; the times do). ``norm_chain``: the same
without the matmuls, ``y = rmsnorm(h)`` then ``CHAIN_LAYERS`` fused adds each on the one
before's outputs: every kernel's producer is a norm kernel, where PDL has both ends.
Each cell, as every benchmark here: the eager call's time (at these sizes the host's pace) and
the GPU time of the same call replayed from a CUDA graph, side by side, with the copy
bandwidth of the run (``harness``). Run: ``python -m benchmarks.bench_decode --out DIR``
(``--quick``: two shapes). GPU only; a few minutes with the compiled peers.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable, Optional

import torch

from benchmarks import bench_layernorm, bench_norms, harness
from triton_layers import launch_config

OP = "decode_norms"
HIDDEN_SHAPES = [(rows, d) for d in (2048, 4096, 8192) for rows in (1, 8, 64, 512)]
QK_SHAPES = [(tokens * 32, head_dim) for head_dim in (64, 128, 256) for tokens in (1, 64)] + [(4608 * 48, 128)]
QK_STRIDED = "qk_rmsnorm_strided"
QK_STRIDED_SHAPES = [(1, 32, 128), (64, 32, 128), (4608, 48, 128)]  # (tokens, heads, head_dim)
QUICK_QK_STRIDED_SHAPES = [(64, 32, 128)]
SHAPES = HIDDEN_SHAPES + QK_SHAPES
QUICK_SHAPES = [(8, 4096), (32, 128)]
OPS = ("rmsnorm", "add_rmsnorm")  # (the chains' two norms)
LAYERNORM = "layernorm"
CHAIN, NORM_CHAIN = "chain", "norm_chain"
CHAIN_LAYERS = 8
CHAIN_SHAPES = [(rows, d) for d in (2048, 4096) for rows in (1, 8, 64)]
QUICK_CHAIN_SHAPES = [(8, 4096)]
OURS = bench_norms.OURS
NO_PDL = dataclasses.replace(launch_config.DEFAULT, pdl=False)


def cases(opts: argparse.Namespace) -> list[tuple[str, torch.dtype, tuple[int, int]]]:
    """(op, dtype, (rows, row length)) of a run; the QK-norm shapes take no residual, and only
    RMSNorm runs them."""
    keys = harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)
    hidden = [(dtype, shape) for dtype, shape in keys if shape in HIDDEN_SHAPES or shape in QUICK_SHAPES[:1]]
    chain = harness.dtype_shape_cases(opts, CHAIN_SHAPES, QUICK_CHAIN_SHAPES)
    return ([("rmsnorm", dtype, shape) for dtype, shape in keys]
            + [(op, dtype, shape) for op in ("add_rmsnorm", LAYERNORM) for dtype, shape in hidden]
            + [(op, dtype, shape) for op in (CHAIN, NORM_CHAIN) for dtype, shape in chain]
            + [(QK_STRIDED, dtype, shape)
               for dtype, shape in harness.dtype_shape_cases(opts, QK_STRIDED_SHAPES, QUICK_QK_STRIDED_SHAPES)])


def _chain(rmsnorm: Callable, add_rmsnorm: Callable) -> Callable:
    """The chain (the top) from one implementation's two norms: f(h, w, weight) -> (y, h)."""
    def f(h, w, weight):
        y = rmsnorm(h, w)
        for _ in range(CHAIN_LAYERS):
            y, h = add_rmsnorm(y @ weight, h, w)
        return y, h
    return f


def _norm_chain(rmsnorm: Callable, add_rmsnorm: Callable) -> Callable:
    """The norms alone (the top): f(h, w) -> (y, h)."""
    def f(h, w):
        y = rmsnorm(h, w)
        for _ in range(CHAIN_LAYERS):
            y, h = add_rmsnorm(y, h, w)
        return y, h
    return f


def _matmul_only(h, w, weight):
    """The chain's matmuls alone (its norms left out)."""
    y = h
    for _ in range(CHAIN_LAYERS):
        y = y @ weight
    return y, h


def _no_pdl(fn: Callable) -> Callable:
    """``fn`` launched with programmatic dependent launch off (the ``pdl`` knob)."""
    def f(*args):
        with launch_config.use_config(NO_PDL):
            return fn(*args)
    return f


def implementations(opts: argparse.Namespace) -> dict:
    """bench_norms' implementations of the single ops (ours, torch, torch.compile, Liger) and
    bench_layernorm's of LayerNorm; the chain from each one's pair of norms, compile's compiled
    whole, ours also without PDL, and the matmuls alone."""
    impls = {name: {op: fns[op] for op in OPS if op in fns}
             for name, fns in bench_norms.implementations(opts).items()}
    for name, fn in bench_layernorm.implementations(opts).items():
        impls.setdefault(name, {})[LAYERNORM] = fn
    chains = {CHAIN: _chain, NORM_CHAIN: _norm_chain}
    for name, fns in impls.items():
        if name != "compile" and all(op in fns for op in OPS):
            fns.update({op: chain(fns["rmsnorm"], fns["add_rmsnorm"]) for op, chain in chains.items()})
    if "compile" in impls:
        impls["compile"].update({op: harness.compiled(chain(*(bench_norms.TORCH[o] for o in OPS)))
                                 for op, chain in chains.items()})
    impls[OURS + "_no_pdl"] = {op: _no_pdl(impls[OURS][op]) for op in chains}
    for fns in impls.values():  # (the strided q slice through each one's RMSNorm as it is)
        if "rmsnorm" in fns:
            fns[QK_STRIDED] = fns["rmsnorm"]
    impls["matmul_only"] = {CHAIN: _matmul_only}
    return impls


def build(key: tuple[str, torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """x (M, D), a weight away from 1 (and the residual; for the chain, W scaled to keep the
    activations' size), nothing requiring a gradient; the forward under torch.no_grad."""
    op, dtype, shape = key
    s = harness.element_size(dtype)
    if op == QK_STRIDED:
        return _qk_strided_case(dtype, shape, device)
    m, d = shape
    x = torch.randn(m, d, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype)
    if op == CHAIN:
        inputs = [x, w, (torch.randn(d, d, device=device) / d ** 0.5).to(dtype)]
        nbytes = CHAIN_LAYERS * d * d * s + (2 + 4 * CHAIN_LAYERS) * m * d * s
    elif op == NORM_CHAIN:
        inputs = [x, w]
        nbytes = (2 + 4 * CHAIN_LAYERS) * m * d * s
    elif op == LAYERNORM:
        inputs = [x, w, (0.1 * torch.randn(d, device=device)).to(dtype)]
        nbytes = 2 * m * d * s
    else:
        inputs = [x, w] if op == "rmsnorm" else [x, torch.randn_like(x), w]
        nbytes = (2 if op == "rmsnorm" else 4) * m * d * s

    def make(impl):
        def call():
            with torch.no_grad():
                return impl(*inputs)
        return call

    return harness.Case(f"{m}x{d}", dtype, [harness.Direction("fwd", nbytes, make)], op=op)


def _qk_strided_case(dtype: torch.dtype, shape: tuple[int, int, int], device: torch.device) -> harness.Case:
    """QK_STRIDED's case: the q view of a fused qkv output (the top) and a weight away from 1."""
    tokens, heads, head_dim = shape
    kv_heads = max(1, heads // 6)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device, dtype=dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    w = (1 + 0.1 * torch.randn(head_dim, device=device)).to(dtype)

    def make(impl):
        def call():
            with torch.no_grad():
                return impl(q, w)
        return call

    nbytes = 2 * tokens * heads * head_dim * harness.element_size(dtype)
    return harness.Case(f"{tokens}x{heads}x{head_dim} strided", dtype, [harness.Direction("fwd", nbytes, make)],
                        op=QK_STRIDED)


def norm_in_chain_us(results: list) -> dict:
    """{(dtype, shape, impl): GPU us a norm call adds to the chain}: (chain - matmul_only) /
    (CHAIN_LAYERS + 1), by GPU time (CUDA-graph replay), for each implementation of a chain
    case that also has its matmul_only row; and ``impl (norms alone)``: norm_chain / (CHAIN_LAYERS + 1)."""
    rows = [r for r in results if r.op == CHAIN]
    base = {(r.dtype, r.shape): r.gpu_us for r in rows if r.impl == "matmul_only"}
    out = {(r.dtype, r.shape, r.impl): (r.gpu_us - base[(r.dtype, r.shape)]) / (CHAIN_LAYERS + 1)
           for r in rows if r.impl != "matmul_only" and (r.dtype, r.shape) in base}
    return out | {(r.dtype, r.shape, r.impl + " (norms alone)"): r.gpu_us / (CHAIN_LAYERS + 1)
                  for r in results if r.op == NORM_CHAIN}


def _print_norm_in_chain(opts: argparse.Namespace, results: list) -> None:
    per_call = norm_in_chain_us(results)
    if per_call:
        print(f"\nGPU us a norm call adds to the chain ((chain - matmul_only) / {CHAIN_LAYERS + 1}):")
        for (dtype, shape, impl), us in per_call.items():
            print(f"  {harness.dtype_name(dtype)} {shape} {impl}: {us:.2f}")


def main(argv: Optional[list[str]] = None) -> None:
    harness.run_alone(sys.modules[__name__], _print_norm_in_chain, argv=sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
