"""Where the norms' backward keeps rows whole, and with what warps and stages (a dev tool, GPU only).

Rows over the backward's row limit (``bwd_rms_max_fused_cols`` for RMSNorm, plain or with
the residual; ``bwd_max_fused_cols`` for LayerNorm) take two column-split kernels that read
z and dy twice. This times the backward of RMSNorm, the fused residual add + RMSNorm and
LayerNorm at 16,384 and 32,768 columns under the split path and with the row kept whole
at 1-2 prefetch stages and 16 or 32 warps (``bwd_stages`` / ``bwd_long_row_stages``,
``bwd_max_warps``), and prints what the whole-row kernel compiled to: warps, registers,
spills and shared memory (or the error when it does not fit). GPU times (CUDA-graph replay)
beside eager ones, ``--quick`` repetitions: enough to choose, not a benchmark.

H100, 2026-11-23, after the backward's reordering (parameter gradients before dz; main at
a15d6d8), % of copy by the GPU time, split / whole at 16 warps 1 stage (2 stages, 32 warps):
RMSNorm bf16 54 / 74 (68, 73), fp32 57 / 83 (77, 80); with the residual bf16 60 / 78 (72, 78),
fp32 63 / 84 (81, 85); LayerNorm bf16 52 / 44 (39, 48), fp32 56 / 53 (54, 50), spilling
66-76 registers a thread against RMSNorm's 18-34. At 32,768 kept whole (32 warps) every norm
spills over 100 and runs at 14-38%. Hence RMSNorm's limit 16,384 with one stage and 16 warps,
LayerNorm's 8,192. (Before the reordering, 2026-11-23 on an H100 and an H200: the whole-row
kernel at 16,384 spilled 32-76 registers and ran at 42-59%, no better than split.)

Run: python -m benchmarks.tune_norm_backward
"""
from __future__ import annotations

import torch

from benchmarks import harness
from benchmarks.tune_layernorm import norm_case
from benchmarks.tuning import config_with, direction, gpu_us
from triton_layers.kernels import layer_norm as norm_kernels

# (row length, row limit, stages, bwd_max_warps): the split path first, then the row
# kept whole at 1 and 2 prefetch stages (3 need more shared memory than a program gets), at 16
# and at 32 warps; 32,768 at 32 warps, 1 stage (at 16 the 2026-11-23 runs spilled 418-526).
CASES = [(16384, 8192, 3, 16)] + [(16384, 16384, stages, warps) for warps in (16, 32) for stages in (1, 2)] \
    + [(32768, 8192, 3, 16), (32768, 32768, 1, 32)]
ELEMENTS = 4096 * 16384  # every case moves the same bytes
# The norms whose backward these limits pick a kernel for (tune_layernorm.norm_case's names).
NORMS = ("rmsnorm", "add_rmsnorm", "layernorm")


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
    for name in NORMS:
        for dtype in (torch.bfloat16, torch.float32):
            for cols, limit, stages, warps in CASES:
                # every norm's row limit, and the stages of short and of long rows alike
                config = config_with("layer_norm", bwd_max_fused_cols=limit, bwd_residual_max_fused_cols=limit,
                                     bwd_rms_max_fused_cols=limit, bwd_stages=stages, bwd_long_row_stages=stages,
                                     bwd_max_warps=warps)
                case, ours = norm_case(name, dtype, (ELEMENTS // cols, cols), device)
                bwd = direction(case, "bwd", config)
                label = f"{name} {dtype} {case.shape} limit {limit} stages {stages} warps {warps}"
                try:
                    us = harness.time_us(bwd.make(ours), bwd.grad_to_none, quick=True)
                    gpu = gpu_us(bwd, ours)
                    print(f"{label}: GPU {gpu:.0f} us ({100 * bwd.nbytes / gpu / 1e3 / copy:.0f}% of copy), "
                          f"eager {us:.0f} us; {compiled_kernels(seen)}", flush=True)
                except Exception as exc:  # out of shared memory is a result here
                    print(f"{label}: failed, {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
                del case, bwd
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
