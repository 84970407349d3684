"""Sweep coor_descent's launch knobs (triton_layers/launch_config.py: CoorDescentLaunch) on this GPU (a dev tool).

The op is bound by its chain of n_iters dependent row reductions, not by bytes: at the
benchmark shapes every kernel is short (BENCHMARKS.md, the coor_descent tables), so the
sweep ranks GPU times (CUDA-graph replay), not eager ones. For each of bench_coor_descent's
shapes (its inputs and settings, n_iters 20): the forward under every combination of warps (elements a thread, most warps) and the
longest row held in registers; the forward + backward under every combination of the
backward's warps and programs an SM (which decides how many chunks a row is split into: one
chunk is one launch). Best first.

What it found, and what was tried and dropped: docs/TUNING.md, "CoorDescentLaunch" (each knob's
section; the unrolled loops under "CoorDescentLaunch.fwd_elems_per_thread").

Run: python -m benchmarks.dev.tune_coor_descent [--shapes 256x1024,...]
"""
from __future__ import annotations

import torch

from benchmarks import bench_coor_descent
from benchmarks.dev import tuning
from triton_layers import functional as TF
from triton_layers import launch_config

FWD_GRID = {"fwd_elems_per_thread": [4, 8, 16, 32], "fwd_max_warps": [16, 32], "max_fused_cols": [8192, 32768]}
BWD_GRID = {"bwd_elems_per_thread": [4, 8, 16], "split_programs_per_sm": [1, 2, 4, 8]}


def main(argv=None) -> None:
    opts, shapes, _ = tuning.parse(__doc__.splitlines()[0], bench_coor_descent.SHAPES, argv)
    dev, copy = tuning.start()
    knobs = launch_config.DEFAULT.coor_descent
    for shape in shapes:
        case = bench_coor_descent.build((torch.float32, shape), dev)
        print(f"coor_descent {shape[0]}x{shape[1]} float32", flush=True)
        for name, grid in (("fwd", FWD_GRID), ("fwd+bwd", BWD_GRID)):
            nbytes = next(d.nbytes for d in case.directions if d.name == name)
            res = tuning.sweep(case, name, TF.coor_descent, "coor_descent", grid)
            print(tuning.report(name, grid, tuple(getattr(knobs, k) for k in grid), res, nbytes, copy), flush=True)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
