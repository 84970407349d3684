"""How fast can anything move the FP8 norms' bytes on this GPU? A ladder of stand-in kernels (a dev tool).

The per-token FP8 RMSNorm reads x (bf16) and writes a byte an element: its bytes are two parts
read to one written, where the copy the benchmarks compare with (``harness.copy_bandwidth_gbps``)
is one to one. Issue 47 asks for 90% of the copy; the H200 gives the plain FP8 recipes 76-80%
and the fused add (more bytes, nearer one to one) 92%. This tool separates the byte mix from the
work, timing at bench_fp8's training shapes (bf16, CUDA-graph replay, the best launch of a small
sweep, % of the copy of this run):

- ``torch_cast``: torch's own elementwise cast, ``q.copy_(x)`` into an e4m3 tensor;
- ``flat_cast``: a Triton kernel that only scales and casts, flat blocks of BLOCK elements;
- ``rows_cast``: the same over whole rows, BLOCK_M rows a program (the FP8 norms' tiles);
- ``rows_static``: + the row's sum of squares and the weight (the static-scale norm);
- ``rows_per_token``: + the row's amax, its scale stored, the data divided by it (per token);
- ``rows_per_token_exact``: the same with our kernel's numerics (its helpers: the correctly
  rounded divisions, the NaN-keeping amax, the scale's floor, the saturating cast);
- ``ours_static``, ``ours_per_token``: ``rms_norm_fp8`` itself, as bench_fp8 times it, at the
  default launch and at the FP8 tiles of the ladder's (``fp8_tile_elements``, elements a thread).

If ``flat_cast`` stops where ours does, the byte mix is the ceiling on this GPU; if the rungs
climb, the rung that costs is the work to look at. Results: the journal of the run.

Run: python -m benchmarks.dev.fp8_ceiling [--shapes 16384x4096,4096x8192]
"""
from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from benchmarks import harness
from benchmarks.dev import tuning
from triton_layers import FP8Recipe, launch_config
from triton_layers import functional as TF
from triton_layers.kernels._norm_helpers import div
from triton_layers.kernels.norm_fp8 import _amax, _quantize, _scale_of

FP8_MAX = 448.0


@triton.jit
def _flat_cast_kernel(X, Q, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(Q + offs, (x * 0.5).to(tl.float8e4nv), mask=offs < n)


@triton.jit
def _rows_kernel(X, W, Q, S, M, N, eps, STAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """STAGE 0: scale and cast; 1: + the RMS norm with a weight (static scale); 2: + per-row amax
    and scale; 3: 2 with our kernel's numerics (kernels/norm_fp8.py's helpers)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if STAGE == 0:
        y = x * 0.5
    elif STAGE == 3:
        rstd = 1.0 / tl.sqrt(div(tl.sum(x * x, axis=1), N) + eps)
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        s = _scale_of(_amax(y, 1, False), 0.0, 448.0, False, False)
        tl.store(S + rows, s, mask=rows < M)
        inv = tl.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), s)[:, None]
        tl.store(Q + offs, _quantize(y, inv, 448.0, False, False), mask=mask)
    else:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        if STAGE == 2:
            s = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-12) / 448.0
            tl.store(S + rows, s, mask=rows < M)
            y = y * (1.0 / s)[:, None]
        else:
            y = y * 0.5
    if STAGE != 3:
        tl.store(Q + offs, y.to(tl.float8e4nv), mask=mask)


def _under(config, call):
    """``call`` run under the launch ``config`` (its plan made there, at the first call)."""
    def run():
        with launch_config.use_config(config):
            return call()
    return run


def _best(label, makes, nbytes, copy):
    """The fastest of ``makes`` (launch label -> make) by GPU time (``harness.gpu_time_us``: a
    CUDA-graph replay, or the profiler's kernel time, marked *, where the call cannot be captured:
    under another launch config ours plans again on its first call, and the static scale's check
    syncs there), printed as a line; returns its us."""
    times = {}
    for knob, make in makes.items():
        try:
            make()()  # (a first call outside the timing: ours checks a static scale's value once, a sync)
            us, method = harness.gpu_time_us(make)
        except Exception as exc:  # (a launch too large for the SM's registers, say)
            print(f"    {label} {knob}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        if us == us:  # (nan: neither timing worked; gpu_time_us said why)
            times[knob + ("" if method == "graph" else "*")] = us
    if not times:
        return float("nan")
    knob, us = min(times.items(), key=lambda kv: kv[1])
    gbps = nbytes / us / 1e3
    spread = ", ".join(f"{k} {t:.1f}" for k, t in sorted(times.items(), key=lambda kv: kv[1])[:4])
    print(f"  {label:16s} {us:7.1f} us {gbps:6.0f} GB/s {100 * gbps / copy:5.1f}% of copy   best: {spread}", flush=True)
    return us


def main(argv=None) -> None:
    opts, shapes, _ = tuning.parse(__doc__.splitlines()[0], [(16384, 4096), (4096, 8192)], argv)
    dev, copy = tuning.start()
    for m, n in shapes:
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        w = (1 + 0.1 * torch.randn(n, device=dev)).to(torch.bfloat16)
        q = torch.empty(m, n, device=dev, dtype=torch.float8_e4m3fn)
        s = torch.empty(m, device=dev, dtype=torch.float32)
        scale = torch.tensor([0.05], device=dev)
        mix = 3 * m * n  # bf16 read, a byte written
        print(f"{m}x{n} bf16 -> e4m3: {mix / 1e6:.0f} MB (+ {4 * m} B of scales per token)", flush=True)
        _best("torch_cast", {"copy_": lambda: (lambda: q.copy_(x))}, mix, copy)
        flat = {}
        for block, warps in itertools.product([1024, 2048, 4096, 8192], [4, 8]):
            flat[f"B{block}w{warps}"] = (lambda b=block, nw=warps: lambda: _flat_cast_kernel[
                (triton.cdiv(m * n, b),)](x, q, m * n, BLOCK=b, num_warps=nw))
        _best("flat_cast", flat, mix, copy)
        block_n = triton.next_power_of_2(n)
        for stage, label in enumerate(["rows_cast", "rows_static", "rows_per_token", "rows_per_token_exact"]):
            makes = {}
            for block_m, warps in itertools.product([1, 2, 4], [2, 4, 8, 16]):
                if block_m * block_n // (32 * warps) > 128:  # (over 128 elements a thread: spills)
                    continue
                makes[f"M{block_m}w{warps}"] = (lambda bm=block_m, nw=warps, st=stage: lambda: _rows_kernel[
                    (triton.cdiv(m, bm),)](x, w, q, s, m, n, 1e-6, STAGE=st, BLOCK_M=bm, BLOCK_N=block_n,
                                           num_warps=nw))
            _best(label, makes, mix + (4 * m if stage >= 2 else 0), copy)
        for label, kwargs, nbytes in [("ours_static", dict(recipe=FP8Recipe("per_tensor"), scale=scale), mix),
                                      ("ours_per_token", {}, mix + 4 * m)]:
            makes = {"default": lambda kw=kwargs: (lambda: TF.rms_norm_fp8(x, w, **kw))}
            for tile, per_thread in itertools.product([4096, 8192, 16384], [32, 64, 128]):
                config = launch_config.DEFAULT.with_knobs("layer_norm", fp8_tile_elements=tile,
                                                          fp8_elems_per_thread=per_thread)
                makes[f"T{tile}e{per_thread}"] = (lambda kw=kwargs, c=config: _under(c, lambda: TF.rms_norm_fp8(
                    x, w, **kw)))
            _best(label, makes, nbytes, copy)
        del x, q
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
