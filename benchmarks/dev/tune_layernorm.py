"""Sweep the norms' launch knobs (triton_layers/launch_config.py: LayerNormLaunch) on this GPU (a dev tool).

For LayerNorm (weight and bias) and RMSNorm (weight), in bf16 and fp32, at each shape:
the GPU time (CUDA-graph replay, ``harness.gpu_time_us``) of the forward and of the
backward under every combination of the knobs that apply there, best first, as % of the
copy bandwidth by the benchmarks' bytes model (forward 2MD, backward 3MD). GPU time, not
eager time: at 32768x1024 the kernels take 40-120 us, under the host's pace, and an eager
sweep there ranks the host's noise. Rows up to the backward's row limit sweep the tile
size, persistent programs per SM and prefetch stages; longer rows the column-split
kernels' chunk, rows per tile and programs per SM (benchmarks/dev/tune_norm_backward.py decides
the row limits themselves).

RMSNorm on an H100 (2026-11-23, main at 4df051d, 32768x1024 and 16384x4096, bf16 and fp32):
the defaults within 1-3% of the best setting forward and backward; the bf16 backward at
32768x1024 is 74% of copy at the default and 75% at best (a 90 us kernel).

Short rows, programs per SM (2026-11-25, 6d98ea4, GPU time; bwd_stages 3): on an H200, bf16
rows of 1,024 ran at 3-4 programs an SM against 2 in 70-73 us against 78-82 (RMSNorm 61% ->
68% of copy, LayerNorm 58% -> 65%), while fp32 rows of 1,024 and bf16 or fp32 rows of 4,096 and
8,192 ran best at 2 (6-13% slower at 3-4); on an H100 the same change was level at 32768x1024
bf16 (90 / 93 us), 3-5% faster at 65536x512 and 2-3% slower at 16384x2048, and 6% slower for
the fused residual's bf16 32768x1024 (three tensors loaded: bigger tiles). Hence
bwd_tile_bytes: more programs only for tiles whose loads bring under 16 KB.

Long rows (2026-11-23, 15926c8 and after; GPU time): the column-split backward in one pass
(split_one_pass) against two, chunks of 4096/8192, tiles of 16-64 KB of z, 1-8 programs an
SM, publishing 0/2/8 tiles ahead. RMSNorm, H100: one pass with chunks of 8192, 32 KB tiles
and 2 ahead was best or within 3% in bf16 (2048x32768 194 us / 69% against 245 us two-pass;
1024x131072 376 us / 71% against 474) and within 1-5% of 1-row fp32 tiles (615 us / 87%
against 912); waiting on each tile (0 ahead) 3-12% slower, 8 ahead slower still, chunks of
4096 up to 1.9x slower in one pass. H200: the same setting best in bf16 (56% against 51-54%),
fp32 preferring 64 KB tiles (72-79% against 73% at the default). LayerNorm: one pass won in
fp32 (4096x32768 83% against 57%, H100; 71% against 56%, H200) and lost at 512x262144 (32
chunks: bf16 27-35% against 51%) and in bf16 on the H200 (1024x131072 38% against 50%), so
those keep two passes, where 16 KB (one-row) tiles were best (bf16 4096x32768 478 us against
554, H100; 365 against 475, H200). Asked again for bf16 LayerNorm and the fused add + LayerNorm
(2026-11-25, 08237c3: split_one_pass_layer_norm_min_bytes 2 against 4, tiles of 16/32 KB, 2 or 4
programs an SM): on the H100 one pass won at 4096x32768 (LayerNorm 426-449 us against 484, the
fused add 532-562 against 575) but not at 1024x131072 (496-535 against 501, the fused add 566-597
against 589), each case at another best setting; on the H200 two passes were best or level at
4096x32768, 2048x65536 and 1024x131072 (LayerNorm 372 / 390 / 393 us). Too mixed to change the
defaults: bf16 LayerNorm keeps two passes. Rows of two chunks (2026-11-25, 9fe7a21, 4096x16384
and 2048x16384, chunks of 4,096/8,192, tiles of 16/32 KB, 2 or 4 programs an SM): one pass with
chunks of 8,192 and 32 KB tiles won on both GPUs for bf16 LayerNorm (4096x16384: H100 209 us
against 256, H200 182 against 200; 2048x16384 H200 108 against 117) and for the fused add on the
H100 (286 against 303; H200 level, 234), so LayerNorm rows of up to
split_one_pass_layer_norm_max_chunks (2) chunks take it in any dtype. At 4096x32768 (4 chunks, or
2 of 16,384) two passes stayed best on the H200 (374 us). The fp32 norms and RMSNorm at 16,384
were within 2% of their defaults. Chunks of 16,384 for the column split (loop_block; 2026-11-25,
e1cfd3a, H100, with 32/64 KB tiles and 1-2 programs an SM, the four norms at 32,768 and 131,072
columns, bf16 and fp32): within 2% of the default everywhere but bf16 RMSNorm at 1024x131072
(358 us at 1 program an SM against 387, 75% of copy against 69%) and fp32 LayerNorm there (675
against 687); the fused adds lost up to 8% in bf16. Not adopted for one shape.

Short-row forward as a persistent kernel (2026-11-25, H200, GPU time, RMSNorm and LayerNorm at
32768x1024 and 16384x4096, bf16 and fp32): 2-8 programs an SM walking the tiles with 1-3
software-pipelining stages (tl.range), the weight and bias loaded once a program, tiles of
2,048-8,192 elements: 3-7% slower than one program a tile at every case (RMSNorm 32768x1024 bf16
39.3 us at best against 37.6, LayerNorm 42.0 against 39.4). Not adopted.

Long rows, forward (2026-11-25, GPU time, 1024x131072 and 512x262144, the four norms in bf16
and fp32): the one-pass form (fwd_one_pass, fwd_residual_one_pass) against the loop that reads
each row twice. Its first form waited right after publishing a row's sums: no faster than
the loop (H100: LayerNorm bf16 1024x131072 488 us against 282, RMSNorm level). Publishing a
row ahead and loading w and b per row (fewer registers), swept over chunks of 4096/8192, 16-64
KB of chunks an SM and 32/64 chunks a row: on the H100, chunks of 4096, 32 KB and 64 chunks
were within 1% of each case's best on geometric mean (5% at worst) and ahead of the loop at
15 of 16 cases (RMSNorm bf16 1024x131072 251 us against 284, LayerNorm fp32 494 against 571,
the fused add RMSNorm bf16 390 against 466); on the H200 the loop won every case without a
residual (LayerNorm bf16 214 us against 258, RMSNorm fp32 412 against 458) and the fused add
RMSNorm in fp32 (666 against 718), the one pass the fused adds in bf16 (305 against 332 for
RMSNorm, 322 against 334 for LayerNorm) and LayerNorm's in fp32 (616 against 665). Fewer
programs an SM lose (H100 bf16 RMSNorm: 382 us at 2, 679 at 1), and so do more than the
registers let an SM hold. Publishing two rows ahead (fwd_one_pass_ahead) won for RMSNorm in
fp32 on both GPUs (the fused add 1024x131072: H100 798 us against 847, H200 642 against 723)
and lost elsewhere (H200 fused add LayerNorm fp32 765 against 621): fwd_one_pass_rms_fp32_ahead.

Warps of the forward (fwd_warps; 2026-11-25, 08237c3, GPU time, M*D = 2^25, D 1,024-32,768, the
four norms in bf16 and fp32, 2-32 warps): the rule (fwd_warps, kernels/_layer_norm_launch.py) was within 2% of each case's
best except at bf16 tiles of 16,384, where 16 warps left LayerNorm one program an SM (105
registers a thread): 8 warps ran 2048x16384 in 53.9 us against 68.1 (H100) and 44.2 against
62.6 (H200), RMSNorm and the fused adds level or up to 4% faster; hence 8 there. fp32 LayerNorm
at 16,384 was mixed (4 warps: H200 79.3 us against 83.5, H100 101.7 against 99.2).
Again at 8192x8192 and 4096x8192 bf16 (2026-11-25, main at 56dfcd7): on the H200 4 warps ran
LayerNorm in 73-74 us against 78-79 (86% of copy against 81%; 4096x8192 41 against 43) and
RMSNorm in 72 against 73-74, the fused adds best at 16-32; on the H100 4 warps were 1-2% slower
(LayerNorm 97 against 95, fp16 alike). Hence fwd_4_warps_8192_gpus = ("H200",).

Short rows read twice, as Inductor's forward does (2026-11-25, H100, GPU time, a throwaway
kernel: rows of 1,024-32,768 walked in chunks of 1,024-4,096 columns, 1-4 rows and 4 or 8 warps
a program, the first read asking L2 to keep the row (evict_last), the second to drop it): no
faster than ours anywhere (RMSNorm 32768x1024 bf16 50.0 us against 50.8, 16384x4096 94.9 against
95.5, fp32 level) and slower from 8,192 columns on (RMSNorm 2048x32768 bf16 138 us against 96.5,
fp32 278 against 186): the rows in flight outgrow L2. Untried on the H200, where torch.compile's
kernel of that form beats ours in bf16 (8192x8192 69 us against 74, 2048x32768 70 against 75).

Run: python -m benchmarks.dev.tune_layernorm [--norm layer|rms|both|add_rmsnorm,...] [--dirs fwd,bwd]
     [--shapes 32768x1024,...] [--dtypes ...]
"""
from __future__ import annotations

from typing import Callable

import torch

from benchmarks import bench_layernorm, bench_norms, harness
from benchmarks.dev import tuning
from triton_layers import functional as TF
from triton_layers import launch_config
from triton_layers.kernels import _layer_norm_launch

NORMS = ("layernorm", "rmsnorm", "add_rmsnorm", "add_layernorm")  # norm_case's names
SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (4096, 32768), (1024, 131072)]
# Grids over fields of launch_config.LayerNormLaunch.
FWD_GRID = {"tile_elements": [2048, 4096, 8192], "fwd_warps": [None, 4, 8, 16, 32]}
FWD_LONG_GRID = {"fwd_one_pass": [False, True], "fwd_one_pass_ahead": [1, 2],
                 "fwd_one_pass_sm_bytes": [16384, 32768, 65536]}
BWD_SHORT_GRID = {"tile_elements": [2048, 4096, 8192], "bwd_programs_per_sm": [1, 2, 4, 8], "bwd_stages": [1, 2, 3]}
BWD_LONG_GRID = {"split_one_pass": [True, False], "split_tile_bytes": [16384, 32768, 65536],
                 "split_programs_per_sm": [1, 2, 4], "split_one_pass_max_chunks": [128]}


def norm_case(name: str, dtype: torch.dtype, shape: tuple[int, int],
              device: torch.device) -> tuple[harness.Case, Callable]:
    """The benchmarks' case of a norm ("layernorm": bench_layernorm's; "rmsnorm", "add_rmsnorm",
    "add_layernorm": bench_norms') and our implementation of it: inputs and bytes models as
    ``python -m benchmarks`` times them."""
    if name == "layernorm":
        return bench_layernorm.build((dtype, shape), device), \
            lambda x, w, b: TF.layer_norm(x, w, b, bench_layernorm.EPS)
    return bench_norms.build((name, dtype, shape), device), bench_norms.OURS_BY_OP[name]


def main(argv=None) -> None:
    opts, shapes, dtypes = tuning.parse(
        __doc__.splitlines()[0], SHAPES, argv,
        lambda parser: (
            parser.add_argument("--norm", default="both",
                                help="layer, rms, both, or a comma-separated list of " + ", ".join(NORMS)),
            parser.add_argument("--dirs", default="fwd,bwd", help="the directions swept: fwd, bwd or both")))
    dev, copy = tuning.start()
    limits = launch_config.DEFAULT.layer_norm
    norms = {"layer": ["layernorm"], "rms": ["rmsnorm"], "both": ["layernorm", "rmsnorm"]}.get(
        opts.norm, opts.norm.split(","))
    unknown = set(norms) - set(NORMS)
    if unknown:
        raise SystemExit(f"unknown norms {sorted(unknown)}: choose among {', '.join(NORMS)}")
    for norm in norms:
        for dtype in dtypes:
            for m, d in shapes:
                case, ours = norm_case(norm, dtype, (m, d), dev)
                fwd_limit = limits.fwd_max_fused_cols if norm in ("layernorm", "rmsnorm") \
                    else limits.fwd_residual_max_fused_cols
                fwd_grid = FWD_LONG_GRID if d > fwd_limit else FWD_GRID  # (a long row is a tile alone)
                own = {"fwd_one_pass": "fwd_residual_one_pass" if norm.startswith("add_") else "fwd_one_pass",
                       "fwd_one_pass_ahead": "fwd_one_pass_rms_fp32_ahead"
                       if norm.endswith("rmsnorm") and dtype == torch.float32 else "fwd_one_pass_ahead"}
                fwd_grid = {own.get(k, k): v for k, v in fwd_grid.items()}  # (the knobs this case reads)
                bwd_limit = (limits.bwd_rms_max_fused_cols if norm.endswith("rmsnorm")
                             else limits.bwd_residual_max_fused_cols if norm == "add_layernorm"
                             else limits.bwd_max_fused_cols)
                bwd_grid = BWD_LONG_GRID if d > bwd_limit else BWD_SHORT_GRID
                print(f"{norm} {m}x{d} {str(dtype)[6:]}", flush=True)
                for name, grid in (("fwd", fwd_grid), ("bwd", bwd_grid)):
                    if name not in opts.dirs.split(","):
                        continue
                    nbytes = next(d.nbytes for d in case.directions if d.name == name)
                    res = tuning.sweep(case, name, ours, "layer_norm", grid)
                    # (fwd_one_pass None: what it means on this GPU)
                    default = tuple(_layer_norm_launch.plain_one_pass_forward(limits, launch_config.GPU.of(dev))
                                    if k == "fwd_one_pass"
                                    else getattr(limits, k) for k in grid)
                    print(tuning.report(name, grid, default, res, nbytes, copy), flush=True)
                del case
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
