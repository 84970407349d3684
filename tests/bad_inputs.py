"""The "Bad inputs" tables' helpers (docs/API.md: one table in each op's section, its rows' ids
the test ids). Each op's test file lists its rows as ``BAD_INPUTS``, a :class:`Case` per row,
and its modules' bad constructor values as ``BAD_CONFIGS``, and runs them with
:func:`tests_of` and :func:`config_tests_of`; ``tests/test_bad_inputs.py`` keeps the tables and
the cases of every file in step. No op is named here: a new op's rows live in its own file."""
from __future__ import annotations

from typing import Callable, NamedTuple, Union

import pytest
import torch

from .conftest import DEVICE

# A second device for mixed-device calls: "meta" where the kernels run on the CPU.
OTHER = "meta" if DEVICE == "cpu" else "cpu"


class Case(NamedTuple):
    """One row of a "Bad inputs" table: its id, the call, and what it gets."""

    id: str
    call: Callable[[], object]
    # (exception type, regex of its message) or a check of the result (raises if wrong).
    expect: Union[tuple, Callable[[object], None]]


def run(case: Case) -> None:
    """The row's call raises its exception with a message matching its pattern, or its result
    passes its check."""
    if isinstance(case.expect, tuple):
        exc, pattern = case.expect
        with pytest.raises(exc, match=pattern):
            case.call()
    else:
        case.expect(case.call())


def tests_of(cases: list[Case]) -> Callable:
    """A test of each row of ``cases`` (the row's id is the test's), for a test file to bind as
    ``test_bad_input``."""
    @pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])
    def test_bad_input(case: Case) -> None:
        run(case)
    return test_bad_input


def config_tests_of(configs: list[tuple]) -> Callable:
    """A test of each ``(module, args, kwargs, exception type, pattern)``: building the module
    raises it; for a test file to bind as ``test_bad_module_config``."""
    @pytest.mark.parametrize("module,args,kwargs,exc,pattern", configs,
                             ids=[f"{m.__name__}-{','.join(k) or a[0]!r}" for m, a, k, *_ in configs])
    def test_bad_module_config(module, args, kwargs, exc, pattern) -> None:
        with pytest.raises(exc, match=pattern):
            module(*args, **kwargs)
    return test_bad_module_config


def x_(*shape, dtype=torch.float32, device=DEVICE, grad=False) -> torch.Tensor:
    """A random tensor of ``shape`` (drawn in fp32, then cast)."""
    return torch.randn(shape, device=device).to(dtype).requires_grad_(grad)


def mask_(*shape, device=DEVICE) -> torch.Tensor:
    """A random bool mask, about 70% True."""
    return torch.rand(shape, device=device) > 0.3


def w8(device=DEVICE) -> torch.Tensor:
    """A random weight of 8."""
    return torch.randn(8, device=device)


def same_as_contiguous(op: Callable, *shape_t) -> tuple:
    """(call, check) of a row checking that ``op(x)`` on a transposed view equals ``op`` on its
    contiguous copy, bitwise, in the output and in x's gradient."""
    def call():
        x = x_(*shape_t).transpose(-1, -2)
        assert not x.is_contiguous()
        grads = []
        for inp in (x, x.contiguous()):
            inp = inp.detach().requires_grad_()
            y = op(inp)
            y.backward(torch.ones_like(y))
            grads.append((y.detach(), inp.grad))
        return grads

    def check(grads):
        (y1, g1), (y2, g2) = grads
        assert torch.equal(y1, y2) and torch.equal(g1, g2)
    return call, check


def empty_result(shape: tuple, grad_shape: tuple | None = None) -> Callable:
    """Check: the result has ``shape``; its backward gives x a gradient of ``grad_shape``."""
    def check(result):
        y, x = result
        assert tuple(y.shape) == shape
        y.sum().backward()
        assert x.grad is not None and tuple(x.grad.shape) == (grad_shape or tuple(x.shape))
    return check


def with_x(op: Callable, x: torch.Tensor) -> tuple:
    """``(op(x), x)`` for a fresh leaf copy of ``x``."""
    x = x.detach().requires_grad_()
    return op(x), x


def check_like_torch(pairs) -> None:
    """Each (ours, torch's) pair: same dtype, close values."""
    for ours, torchs in pairs:
        assert ours.dtype == torchs.dtype
        torch.testing.assert_close(ours, torchs)
