"""Kernels per compiled training step of the example LM, by name: how many are pure casts.

Issue 16 asked that the cast kernel Inductor put after each of our LayerNorms (fp32 out under
autocast, cast to bf16 for the next matmul) be gone. This counts, per step of
``torch.compile(model)`` (small train_step config, bf16 autocast, AdamW), every GPU kernel in a
``torch.profiler`` trace of 3 steps, the pure cast kernels (``triton_poi_fused__to_copy[_view]_N``)
and the GPU time, for the torch model and ours. It imports ``examples/colt5_lm.py`` from the
current directory, so an older tree is measured by running it from that tree's root:

    python -m benchmarks.dev.cast_kernels OUT.json            # this tree
    (cd old_tree && python /path/to/benchmarks/dev/cast_kernels.py OUT.json)

GPU only. Results: benchmarks/results/h100/cast_kernels.json (this tree and 9de19f8, the last
commit before the norms' out_dtype).
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys
import time

import torch

CAST = re.compile(r"triton_poi_fused__to_copy(_view)*(_\d+)?")
CONFIG = dict(seq_len=1024, dim=512, heads=8, depth=4, heavy_tokens=256)  # bench_train_step's "small"
BATCH, WARMUP, TIMED, PROFILED = 16, 4, 20, 3


def measure(colt5_lm, impl: str) -> dict:
    """Kernel counts, GPU time and step time of one implementation's compiled step."""
    device = torch.device("cuda")
    config = colt5_lm.LMConfig(**CONFIG)
    torch.manual_seed(0)
    model = torch.compile(colt5_lm.build_model(config, impl=impl).to(device))
    tokens = torch.randint(0, config.vocab_size, (BATCH, config.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = colt5_lm.lm_loss(model, tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(TIMED):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            step()
        torch.cuda.synchronize()
    count, gpu_us = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            count[event.name] += 1
            gpu_us[event.name] += event.time_range.elapsed_us()
    casts = {name: n / PROFILED for name, n in count.items() if CAST.fullmatch(name)}
    return dict(kernels_per_step=sum(count.values()) / PROFILED, cast_kernels_per_step=sum(casts.values()),
                cast_kernels=casts, gpu_us_per_step=sum(gpu_us.values()) / PROFILED,
                step_ms_median=sorted(times)[len(times) // 2],
                top=[(name, n / PROFILED, round(gpu_us[name] / PROFILED, 1)) for name, n in count.most_common(40)])


def main(argv: list[str]) -> None:
    if not torch.cuda.is_available():
        sys.exit("cast_kernels needs a CUDA GPU")
    sys.path.insert(0, os.path.join(os.getcwd(), "examples"))
    import colt5_lm  # the example of the tree we run from
    result = {impl: measure(colt5_lm, impl) for impl in ("torch", "triton")}
    for impl, r in result.items():
        print(f"{impl}: {r['kernels_per_step']:.0f} kernels/step, {r['cast_kernels_per_step']:.0f} pure casts, "
              f"GPU {r['gpu_us_per_step']:.0f} us/step")
    with open(argv[0], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
