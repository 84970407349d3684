"""NaN and +-inf in the inputs: the helpers of each op's ``-k nonfinite`` tests (``tests/test_<op>.py``;
each op's section of docs/API.md says what they check).

Every such test puts NaN / inf / -inf into a few entries of random inputs and compares the
kernels' forward and backward with torch's op on the same inputs, NaN for NaN and inf
for inf (``oracle.agree(..., equal_nan=True)``), on the in-register path and on the
chunked long-row path (conftest's ``n_cols`` fixture: limits shrunk so that rows of 100 take
it). The deliberate differences (softmax rows with nothing to attend to, hidden causal keys in
the backward) have tests of their own.
"""
from __future__ import annotations

import pytest
import torch

from .oracle import agree, run

NAN, INF = float("nan"), float("inf")
VALUES = [NAN, INF, -INF]
# No warning either (each test is marked SILENT): the interpreter computes in numpy, whose
# floating-point warnings the launch turns off (calls/fast_launch._Quiet), as a GPU computes NaN
# and inf silently.
SILENT = pytest.mark.filterwarnings("error::RuntimeWarning")


def close(ours, expected, name, rtol=None, atol=None):
    """Same NaN positions, same infs, finite values close (by default, the oracle's agree bound)."""
    agree(ours, expected, rtol=rtol, atol=atol, equal_nan=True, name=name)


def grads(fn, *inputs, dy=None):
    """fn(*inputs) and the gradients of every input (each a fresh leaf), for a random dy."""
    y, g, dy = run(fn, {i: t.detach().clone().requires_grad_() for i, t in enumerate(inputs)}, dy)
    return (y, *g.values()), dy


def poisoned(rows: int, n: int, value: float, device) -> torch.Tensor:
    """Random (rows, n) with ``value`` in row 1 at column 0 (the looped LayerNorm's shift)
    and in the last row at its last column (the last chunk); other rows stay finite."""
    x = torch.randn(rows, n, device=device)
    x[1, 0] = value
    x[-1, -1] = value
    return x
