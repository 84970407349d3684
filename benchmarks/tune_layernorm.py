"""Sweep the LayerNorm launch knobs (kernels/_launch.py: LayerNormLaunch) on this GPU (a dev tool).

Prints, per shape and dtype, the time of each configuration for forward and backward
and the per-call host overhead of the functional op, so the defaults can be chosen
from measurements. Run: python -m benchmarks.tune_layernorm
"""
import dataclasses
import itertools

import torch
import torch.nn.functional as F

from benchmarks import harness
from benchmarks.bench_host import host_us
from triton_layers import functional as TF
from triton_layers.kernels import _launch

SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 32768), (1024, 131072)]


def main():
    dev = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(dev)
    print(f"copy {copy:.0f} GB/s")
    xs = torch.randn(64, 1024, device=dev, requires_grad=True)
    ws = torch.randn(1024, device=dev, requires_grad=True)
    print("host us/call: ours fwd %.1f, torch fwd %.1f, ours fwd+bwd %.1f, torch fwd+bwd %.1f" % (
        host_us(lambda: TF.layer_norm(xs, ws)),
        host_us(lambda: F.layer_norm(xs, (1024,), ws)),
        host_us(lambda: TF.layer_norm(xs, ws).sum().backward()),
        host_us(lambda: F.layer_norm(xs, (1024,), ws).sum().backward())))
    # Grids over fields of _launch.LayerNormLaunch.
    fwd_grid = {"tile_elements": [2048, 4096, 8192]}
    bwd_short = dict(fwd_grid, bwd_programs_per_sm=[1, 2, 4, 8], bwd_stages=[1, 2, 3])
    bwd_long = {"loop_block": [2048, 4096, 8192], "split_block_m": [1, 2, 4, 8], "split_programs_per_sm": [2, 4, 8]}

    def sweep(grid, run):
        out = []
        for combo in itertools.product(*grid.values()):
            knobs = dataclasses.replace(_launch.DEFAULT.layer_norm, **dict(zip(grid, combo)))
            with _launch.use_config(dataclasses.replace(_launch.DEFAULT, layer_norm=knobs)):
                out.append((run(), combo))
        out.sort()
        return out

    for dtype in (torch.bfloat16, torch.float32):
        for m, d in SHAPES:
            s = torch.finfo(dtype).bits // 8
            x = torch.randn(m, d, device=dev, dtype=dtype, requires_grad=True)
            w = torch.randn(d, device=dev, dtype=dtype, requires_grad=True)
            b = torch.randn(d, device=dev, dtype=dtype, requires_grad=True)
            dy = torch.randn_like(x)
            long_rows = d > _launch.DEFAULT.layer_norm.bwd_max_fused_cols
            fwd_long = d > _launch.DEFAULT.layer_norm.fwd_max_fused_cols
            fgrid = dict(fwd_grid, loop_block=[2048, 4096, 8192]) if fwd_long else fwd_grid
            fwd = sweep(fgrid, lambda: harness.time_us(lambda: TF.layer_norm(x, w, b), quick=True))

            def bwd_time():
                y = TF.layer_norm(x, w, b)
                return harness.time_us(lambda: y.backward(dy, retain_graph=True), [x, w, b], quick=True)

            bwd = sweep(bwd_long if long_rows else bwd_short, bwd_time)
            fb, bb = 2 * m * d * s, 3 * m * d * s
            print(f"{m}x{d} {dtype}: fwd keys {list(fgrid)}, bwd keys {list(bwd_long if long_rows else bwd_short)}")
            for tag, res, nbytes in (("fwd", fwd, fb), ("bwd", bwd, bb)):
                best = "; ".join(f"{c}: {u:.0f}us {100 * nbytes / u / 1e3 / copy:.0f}%" for u, c in res[:4])
                print(f"  {tag} {best} | worst {res[-1][1]}: {res[-1][0]:.0f}us", flush=True)
            del x, w, b, dy
            torch.cuda.empty_cache()

    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        TF.layer_norm(xs, ws).backward(torch.ones(64, 1024, device=dev))
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
