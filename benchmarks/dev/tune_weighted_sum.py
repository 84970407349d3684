"""Sweep WeightedSum's launch knobs (triton_layers/launch_config.py: WeightedSumLaunch) on this GPU (a dev tool).

At the benchmark's shapes (``bench_weighted_sum.SHAPES``), bf16 and fp32: the GPU time
(CUDA-graph replay) of our forward and of our backward under every combination of the knobs
that shape its launch (tile bytes, elements per thread, programs per SM, pipelining
stages), best first, as % of the copy bandwidth by the benchmark's bytes model (forward
MD, backward 2MD). The forward's tile is one program's whole work at rows up to
``tile_max_cols`` (no loop to pipeline), so its occupancy is what the tile sets: registers a
thread, hence programs an SM, hence bytes in flight.

What it found, and the defaults it chose: docs/TUNING.md, "WeightedSumLaunch.tile_bytes"
(the forward's tile, stages and programs an SM), "WeightedSumLaunch.fwd_tile_bytes_4byte" (fp32)
and "WeightedSumLaunch.bwd_two_pass_min_bytes" (the backward in two launches).

Run: python -m benchmarks.dev.tune_weighted_sum [--shapes 262144x1024,...] [--dtypes bfloat16,float32]
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import bench_weighted_sum, harness
from benchmarks.dev import tuning
from triton_layers import launch_config

# The forward's grid by bytes an element (fp32 has its own tile and stages).
FWD_GRIDS = {2: {"tile_bytes": [4096, 8192, 16384], "elems_per_thread": [16, 32], "fwd_stages": [None, 2]},
             4: {"fwd_tile_bytes_4byte": [8192, 16384, 32768], "elems_per_thread": [16, 32],
                 "fwd_stages_4byte": [None, 2]}}
BWD_GRID = {"tile_bytes": [8192, 16384, 32768], "elems_per_thread": [16, 32], "bwd_programs_per_sm": [4, 8],
            "bwd_stages": [2, 3], "bwd_dw_stages": [2, 3]}


def main(argv=None) -> None:
    _, shapes, dtypes = tuning.parse(__doc__.splitlines()[0], bench_weighted_sum.SHAPES, argv)
    dev, copy = tuning.start()
    knobs = launch_config.DEFAULT.weighted_sum
    ours = bench_weighted_sum.implementations(argparse.Namespace(no_compile=True))[bench_weighted_sum.OURS]
    for dtype in dtypes:
        for shape in shapes:
            case = bench_weighted_sum.build((dtype, shape), dev)
            print(f"weighted_sum {case.shape} {harness.dtype_name(dtype)}", flush=True)
            for name, grid in (("fwd", FWD_GRIDS[harness.element_size(dtype)]), ("bwd", BWD_GRID)):
                nbytes = next(d.nbytes for d in case.directions if d.name == name)
                res = tuning.sweep(case, name, ours, "weighted_sum", grid)
                print(tuning.report(name, grid, tuple(getattr(knobs, k) for k in grid), res, nbytes, copy), flush=True)
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
