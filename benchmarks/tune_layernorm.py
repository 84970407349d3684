"""Sweep the LayerNorm launch heuristics in kernels/_launch.py on this GPU (a dev tool).

Prints, per shape and dtype, the time of each configuration for forward and backward
and the per-call host overhead of the functional op, so the defaults can be chosen
from measurements. Run: python -m benchmarks.tune_layernorm
"""
import itertools
import time

import torch
import torch.nn.functional as F

from benchmarks import harness
from triton_layers import functional as TF
from triton_layers.kernels import _launch

SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 32768), (1024, 131072)]


def host_overhead_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    dev = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(dev)
    print(f"copy {copy:.0f} GB/s")
    xs = torch.randn(64, 1024, device=dev, requires_grad=True)
    ws = torch.randn(1024, device=dev, requires_grad=True)
    print("host us/call: ours fwd %.1f, torch fwd %.1f, ours fwd+bwd %.1f, torch fwd+bwd %.1f" % (
        host_overhead_us(lambda: TF.layer_norm(xs, ws)),
        host_overhead_us(lambda: F.layer_norm(xs, (1024,), ws)),
        host_overhead_us(lambda: TF.layer_norm(xs, ws).sum().backward()),
        host_overhead_us(lambda: F.layer_norm(xs, (1024,), ws).sum().backward())))
    grid = {
        "TILE_ELEMENTS": [2048, 4096, 8192],
        "ELEMENTS_PER_WARP": [128, 256, 512],
        "LOOP_BLOCK": [2048, 4096, 8192],
        "PROGRAMS_PER_SM": [1, 2, 4, 8],
    }
    defaults = {k: getattr(_launch, k) for k in grid}
    for dtype in (torch.bfloat16, torch.float32):
        for m, d in SHAPES:
            s = torch.finfo(dtype).bits // 8
            x = torch.randn(m, d, device=dev, dtype=dtype, requires_grad=True)
            w = torch.randn(d, device=dev, dtype=dtype, requires_grad=True)
            b = torch.randn(d, device=dev, dtype=dtype, requires_grad=True)
            dy = torch.randn_like(x)
            keys = ["TILE_ELEMENTS", "ELEMENTS_PER_WARP"] + (["LOOP_BLOCK"] if d > _launch.MAX_FUSED_COLS else [])
            fwd_best, bwd_best = [], []
            for combo in itertools.product(*[grid[k] for k in keys]):
                for k, v in zip(keys, combo):
                    setattr(_launch, k, v)
                us = harness.time_us(lambda: TF.layer_norm(x, w, b), quick=True)
                fwd_best.append((us, combo))
                y = TF.layer_norm(x, w, b)
                for ppsm in grid["PROGRAMS_PER_SM"]:
                    _launch.PROGRAMS_PER_SM = ppsm
                    us = harness.time_us(lambda: y.backward(dy, retain_graph=True), [x, w, b], quick=True)
                    bwd_best.append((us, combo + (ppsm,)))
                for k, v in defaults.items():
                    setattr(_launch, k, v)
            fwd_best.sort()
            bwd_best.sort()
            fb, bb = 2 * m * d * s, 3 * m * d * s
            print(f"{m}x{d} {dtype}: keys {keys}")
            print("  fwd " + "; ".join(f"{c}: {u:.0f}us {100 * fb / u / 1e3 / copy:.0f}%" for u, c in fwd_best[:4]))
            print("  fwd worst " + f"{fwd_best[-1][1]}: {fwd_best[-1][0]:.0f}us")
            print("  bwd " + "; ".join(f"{c}: {u:.0f}us {100 * bb / u / 1e3 / copy:.0f}%" for u, c in bwd_best[:4]))
            print("  bwd worst " + f"{bwd_best[-1][1]}: {bwd_best[-1][0]:.0f}us", flush=True)
            del x, w, b, dy, y
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
