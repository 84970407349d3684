"""Whether the norms' backward could keep rows over 8,192 columns whole (a dev tool, GPU only).

Rows over ``bwd_max_fused_cols`` (``bwd_residual_max_fused_cols`` with a residual) take two
column-split kernels that read z and dy twice; Liger keeps such a row in registers. This
times the RMSNorm backward, plain and with the fused residual add, at 16,384 and 32,768
columns under the default limits and with the row kept whole at each number of prefetch
stages (``bwd_stages``) and at 16 and 32 warps (``bwd_max_warps``; the 2026-11-23 run below
had 16 only), and prints what the whole-row kernel compiled to: warps, registers,
spills and shared memory (or the error when it does not fit). GPU times (CUDA-graph replay)
beside eager ones, ``--quick`` repetitions: enough to see which choice is viable, not a
benchmark (the 2026-11-23 run below timed eager calls only).

H100, 2026-11-23 (main at b1b2286): at 16,384 columns and 16 warps the whole-row kernel
spills 50-76 registers a thread at 2-3 stages (206-248 at 1 stage in fp32), and its stages
need at most 16 KB (1 stage), 66-197 KB (2) and 131-393 KB (3) of shared memory: fp32 fits
at 1-2 stages only (the launcher now caps the stages to the device's shared memory, so those
cases run with fewer instead of failing). Its eager times were mixed: faster in bf16 (RMSNorm 310 against 461 us at
3 stages, with the residual 306 against 512 us at 2; partly host time, the split path
launches two kernels), level or slower in fp32. bench_norms --sweep-row-limits timed the GPU
time of RMSNorm's bf16 backward kept whole: 5% faster. At 32,768 columns the kernel spills
418-526 registers a thread and runs 4-10x slower. Keeping long rows whole needs a kernel
that spreads them over more warps (or holds them in shared memory), not a new limit.

Run: python -m benchmarks.tune_norm_backward
"""
from __future__ import annotations

import dataclasses

import torch

from benchmarks import harness
from triton_layers import functional as TF
from triton_layers.kernels import _launch
from triton_layers.kernels import layer_norm as norm_kernels

# (row length, bwd_max_fused_cols, bwd_stages, bwd_max_warps): the default first, then the row
# kept whole at each number of stages, at 16 and at 32 warps.
CASES = [(16384, 8192, 3, 16)] + [(cols, cols, stages, warps) for cols in (16384, 32768)
                                  for warps in (16, 32) for stages in (1, 2, 3)]
ELEMENTS = 4096 * 16384  # every case moves the same bytes


def compiled_kernels(seen: set) -> list[str]:
    """Warps, registers, spills and shared memory of the backward kernels compiled since the last call."""
    out = []
    for caches in getattr(norm_kernels._norm_bwd_kernel, "device_caches", {}).values():
        for kernel in caches[0].values():
            if id(kernel) not in seen:
                seen.add(id(kernel))
                md = kernel.metadata
                out.append(f"warps {md.num_warps}, regs {getattr(kernel, 'n_regs', '?')}, "
                           f"spills {getattr(kernel, 'n_spills', '?')}, smem {md.shared}")
    return out


def main() -> None:
    device = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(device)
    seen: set = set()
    for residual in (False, True):
        for dtype in (torch.bfloat16, torch.float32):
            for cols, limit, stages, warps in CASES:
                knobs = dataclasses.replace(_launch.DEFAULT.layer_norm, bwd_max_fused_cols=limit,
                                            bwd_residual_max_fused_cols=limit, bwd_stages=stages,
                                            bwd_max_warps=warps)
                config = dataclasses.replace(_launch.DEFAULT, layer_norm=knobs)
                x = torch.randn(ELEMENTS // cols, cols, device=device, dtype=dtype, requires_grad=True)
                r = torch.randn_like(x, requires_grad=True)
                w = torch.randn(cols, device=device, dtype=dtype, requires_grad=True)
                name = "add_rmsnorm" if residual else "rmsnorm"
                label = f"{name} {dtype} {x.shape[0]}x{cols} limit {limit} stages {stages} warps {warps}"
                try:
                    with _launch.use_config(config):
                        if residual:
                            outs, inputs, grads, nbytes = TF.rms_norm(x, w, 1e-6, residual=r), [x, r, w], \
                                (torch.randn_like(x), torch.randn_like(x)), 4
                        else:
                            outs, inputs, grads, nbytes = TF.rms_norm(x, w, 1e-6), [x, w], torch.randn_like(x), 3
                        call = lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True)  # noqa: E731
                        us = harness.time_us(call, quick=True)
                        gpu_us, _ = harness.gpu_time_us(lambda: call, quick=True)
                    pct = 100 * nbytes * x.numel() * x.element_size() / gpu_us / 1e3 / copy
                    print(f"{label}: GPU {gpu_us:.0f} us ({pct:.0f}% of copy), eager {us:.0f} us; "
                          f"{compiled_kernels(seen)}", flush=True)
                except Exception as exc:  # out of shared memory is a result here
                    print(f"{label}: failed, {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
                del x, r, w
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
