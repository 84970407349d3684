"""Sweep the norms' launch knobs (kernels/_launch.py: LayerNormLaunch) on this GPU (a dev tool).

For LayerNorm (weight and bias) and RMSNorm (weight), in bf16 and fp32, at each shape:
the GPU time (CUDA-graph replay, ``harness.gpu_time_us``) of the forward and of the
backward under every combination of the knobs that apply there, best first, as % of the
copy bandwidth by the benchmarks' bytes model (forward 2MD, backward 3MD). GPU time, not
eager time: at 32768x1024 the kernels take 40-120 us, under the host's pace, and an eager
sweep there ranks the host's noise. Rows up to the backward's row limit sweep the tile
size, persistent programs per SM and prefetch stages; longer rows the column-split
kernels' chunk, rows per tile and programs per SM (benchmarks/tune_norm_backward.py decides
the row limits themselves).

Run: python -m benchmarks.tune_layernorm [--norm layer|rms|both] [--shapes 32768x1024,...]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools

import torch

from benchmarks import harness
from triton_layers import functional as TF
from triton_layers.kernels import _launch

SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 32768), (1024, 131072)]
# Grids over fields of _launch.LayerNormLaunch.
FWD_GRID = {"tile_elements": [2048, 4096, 8192]}
FWD_LONG_GRID = {"loop_block": [2048, 4096, 8192]}
BWD_SHORT_GRID = {"tile_elements": [2048, 4096, 8192], "bwd_programs_per_sm": [1, 2, 4, 8], "bwd_stages": [1, 2, 3]}
BWD_LONG_GRID = {"loop_block": [2048, 4096, 8192], "split_block_m": [1, 2, 4, 8], "split_programs_per_sm": [2, 4, 8]}


def sweep(grid: dict, make) -> list[tuple[float, tuple]]:
    """(GPU us, knob values) of ``make``'s call under each combination of ``grid``, fastest first."""
    out = []
    for combo in itertools.product(*grid.values()):
        knobs = dataclasses.replace(_launch.DEFAULT.layer_norm, **dict(zip(grid, combo)))
        with _launch.use_config(dataclasses.replace(_launch.DEFAULT, layer_norm=knobs)):
            out.append((harness.gpu_time_us(make, quick=True)[0], combo))
    return sorted(out, key=lambda r: (r[0] != r[0], r[0]))  # NaN (no GPU time) last


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--norm", choices=["layer", "rms", "both"], default="both")
    parser.add_argument("--shapes", default=None, help="comma-separated MxD, default: " +
                        ",".join(f"{m}x{d}" for m, d in SHAPES))
    opts = parser.parse_args(argv)
    shapes = SHAPES if opts.shapes is None else [tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
    dev = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(dev)
    limits = _launch.DEFAULT.layer_norm
    print(f"{harness.device_name()}, copy {copy:.0f} GB/s; % of copy by GPU time (CUDA-graph replay)")
    for rms in {"layer": [False], "rms": [True], "both": [False, True]}[opts.norm]:
        for dtype in (torch.bfloat16, torch.float32):
            for m, d in shapes:
                x = torch.randn(m, d, device=dev, dtype=dtype, requires_grad=True)
                w = torch.randn(d, device=dev, dtype=dtype, requires_grad=True)
                b = None if rms else torch.randn(d, device=dev, dtype=dtype, requires_grad=True)
                params = [w] if rms else [w, b]
                dy = torch.randn_like(x)

                def forward():
                    return TF.rms_norm(x, w, 1e-6) if rms else TF.layer_norm(x, w, b, 1e-5)

                def backward():  # the forward in make: the capture records its autograd graph
                    return harness.backward_call(forward(), dy, [x, *params])

                fwd_grid = dict(FWD_GRID, **FWD_LONG_GRID) if d > limits.fwd_max_fused_cols else FWD_GRID
                bwd_limit = limits.bwd_rms_max_fused_cols if rms else limits.bwd_max_fused_cols
                bwd_grid = BWD_LONG_GRID if d > bwd_limit else BWD_SHORT_GRID
                nbytes = m * d * x.element_size()
                print(f"{'rms_norm' if rms else 'layer_norm'} {m}x{d} {str(dtype)[6:]}", flush=True)
                for tag, grid, make, moved in (("fwd", fwd_grid, lambda: forward, 2 * nbytes),
                                               ("bwd", bwd_grid, backward, 3 * nbytes)):
                    res = sweep(grid, make)
                    default = tuple(getattr(limits, k) for k in grid)
                    at_default = next((us for us, c in res if c == default), float("nan"))
                    best = "; ".join(f"{dict(zip(grid, c))}: {us:.0f} us {100 * moved / us / 1e3 / copy:.0f}%"
                                     for us, c in res[:3])
                    print(f"  {tag} default {at_default:.0f} us ({100 * moved / at_default / 1e3 / copy:.0f}%); "
                          f"best {best}; worst {res[-1][0]:.0f} us", flush=True)


if __name__ == "__main__":
    main()
