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

Whole rows' knobs (``--whole-rows``: the weight loaded per tile or held, warps, programs an
SM, at 4096x16384 and 8192x8192; GPU time, 2026-11-25, main at 4f9d28f plus the knobs).
Held for the whole program, the weight took 32 registers a thread at 16,384 columns, and
RMSNorm's kernel spilled 72-148 bytes (offline sm_90 build, Triton 3.6); loaded per tile
(from L1 or L2), 0-8 in bf16, 24-48 in fp32. RMSNorm 4096x16384, held -> per tile: H100 bf16
180 -> 164 us (75% -> 82% of copy), fp32 323 -> 304, the fused add bf16 226 -> 207, fp32 428 ->
391; H200 144 -> 127 (66% -> 75%), fp32 242 -> 244 (level), the fused add 179 -> 158, fp32
312 -> 288. Hence ``bwd_long_row_weight_per_tile``. At 8,192 columns (nothing spills) per tile and held were
level. One program an SM against two (a 512-thread program of over 64 registers leaves no
room for a second: the second ran as a second wave), 8192x8192: LayerNorm bf16 H100 158 us
against 164, H200 120 against 129; the fused add LayerNorm 202 against 210, 149 against 155;
the rest 1-3% faster. Hence ``bwd_long_row_programs_per_sm`` = 1. 8 warps against 16: level.
Tried and dropped the same day: reading z and dy a second time for dz (evict_last, then
evict_first, as the softmax backward at 32,768 does) instead of holding zhat and g across the
row sums. Registers fell (RMSNorm bf16 at 16,384: 104 a thread, no spill), yet the kernel
was 1.2-1.3x slower at 1 stage (H100 bf16 215 us against 180, H200 190 against 144) and no
faster than the weight per tile at 2 (169 / 149 us), where its second read doubled the
prefetch buffers: fp32 at 2 stages did not fit in shared memory. (A standalone RMSNorm
kernel of that form, written for the trial, reached 88% on the H100 at 16 warps and 2 stages
but 74% on the H200.)

Run: python -m benchmarks.dev.tune_norm_backward [--whole-rows]
"""
from __future__ import annotations

import sys

import torch

from benchmarks import harness
from benchmarks.dev import tuning
from benchmarks.dev.tune_layernorm import norm_case
from benchmarks.dev.tuning import config_with, direction, gpu_us
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


# --whole-rows: the whole-row kernel's knobs, where they matter (rows of 16,384 take
# bwd_long_row_*; tiles of 8,192 elements and more, bwd_long_row_programs_per_sm).
WHOLE_ROW_GRID = {"bwd_long_row_weight_per_tile": [True, False], "bwd_max_warps": [8, 16],
                  "bwd_long_row_programs_per_sm": [1, 2]}
WHOLE_ROW_CASES = [(norm, (4096, 16384)) for norm in ("rmsnorm", "add_rmsnorm")] + \
    [(norm, (8192, 8192)) for norm in ("rmsnorm", "add_rmsnorm", "layernorm", "add_layernorm")]


def whole_rows() -> None:
    """Every combination of WHOLE_ROW_GRID at WHOLE_ROW_CASES, bf16 and fp32, fastest first."""
    device, copy = tuning.start()
    defaults = tuple(getattr(config_with("layer_norm").layer_norm, k) for k in WHOLE_ROW_GRID)
    for name, shape in WHOLE_ROW_CASES:
        for dtype in (torch.bfloat16, torch.float32):
            case, ours = norm_case(name, dtype, shape, device)
            nbytes = next(d.nbytes for d in case.directions if d.name == "bwd")
            print(f"{name} {shape[0]}x{shape[1]} {str(dtype)[6:]}", flush=True)
            results = tuning.sweep(case, "bwd", ours, "layer_norm", WHOLE_ROW_GRID)
            print(tuning.report("bwd", WHOLE_ROW_GRID, defaults, results, nbytes, copy), flush=True)
            del case
            torch.cuda.empty_cache()


def main() -> None:
    if "--whole-rows" in sys.argv[1:]:
        return whole_rows()
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
