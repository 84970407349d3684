"""Where the norms' backward keeps rows whole, and with what warps and stages (a dev tool, GPU only).

Rows over the backward's row limit (``bwd_rms_max_fused_cols`` for RMSNorm, plain or with
the residual; ``bwd_max_fused_cols`` for LayerNorm) take two column-split kernels that read
z and dy twice. This times the backward of RMSNorm, the fused residual add + RMSNorm and
LayerNorm at 16,384 and 32,768 columns under the split path and with the row kept whole
at 1-2 prefetch stages and 16 or 32 warps (``bwd_stages`` / ``bwd_long_row_stages``,
``bwd_max_warps``), and prints what the whole-row kernel compiled to: warps, registers,
spills and shared memory (or the error when it does not fit). GPU times (CUDA-graph replay)
beside eager ones, ``--quick`` repetitions: enough to choose, not a benchmark.

What it found: docs/TUNING.md, "LayerNormLaunch.bwd_rms_max_fused_cols" (the row limits, with
the whole sweep), "LayerNormLaunch.bwd_max_fused_cols", "LayerNormLaunch.bwd_max_warps",
"LayerNormLaunch.bwd_long_row_stages"; ``--whole-rows``: "LayerNormLaunch.bwd_long_row_weight_per_tile"
(with the second read of z and dy, tried and dropped) and "LayerNormLaunch.bwd_long_row_programs_per_sm".

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
# and at 32 warps; 32,768 at 32 warps, 1 stage (at 16 it spilled: docs/TUNING.md,
# "LayerNormLaunch.bwd_rms_max_fused_cols").
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
