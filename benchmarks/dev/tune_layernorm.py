"""Sweep the norms' launch knobs (triton_layers/launch_config.py: LayerNormLaunch) on this GPU (a dev tool).

For LayerNorm (weight and bias) and RMSNorm (weight), in bf16 and fp32, at each shape:
the GPU time (CUDA-graph replay, ``harness.gpu_time_us``) of the forward and of the
backward under every combination of the knobs that apply there, best first, as % of the
copy bandwidth by the benchmarks' bytes model (forward 2MD, backward 3MD). GPU time, not
eager time: at 32768x1024 the kernels are shorter than the host's pace (BENCHMARKS.md, the
LayerNorm and RMSNorm tables), and an eager sweep there ranks the host's noise. Rows up to the backward's row limit sweep the tile
size, persistent programs per SM and prefetch stages; longer rows the column-split
kernels' chunk, rows per tile and programs per SM (benchmarks/dev/tune_norm_backward.py decides
the row limits themselves).

What it found, and the defaults it chose: docs/TUNING.md, "LayerNormLaunch" (each knob's
section: "LayerNormLaunch.tile_elements" for the short-row defaults and the persistent forward
tried, "LayerNormLaunch.bwd_tile_bytes" for programs an SM, "LayerNormLaunch.split_one_pass" and
the split_* sections after it for the column-split backward, "LayerNormLaunch.loop_block",
"LayerNormLaunch.fwd_one_pass" and "LayerNormLaunch.fwd_one_pass_ahead" for the long-row forward,
"LayerNormLaunch.fwd_warps" and "LayerNormLaunch.fwd_4_warps_8192_gpus" for the forward's warps,
"LayerNormLaunch.fwd_max_fused_cols" for short rows read twice, tried).

``--decode``: the forward as bench_decode times it (under torch.no_grad: no statistics
written), for the serving shapes (rmsnorm, add_rmsnorm, layernorm), and for
``qk_rmsnorm_strided`` (QK-norm of a fused projection's q slice, read in place; shapes tokens x
heads x head_dim). ``--grid`` replaces the forward's grid: ``knob=v1,v2;knob=...`` over
LayerNormLaunch fields (``None``, ints, True/False), for
example the long-row path at a short row: ``fwd_max_fused_cols=32768,2048;loop_block=1024,2048``.
With ``--decode``, each forward's report is followed by the peers' GPU time in the same run
(torch.compile, Liger where installed).

Run: python -m benchmarks.dev.tune_layernorm [--norm layer|rms|both|add_rmsnorm,...] [--dirs fwd,bwd]
     [--shapes 32768x1024,...] [--dtypes ...] [--decode] [--grid ...]
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch

from benchmarks import bench_decode, bench_layernorm, bench_norms, harness
from benchmarks.dev import tuning
from triton_layers import launch_config
from triton_layers.kernels import _layer_norm_rules

NORMS = ("layernorm", "rmsnorm", "add_rmsnorm", "add_layernorm", bench_decode.QK_STRIDED)  # norm_case's names
SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (4096, 32768), (1024, 131072)]
# Grids over fields of launch_config.LayerNormLaunch.
FWD_GRID = {"tile_elements": [2048, 4096, 8192], "fwd_warps": [None, 4, 8, 16, 32]}
FWD_LONG_GRID = {"fwd_one_pass": [False, True], "fwd_one_pass_ahead": [1, 2],
                 "fwd_one_pass_sm_bytes": [16384, 32768, 65536]}
BWD_SHORT_GRID = {"tile_elements": [2048, 4096, 8192], "bwd_programs_per_sm": [1, 2, 4, 8], "bwd_stages": [1, 2, 3]}
BWD_LONG_GRID = {"split_one_pass": [True, False], "split_tile_bytes": [16384, 32768, 65536],
                 "split_programs_per_sm": [1, 2, 4], "split_one_pass_max_chunks": [128]}


def norm_case(name: str, dtype: torch.dtype, shape: tuple[int, ...],
              device: torch.device, decode: bool = False) -> tuple[harness.Case, Callable]:
    """The benchmarks' case of a norm ("layernorm": bench_layernorm's; "rmsnorm", "add_rmsnorm",
    "add_layernorm": bench_norms'; with ``decode``, bench_decode's no-grad forward) and our
    implementation of it: inputs and bytes models as ``python -m benchmarks`` times them."""
    no_peers = argparse.Namespace(no_compile=True)
    if decode:  # (bench_decode's own implementations: its LayerNorm, its strided QK-norm)
        return (bench_decode.build((name, dtype, shape), device),
                bench_decode.implementations(no_peers)[bench_norms.OURS][name])
    if name == "layernorm":
        ours = bench_layernorm.implementations(no_peers)[bench_norms.OURS]
        return bench_layernorm.build((dtype, shape), device), ours
    return bench_norms.build((name, dtype, shape), device), bench_norms.OURS_BY_OP[name]


def _norm_of(name: str) -> str:
    """The norm a case runs: RMSNorm for the strided QK-norm, else the case's own."""
    return "rmsnorm" if name == bench_decode.QK_STRIDED else name


def parse_grid(text: str) -> dict:
    """``knob=v1,v2;knob=...`` as a grid: values None, True, False or ints. Unknown knobs are
    refused (a typo would sweep nothing)."""
    words = {"None": None, "True": True, "False": False}
    fields = set(launch_config.LayerNormLaunch.__dataclass_fields__)
    grid = {}
    for part in filter(None, text.split(";")):
        knob, _, values = part.partition("=")
        if knob not in fields:
            raise SystemExit(f"--grid: {knob!r} is not a LayerNormLaunch field")
        grid[knob] = [words[v] if v in words else int(v) for v in values.split(",")]
    return grid


def peers_line(case: harness.Case, norm: str) -> str:
    """The peers' GPU time for the case's decode forward under the default config: torch.compile,
    and Liger where it is installed (bench_decode.implementations)."""
    impls = bench_decode.implementations(argparse.Namespace(no_compile=False))
    d = tuning.direction(case, "fwd", launch_config.DEFAULT)
    times = []
    for peer in ("compile", "liger"):
        if norm in impls.get(peer, {}):
            # (one call first: torch.compile's build syncs, and the harness's first call runs under
            # the sync check, which then sent compile to the profiler's fallback on an H200)
            d.make(impls[peer][norm])()
            times.append(f"{peer} {tuning.gpu_us(d, impls[peer][norm]):.1f} us")
    return "  peers: " + ", ".join(times)


def main(argv=None) -> None:
    opts, shapes, dtypes = tuning.parse(
        __doc__.splitlines()[0], SHAPES, argv,
        lambda parser: (
            parser.add_argument("--norm", default="both",
                                help="layer, rms, both, or a comma-separated list of " + ", ".join(NORMS)),
            parser.add_argument("--dirs", default="fwd,bwd", help="the directions swept: fwd, bwd or both"),
            parser.add_argument("--decode", action="store_true", help="bench_decode's no-grad forward"),
            parser.add_argument("--grid", default=None, help="the forward's grid: knob=v1,v2;knob=...")))
    dev, copy = tuning.start()
    limits = launch_config.DEFAULT.layer_norm
    norms = {"layer": ["layernorm"], "rms": ["rmsnorm"], "both": ["layernorm", "rmsnorm"]}.get(
        opts.norm, opts.norm.split(","))
    unknown = set(norms) - set(NORMS)
    if unknown:
        raise SystemExit(f"unknown norms {sorted(unknown)}: choose among {', '.join(NORMS)}")
    decode_ops = (*bench_decode.OPS, bench_decode.LAYERNORM, bench_decode.QK_STRIDED)
    if opts.decode and not set(norms) <= set(decode_ops):
        raise SystemExit(f"--decode times {', '.join(decode_ops)}, not {sorted(set(norms) - set(decode_ops))}")
    if bench_decode.QK_STRIDED in norms and not opts.decode:
        raise SystemExit(f"{bench_decode.QK_STRIDED} is bench_decode's case: add --decode")
    given_grid = parse_grid(opts.grid) if opts.grid else None
    for norm in norms:
        for dtype in dtypes:
            for shape in shapes:  # (tokens x heads x head_dim for the strided QK-norm)
                d = shape[-1]
                case, ours = norm_case(norm, dtype, shape, dev, opts.decode)
                base = _norm_of(norm)
                fwd_limit = limits.fwd_max_fused_cols if base in ("layernorm", "rmsnorm") \
                    else limits.fwd_residual_max_fused_cols
                fwd_grid = FWD_LONG_GRID if d > fwd_limit else FWD_GRID  # (a long row is a tile alone)
                own = {"fwd_one_pass": "fwd_residual_one_pass" if base.startswith("add_") else "fwd_one_pass",
                       "fwd_one_pass_ahead": "fwd_one_pass_rms_fp32_ahead"
                       if base.endswith("rmsnorm") and dtype == torch.float32 else "fwd_one_pass_ahead"}
                fwd_grid = {own.get(k, k): v for k, v in fwd_grid.items()}  # (the knobs this case reads)
                if given_grid:
                    fwd_grid = given_grid
                bwd_limit = (limits.bwd_rms_max_fused_cols if base.endswith("rmsnorm")
                             else limits.bwd_residual_max_fused_cols if norm == "add_layernorm"
                             else limits.bwd_max_fused_cols)
                bwd_grid = BWD_LONG_GRID if d > bwd_limit else BWD_SHORT_GRID
                print(f"{norm} {'x'.join(map(str, shape))} {str(dtype)[6:]}", flush=True)
                for name, grid in (("fwd", fwd_grid), ("bwd", bwd_grid)):
                    if name not in opts.dirs.split(","):
                        continue
                    nbytes = next(d.nbytes for d in case.directions if d.name == name)
                    res = tuning.sweep(case, name, ours, "layer_norm", grid)
                    # (fwd_one_pass None: what it means on this GPU)
                    default = tuple(_layer_norm_rules.plain_one_pass_forward(limits, launch_config.GPU.of(dev))
                                    if k == "fwd_one_pass"
                                    else getattr(limits, k) for k in grid)
                    print(tuning.report(name, grid, default, res, nbytes, copy), flush=True)
                    if opts.decode and name == "fwd":
                        print(peers_line(case, norm), flush=True)
                del case
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
