"""The NaN/Inf tests' helpers: poisoned inputs, ours and torch's gradients, the comparison (NaN for
NaN, inf for inf); shared by tests/test_nonfinite.py and each op's own ``-k nonfinite`` test
(``tests/test_<op>.py``)."""
from __future__ import annotations

import torch

from .oracle import agree, run

NAN, INF = float("nan"), float("inf")
VALUES = [NAN, INF, -INF]


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
