"""Sweep the FP8 norms' launch knobs (triton_layers/launch_config.py: LayerNormLaunch.fp8_*) on this GPU (a dev tool).

At bench_fp8's training shapes (16384x4096 and 4096x8192 bf16, or ``--shapes``), for the ops
of ``--ops`` (default: per token, per group, the fused add per token, LayerNorm per token):
the GPU time (CUDA-graph replay) of our forward under every combination of a program's tile
(``fp8_tile_elements``: whole rows, as many as fit) and its elements a thread
(``fp8_elems_per_thread``, which sets its warps), best first, as % of the copy bandwidth by
bench_fp8's bytes model.

What it found, and the defaults it chose: docs/TUNING.md, "LayerNormLaunch.fp8_tile_elements,
fp8_elems_per_thread".

Run: python -m benchmarks.dev.tune_fp8 [--shapes 16384x4096,...] [--ops rmsnorm_fp8_per_token,...]
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import bench_fp8, harness
from benchmarks.dev import tuning
from triton_layers import launch_config

DEFAULT_OPS = "rmsnorm_fp8_per_token,rmsnorm_fp8_per_group,add_rmsnorm_fp8_per_token,layernorm_fp8_per_token"
GRID = {"fp8_tile_elements": [4096, 8192, 16384], "fp8_elems_per_thread": [16, 32, 64, 128]}


def main(argv=None) -> None:
    opts, shapes, dtypes = tuning.parse(
        __doc__.splitlines()[0], [(16384, 4096), (4096, 8192)], argv,
        lambda parser: parser.add_argument("--ops", default=DEFAULT_OPS))
    if opts.dtypes == "bfloat16,float32":  # (tuning.parse's default: an FP8 recipe quantizes bf16 here)
        dtypes = [torch.bfloat16]
    dev, copy = tuning.start()
    knobs = launch_config.DEFAULT.layer_norm
    ours = bench_fp8.implementations(argparse.Namespace(no_compile=True))[bench_fp8.OURS]
    for op in opts.ops.split(","):
        for dtype in dtypes:
            for shape in shapes:
                case = bench_fp8.build((op, dtype, shape), dev)
                print(f"{op} {case.shape} {harness.dtype_name(dtype)}", flush=True)
                nbytes = case.directions[0].nbytes
                res = tuning.sweep(case, "fwd", ours[op], "layer_norm", GRID)
                print(tuning.report("fwd", GRID, tuple(getattr(knobs, k) for k in GRID), res, nbytes, copy),
                      flush=True)
                del case
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
