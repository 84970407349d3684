"""Tensors past 2**31 elements: the sizes and helpers of each op's ``-k past_2_31`` test.

Each op on a bf16 tensor with more than 2**31 elements (e.g. 65600 x 32768), forward and
backward, checked against the reference on a sample of rows (the first and last, those around
element 2**31, and random ones) and, for the weight gradients, against sums over all rows
computed in chunks. An int32 offset anywhere would wrap past row 2**31 // N and show up there
(or crash). On the GPU, skipped without enough free memory (conftest's ``gpu_memory``
fixture, whose tests run alone: ``.ci/gpu``). On the CPU the same tests run in miniature (past
2**11 elements, fp16, rows 512x shorter, the row limits shrunk by the fixture so the same
kernel paths run): that keeps the checking code itself tested where CI runs.
"""
from __future__ import annotations

import torch

from .conftest import DEVICE

CUDA = DEVICE == "cuda"
# The real sizes on the GPU; a miniature of them on the CPU (see the module docstring).
BIG = 2**31 if CUDA else 2**11
DTYPE = torch.bfloat16 if CUDA else torch.float16  # (the interpreter truncates to bf16)
# Float64 checks over all rows go a chunk at a time: at most CHUNK elements (2 GiB), rows
# cut into COL_CHUNK columns.
CHUNK, COL_CHUNK = (2**28, 2**26) if CUDA else (2**10, 1000)


def cols(n: int) -> int:
    """A row length of the real test, or its miniature (same kernel path under the shrunk limits)."""
    return n if CUDA else n // 512


def sample_rows(n_rows: int, n_cols: int, count: int = 8) -> torch.Tensor:
    """The first and last rows, the rows around element 2**31, and ``count`` random rows."""
    edge = BIG // n_cols
    picked = {0, 1, edge - 1, edge, edge + 1, n_rows - 2, n_rows - 1}
    gen = torch.Generator().manual_seed(0)
    picked |= set(torch.randint(0, n_rows, (count,), generator=gen).tolist())
    return torch.tensor(sorted(r for r in picked if 0 <= r < n_rows), device=DEVICE)


def randn(shape, dtype=DTYPE, seed=0) -> torch.Tensor:
    """Standard normal values of ``shape`` on the device, from their own generator (``seed``)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=DEVICE, dtype=dtype)


def rows_past(n_cols: int, extra: int = 64) -> int:
    """Rows so that the tensor holds more than BIG elements (``extra`` rows past it; 3 in miniature)."""
    return BIG // n_cols + (extra if CUDA else min(extra, 3))
