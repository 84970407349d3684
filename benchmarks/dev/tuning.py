"""What the launch-knob sweeps (``benchmarks/tune_*.py``) share: a config with some knobs
changed, a benchmark case's direction under it, and its GPU time.

The sweeps time the benchmarks' own cases (their inputs and bytes models, ``bench_*.build``)
by GPU time (CUDA-graph replay, ``harness.gpu_time_us``), quick repetitions: enough to choose a
default, not a benchmark. GPU time, not eager time: many of the kernels are shorter than the
host's pace (BENCHMARKS.md, the first list), and an eager sweep there ranks the host's noise.
"""
from __future__ import annotations

import argparse
import itertools
from typing import Callable, Optional

import torch

from benchmarks import harness
from triton_layers import launch_config


def parse(description: str, default_shapes: list[tuple[int, int]], argv: Optional[list[str]],
          add: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
          ) -> tuple[argparse.Namespace, list[tuple[int, int]], list[torch.dtype]]:
    """A sweep's command line: ``--shapes`` (comma-separated AxB, default ``default_shapes``),
    ``--dtypes`` and what ``add`` adds. Returns the options, the shapes and the dtypes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", default=None, help="comma-separated AxB, default: " +
                        ",".join(f"{a}x{b}" for a, b in default_shapes))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    add(parser)
    opts = parser.parse_args(argv)
    shapes = default_shapes if opts.shapes is None else \
        [tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
    return opts, shapes, [getattr(torch, name) for name in opts.dtypes.split(",")]


def start() -> tuple[torch.device, float]:
    """The GPU and its copy bandwidth (GB/s), announced on stdout."""
    device = harness.require_cuda()
    copy = harness.copy_bandwidth_gbps(device)
    print(f"{harness.device_name()}, copy {copy:.0f} GB/s; % of copy by GPU time (CUDA-graph replay)")
    return device, copy


def config_with(op: str, **knobs) -> launch_config.LaunchConfig:
    """DEFAULT with these fields of its ``op`` knobs (a field name of ``LaunchConfig``: ``"layer_norm"``, ...)."""
    return launch_config.DEFAULT.with_knobs(op, **knobs)


def direction(case: harness.Case, name: str, config: launch_config.LaunchConfig) -> harness.Direction:
    """The case's direction ``name`` ("fwd" or "bwd"), its call and forward made under ``config``."""
    return next(d for d in harness.under_config(case, config, "").directions if d.name == name)


def gpu_us(d: harness.Direction, ours: Callable) -> float:
    """GPU time of the direction's call (CUDA-graph replay), quick repetitions."""
    return harness.gpu_time_us(lambda: d.make(ours), d.grad_to_none, quick=True)[0]


def sweep(case: harness.Case, name: str, ours: Callable, op: str, grid: dict) -> list[tuple[float, tuple]]:
    """(GPU us, knob values) of the case's direction ``name`` under each combination of the
    ``op`` knobs in ``grid``, fastest first (NaN, no GPU time, last)."""
    out = [(gpu_us(direction(case, name, config_with(op, **dict(zip(grid, combo)))), ours), combo)
           for combo in itertools.product(*grid.values())]
    return sorted(out, key=lambda r: (r[0] != r[0], r[0]))


def report(name: str, grid: dict, default: tuple, results: list[tuple[float, tuple]], nbytes: int,
           copy_gbps: float) -> str:
    """The default's time and % of copy, the best three and the worst; then every combination
    on a line of its own, fastest first (what a later choice between them needs)."""
    def pct(us: float) -> str:
        return f"{100 * nbytes / us / 1e3 / copy_gbps:.0f}%"
    at_default = next((us for us, c in results if c == default), float("nan"))
    best = "; ".join(f"{dict(zip(grid, c))}: {_us(us)} us {pct(us)}" for us, c in results[:3])
    every = "".join(f"\n    {' / '.join(map(str, c))}: {_us(us)} us {pct(us)}" for us, c in results)
    return (f"  {name} default {_us(at_default)} us ({pct(at_default)}); best {best}; worst {_us(results[-1][0])} us"
            f"\n    ({' / '.join(grid)}){every}")


def _us(us: float) -> str:
    """A GPU time as the sweeps print it: a tenth of a microsecond under 100 us (decode-sized
    kernels differ by less than one), whole microseconds above."""
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"
