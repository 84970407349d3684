"""Sweep the softmax's launch knobs (triton_layers/launch_config.py: SoftmaxLaunch) on this GPU (a dev tool).

At the benchmark's shapes (``bench_softmax.SHAPES``), bf16 and fp32, plain and causal: the
GPU time (CUDA-graph replay) of our forward and backward under every combination of the tile
size (several short rows a program; the causal softmax has its own), elements per thread
(hence warps), the row limit of the whole-row kernel and the causal prefix splits, best first, as %
of the copy bandwidth by the benchmark's bytes model (a causal row is counted whole), and the
causal/plain time ratio at each one's best. The causal softmax reads only the visible prefix
of a row but writes it whole: its forward moves 3/4 of the plain one's bytes, its backward
1/2 (dx past the prefix is written as zeros), the issue's ratios of 0.75 and 0.67.

What it found, and the defaults it chose: docs/TUNING.md, "SoftmaxLaunch" (each knob's section:
"SoftmaxLaunch.causal_tile_elements" for the causal tiles, "SoftmaxLaunch.causal_prefix_splits",
"SoftmaxLaunch.causal_class_min_cols" for the causal rows of 32,768, "SoftmaxLaunch.max_fused_cols"
for the looped path and the split rows tried, "SoftmaxLaunch.bwd_reload_min_cols" for the backward
at 32,768).

Run: python -m benchmarks.dev.tune_softmax [--shapes 256x1024,...] [--dtypes bfloat16,float32]
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import bench_softmax, harness
from benchmarks.dev import tuning
from triton_layers import launch_config

# Plain and causal softmax have their own tile sizes; max_fused_cols 4096 sends rows of 8192
# and more to the looped path (H100, 2026-11-23: slower for plain rows, mixed for causal ones,
# so the causal grid has the prefix splits instead).
GRIDS = {"triton_layers": {"tile_elements": [4096, 16384], "elems_per_thread": [16, 32],
                           "max_fused_cols": [32768, 4096]},
         "triton_layers-causal": {"causal_tile_elements": [1024, 2048], "elems_per_thread": [16, 32],
                                  "causal_prefix_splits": [1, 2, 4]}}


def main(argv=None) -> None:
    _, shapes, dtypes = tuning.parse(__doc__.splitlines()[0], bench_softmax.SHAPES, argv)
    dev, copy = tuning.start()
    knobs = launch_config.DEFAULT.softmax
    impls = bench_softmax.implementations(argparse.Namespace(no_compile=True))
    for dtype in dtypes:
        for shape in shapes:
            case = bench_softmax.build((dtype, shape), dev)
            for name in ("fwd", "bwd"):
                nbytes = next(d.nbytes for d in case.directions if d.name == name)
                best = {}
                for impl in (bench_softmax.OURS, bench_softmax.OURS_CAUSAL):
                    print(f"softmax {case.shape} {harness.dtype_name(dtype)} {impl}", flush=True)
                    grid = GRIDS[impl]
                    res = tuning.sweep(case, name, impls[impl], "softmax", grid)
                    best[impl] = res[0][0]
                    print(tuning.report(name, grid, tuple(getattr(knobs, k) for k in grid), res, nbytes, copy),
                          flush=True)
                print(f"  {name} causal/plain at each one's best: "
                      f"{best[bench_softmax.OURS_CAUSAL] / best[bench_softmax.OURS]:.2f}", flush=True)
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
