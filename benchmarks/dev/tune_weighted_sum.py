"""Sweep WeightedSum's launch knobs (triton_layers/launch_config.py: WeightedSumLaunch) on this GPU (a dev tool).

At the benchmark's shapes (``bench_weighted_sum.SHAPES``), bf16 and fp32: the GPU time
(CUDA-graph replay) of our forward and of our backward under every combination of the knobs
that shape its launch (tile bytes, elements per thread, programs per SM, pipelining
stages), best first, as % of the copy bandwidth by the benchmark's bytes model (forward
MD, backward 2MD). The forward's tile is one program's whole work at rows up to
``tile_max_cols`` (no loop to pipeline), so its occupancy is what the tile sets: registers a
thread, hence programs an SM, hence bytes in flight.

What it found (2026-11-23, GPU time, % of copy; fields tile_bytes / elems_per_thread / stages):
- H100, bf16 forward: 16384 / 32 / default loop (the default then) 71% at 262144x1024, 92-93%
  at 65536x4096 and 16384x16384; two stages 97-98% with tiles of 4096-16384 bytes (8192 / 32 /
  2: 98, 97, 96, 93% at the four shapes with 2,048 rows or more). The stages turn the loads
  into asynchronous copies through shared memory, freeing the registers that held them
  (offline sm_90 build of the 8x1024 tile: 91 registers a thread, two programs an SM).
- H100, fp32 forward: 98-102% at the default loop with 4,096-element tiles (16384 / 32 / None
  or 8192 / 16 / None); with the bf16 settings (2,048 elements, 2 warps) 83% at 2048x131072.
- H100, backward: two or three stages +2-10 points at every shape; 8192 / 32 / 4 programs an
  SM / 2 stages 89-92% (bf16) and 92-94% (fp32), against 85-89% and 83-88% before. Few long
  rows (32x262144): 30-45% forward, 45-67% backward at any setting (an 18-35 us kernel).
- H200: bf16 forward at 262144x1024 83% at best (default 82%), 65536x4096 94-96%; fp32 forward
  101-104%; backward within 1-3% of the best at the defaults.
- 2026-11-25, H100, the backward in two launches (dx, then dw: ``bwd_two_pass_min_bytes``): dx
  alone 98-104% of copy at every setting, dw alone 86-93% (bf16) and 95-98% (fp32), best with
  3 stages (``bwd_dw_stages``); both 94-97% (bf16) and 97-101% (fp32) against the fused pass's
  89-94%. Few long rows (32x262144): 30 us in two against 25 fused.

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
