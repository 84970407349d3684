"""Sweep the softmax's launch knobs (triton_layers/launch_config.py: SoftmaxLaunch) on this GPU (a dev tool).

At the benchmark's shapes (``bench_softmax.SHAPES``), bf16 and fp32, plain and causal: the
GPU time (CUDA-graph replay) of our forward and backward under every combination of the tile
size (several short rows a program; the causal softmax has its own), elements per thread
(hence warps), the row limit of the whole-row kernel and the causal prefix splits, best first, as %
of the copy bandwidth by the benchmark's bytes model (a causal row is counted whole), and the
causal/plain time ratio at each one's best. The causal softmax reads only the visible prefix
of a row but writes it whole: its forward moves 3/4 of the plain one's bytes, its backward
1/2 (dx past the prefix is written as zeros), the issue's ratios of 0.75 and 0.67.

What it found (2026-11-23, GPU time): plain softmax within 1% of the best at the defaults on
the H100 (98-101% of copy). Causal, H100: tiles of 1,024 elements against 4,096 took the bf16
forward at 256x1024x1024 from 372 to 284 us and at 64x2048x2048 from 383 to 280 us; 32 elements
a thread against 16 saved 4% at N = 8,192; taking tiles from both ends (9d70c92) took the bf16
backward at N = 32,768 from 0.85x to 0.77x of the plain one's time. Best causal/plain ratios
then: forward 0.78-0.80x up to N = 8,192 (bf16 and fp32), 0.99x at 32,768 bf16 (0.76x fp32);
backward 0.69-0.75x up to 8,192, 0.77-0.86x at 32,768. The looped path (max_fused_cols 4096)
was slower for plain rows of 8,192 and 32,768 (1.25-1.9x) and mixed for causal ones (bf16
forward at 32,768 0.96x, fp32 1.31x). H200, bf16: causal/plain 0.85-0.95x forward, 0.74-0.89x
backward at the best of the grid, the defaults within 3% of it. Causal prefix splits (H100,
bf16, 2f3e8bd): 2 or 4 within 1% of 1 up to N = 8,192; at 32,768 2 took the forward from
1,424 to 1,361 us and the backward from 1,676-1,944 (two runs) to 1,562-1,567; 4 was level
forward and 7-23% slower backward. 05d9ba5 makes 2 the default.

Causal rows of 32,768 (2026-11-25, ncu on the H100): the plain and causal forwards each run one
program of 1,024 threads an SM (48 and 63 registers: one fits), the plain one at 88% of DRAM
throughput, the causal one at 70%: a row that reads a short prefix still waits a whole load's
latency alone on its SM. No knob of the grid above moved it (1,363 us at every prefix split and
elements a thread; the looped path 1.36-1.45x slower). The forward by classes of rows (the rows
that see at most half the keys in a launch of half-width programs, two an SM; the others in
one of their own: causal_class_min_cols), measured with a throwaway script that launched the two classes directly, GPU
time, 1x32768x32768: bf16 H100 1,205 us against 1,364, H200 1,075 against 1,205; fp32 H100
2,186-2,200 against 2,197, H200 1,643 against 1,766 (16 elements a thread; 1,729 at 32). Three
classes were level with two; at 16,384 columns bf16 gained 3-10% and fp32 lost 1%, at 8,192 both
lost; the backward by classes lost at 32,768 (H100 bf16 1,638 us against 1,562) but won at
16,384 (H100 373 against 407, H200 299 against 348; not a benchmark shape, not adopted).
Rows of 32,768 split over 2 or 4 programs that exchange their chunk's (max, sum) through global
memory and wait for each other (as the norms' one-pass kernels do; 2-8 programs an SM, 16 or 32
elements a thread, each chunk's exps kept and rescaled by one factor after the exchange: 32-64
registers in bf16, so two to four programs an SM), H200, GPU time: slower at every setting,
plain bf16 1,367-2,038 us against 1,289 in one program a row (79% of copy), fp32 2,467-2,857
against 2,038, causal 1.4-3.2x slower than the classes above. Each row's exchange is a round
trip through L2 that nothing overlaps, as in the norms' first one-pass form; not adopted.

The backward at 32,768 columns (2026-11-25): held whole at 32 warps it needs 64 fp32 values a
thread for y and dy, every register, and spills (offline sm_90 build: 24-88 bytes). Inductor's
kernel for it reads y and dy, sums, then reads them again (``evict_last``, then
``evict_first``): 4,330 us in fp32 (99% of copy) against our 4,979 (86%). Timed with a
throwaway script on the H100, 32768x32768, GPU time: the same two reads in our whole-row
kernel, fp32 4,337-4,435 us at 8-32 warps (98-99%; 4,374 at 32), bf16 2,084 at 32 warps
(103%) against 2,160; without the hints (the second read ``.cg``) 5,380-6,081 us; a looped
kernel (chunks of 1,024-8,192, one row a program, hints on) 6,439 us at best, the rows in
flight being far more than L2 holds; fewer warps while holding (8: 4,374 us, 18 bytes
spilled) close to the reload. At 16,384 columns nothing spills and the second read cost
3-4% (fp32 1,092 us against 1,055). Hence bwd_reload_min_cols = 32768.

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
