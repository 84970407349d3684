"""The benchmarks' timers patched out, for the CPU dry runs of the benchmarks and of each op's
tuning script (tests/test_benchmarks_cli.py, and each ``tests/test_<op>.py``)."""
from __future__ import annotations

import torch

from benchmarks import harness

COPY = 1000.0  # GB/s of the fake runs


def fake_gpu_timer(monkeypatch) -> list:
    """harness's timers patched out (each call runs once); returns the list each GPU timing appends to."""
    monkeypatch.setattr(harness, "require_cuda", lambda: torch.device("cpu"))
    monkeypatch.setattr(harness, "copy_bandwidth_gbps", lambda device: COPY)
    runs = []

    def fake_gpu_us(make, grad_to_none=None, quick=False):
        make()()
        runs.append(1)
        return 1.0, "graph"
    monkeypatch.setattr(harness, "gpu_time_us", fake_gpu_us)
    monkeypatch.setattr(harness, "time_us", lambda fn, grad_to_none=None, quick=False: (fn(), 2.0)[1])
    return runs
