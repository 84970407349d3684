"""Property-based tests (hypothesis): the draws of each op's ``-k properties`` test (``tests/test_<op>.py``).

Each example draws a shape (sizes 1 and odd sizes included), a dtype, a memory layout
for the input (contiguous, transposed, a slice with a row stride wider than the row,
every other row, a stride-0 broadcast), the op's parameters and masks, and whether the
kernels' long-row (chunked) path is forced by shrinking its limits (that, and the
masks and modes, are pytest parameters, so that every kernel path is covered). The kernels' output
and the gradients of every input are compared with ``triton_layers.reference`` run in
float64 on the same (rounded) inputs, by tests/oracle.py.

Bounded for CI: small sizes, a fixed number of examples, ``derandomize=True`` and no
example database, so every run draws the same examples (about a minute on 2 CPU cores
through the Triton interpreter, all ops).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from triton_layers import _checks

from .conftest import DEVICE, DTYPES


def bounded(max_examples: int):
    """Reproducible, deadline-free hypothesis settings for a slow (interpreted) op.

    No shrinking: through the interpreter it takes minutes; a failure prints its example
    as drawn (and a blob for ``@reproduce_failure``)."""
    return settings(
        max_examples=max_examples, deadline=None, derandomize=True, database=None, print_blob=True,
        phases=[Phase.explicit, Phase.generate],
        # (the function-scoped fixture is conftest's `looped`: one launch config for every example)
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


# --- inputs -----------------------------------------------------------------------------

# name -> (shape of the tensor to allocate for a view of `shape`, the view)
LAYOUTS: dict[str, tuple[Callable, Callable]] = {
    "contiguous": (lambda s: s, lambda b, s: b),
    "transposed": (lambda s: s[:-2] + (s[-1], s[-2]), lambda b, s: b.transpose(-1, -2)),
    "sliced": (lambda s: s[:-1] + (s[-1] + 5,), lambda b, s: b[..., 2:2 + s[-1]]),
    "every-other-row": (lambda s: (2 * s[0],) + s[1:], lambda b, s: b[::2]),
    "broadcast-rows": (lambda s: (1,) + s[1:], lambda b, s: b.expand(s)),
}
# A row that is one value repeated: only for ops whose result does not hinge on x - mean.
BROADCAST_LAST = ("broadcast-last", (lambda s: s[:-1] + (1,), lambda b, s: b.expand(s)))


def drawn(shape, dtype, layout, scale, shift, gen) -> torch.Tensor:
    """Random values of ``shape`` in a drawn layout: a leaf that is itself a strided view,
    so the op sees those strides and its gradient comes back in x's shape."""
    make, view = dict([*LAYOUTS.items(), BROADCAST_LAST])[layout]
    values = (torch.randn(make(tuple(shape)), generator=gen) * scale + shift * scale).to(dtype).to(DEVICE)
    x = view(values, tuple(shape)).requires_grad_()
    assert tuple(x.shape) == tuple(shape)
    return x


def layouts(ndim: int, broadcast_last: bool = False):
    names = ["contiguous", "sliced"] + (["transposed", "every-other-row", "broadcast-rows"] if ndim >= 2 else [])
    return st.sampled_from(names + ([BROADCAST_LAST[0]] if broadcast_last else []))


def param(n: int, dtype, gen, strided: bool, offset: float = 0.0) -> torch.Tensor:
    """A random parameter leaf: n values, or 2n with ``strided`` (the op gets ``view(leaf, strided)``)."""
    values = torch.randn(2 * n if strided else n, generator=gen) * 0.7 + offset
    return values.to(dtype).to(DEVICE).requires_grad_()


def view(leaf, strided: bool):
    """What the op gets of a ``param`` leaf: itself, or its stride-2 view."""
    return leaf[::2] if strided and leaf is not None else leaf


# The Triton interpreter (3.9) converts fp32 to bf16 by truncation, where the GPU rounds
# to nearest: bf16 results computed through it may be one ulp further off.
TRUNCATING_BF16 = _checks.TRITON_INTERPRET and DEVICE == "cpu"


@st.composite
def common(draw, min_dims: int = 1, max_dims: int = 3, max_n: int = 70):
    """Shape (leading dims 1-5, last dim 1-max_n), dtype, seed, value scale and shift.

    The kernel paths (looped or not, masks, ...) are pytest parameters of each test
    rather than draws: a fixed number of examples then covers every path."""
    lead = draw(st.lists(st.integers(1, 5), min_size=min_dims - 1, max_size=max_dims - 1))
    n = draw(st.one_of(st.sampled_from([1, 2, 7, 16, 17, 33, 64]), st.integers(1, max_n)))
    return dict(
        shape=tuple(lead) + (n,),
        dtype=draw(st.sampled_from(DTYPES)),
        gen=torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1))),
        scale=draw(st.sampled_from([0.05, 1.0, 20.0])),
        shift=draw(st.sampled_from([0.0, -2.0, 3.0])),
    )


def rows_of(shape) -> int:
    """How many rows a tensor of ``shape`` has (every dim but the last)."""
    return math.prod(shape[:-1])
