"""LayerNorm forward and backward (dx + dweight + dbias) against torch, torch.compile, Liger.

Bytes model: forward reads x and writes y (2*M*D*s); backward reads x and dy and writes
dx (3*M*D*s); the D-sized parameters are left out. Run: python -m benchmarks.bench_layernorm
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks import harness
from triton_layers import functional as TF

SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 32768), (1024, 131072), (512, 262144)]
QUICK_SHAPES = [(16384, 4096), (4096, 32768)]
EPS = 1e-5


def _liger():
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except ImportError:
        return None
    return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)


def main() -> None:
    args = harness.parse_args(__doc__)
    device = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(device)
    liger = _liger()
    impls = {
        "triton_layers": lambda x, w, b: TF.layer_norm(x, w, b, EPS),
        "torch": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS),
    }
    if not args.no_compile:
        impls["compile"] = harness.compiled(lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS))
    if liger is not None:
        impls["liger"] = liger
    results: list = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for m, d in QUICK_SHAPES if args.quick else SHAPES:
            shape, s = f"{m}x{d}", torch.finfo(dtype).bits // 8
            x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
            w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
            b = (0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
            dy = torch.randn_like(x)
            for name, op in impls.items():
                harness.measure_fwd_bwd(results, "layernorm", shape, dtype, name, lambda: op(x, w, b), dy,
                                        [x, w, b], 2 * m * d * s, 3 * m * d * s, copy, args.quick)
            del x, w, b, dy
            torch.cuda.empty_cache()
    harness.print_table(results, list(impls), f"layernorm on {torch.cuda.get_device_name()}", copy)
    harness.write_csv(results, f"{args.out}/layernorm.csv")


if __name__ == "__main__":
    main()
