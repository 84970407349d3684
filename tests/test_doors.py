"""Both doors of every op give the same results, bitwise: the torch.library custom op
(what torch.compile traces) and the eager autograd.Function, both built by
``kernels/_doors.py`` from one description per op. Also: the descriptions themselves
(every gradient is named after an input that exists) and the launch-config switch.
"""
from __future__ import annotations

import pytest
import torch

from triton_layers.kernels import _launch
from triton_layers.kernels import ops as kernel_ops
from triton_layers.kernels._launch import use_config as launch_config

from .conftest import SMALL


def _r(*shape, device, dtype=torch.float32, grad=True):
    return torch.randn(shape, device=device).to(dtype).requires_grad_(grad)


# op name -> a builder of its 2-D inputs (in the description's order) on a device.
CASES = {
    "layer_norm": lambda dev: (_r(6, 300, device=dev), _r(300, device=dev), _r(300, device=dev), 1e-5, True),
    "layer_norm-no-bias": lambda dev: (_r(5, 70, device=dev, dtype=torch.bfloat16), _r(70, device=dev), None,
                                       1e-5, False),
    "softmax": lambda dev: (_r(30, 70, device=dev, dtype=torch.bfloat16), torch.rand(2, 70, device=dev) > 0.7,
                            5, 15, True, 0.6),
    "weighted_sum": lambda dev: (_r(9, 300, device=dev), _r(300, device=dev), _r(device=dev)),
    "coor_descent": lambda dev: (_r(4, 700, device=dev), torch.rand(4, 700, device=dev) > 0.2,
                                 (torch.rand(4, device=dev) * 50 + 2).requires_grad_(), 0.0, 20, 0.03, 4.0, 0.7),
}


def _run(fn, args):
    """fn(*args) and the gradients of every tensor argument that requires one, for a fixed dy."""
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    y = fn(*args)
    gen = torch.Generator(device=y.device).manual_seed(1)
    dy = torch.randn(y.shape, device=y.device, generator=gen).to(y.dtype)
    return [y.detach(), *torch.autograd.grad(y, leaves, dy)]


@pytest.mark.parametrize("looped", [False, True], ids=["fused", "looped"])
@pytest.mark.parametrize("case", list(CASES))
def test_custom_op_door_matches_eager_door(case, looped, device):
    op = getattr(kernel_ops, case.split("-")[0])
    args = CASES[case](device)
    with launch_config(SMALL if looped else _launch.DEFAULT):
        eager = _run(op.function.apply, args)
        # The custom op returns the outputs and the statistics kept for the backward.
        compiled = _run(lambda *a: op.forward_op(*a)[0] if len(op.desc.residuals) else op.forward_op(*a), args)
    assert len(eager) == len(compiled) > 1
    for a, b in zip(eager, compiled):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("name", ["layer_norm", "softmax", "weighted_sum", "coor_descent"])
def test_descriptions_are_consistent(name):
    desc = getattr(kernel_ops, name).desc
    inputs = [n for n, _ in desc.inputs]
    assert set(desc.differentiable) <= set(inputs)
    assert len(set(inputs)) == len(inputs)
    # The custom ops' schemas were made from the descriptions.
    fwd = getattr(torch.ops.triton_layers, f"{name}_fwd").default._schema
    assert [a.name for a in fwd.arguments] == inputs
    assert len(fwd.returns) == len(desc.outputs) + len(desc.residuals)
    bwd = getattr(torch.ops.triton_layers, f"{name}_bwd").default._schema
    assert len(bwd.returns) == len(desc.differentiable)


def test_gradient_reaches_only_its_own_input(device):
    """With only the weight needing a gradient, it arrives there and nowhere else."""
    x, w = _r(7, 40, device=device, grad=False), _r(40, device=device)
    b = _r(40, device=device, grad=False)
    y = kernel_ops.layer_norm(x, w, b, 1e-5, False)
    y.backward(torch.randn_like(y))
    assert w.grad is not None and x.grad is None and b.grad is None


def test_use_config_switches_and_restores():
    assert _launch.current() is _launch.DEFAULT
    with _launch.use_config(_launch.TINY) as cfg:
        assert _launch.current() is cfg is _launch.TINY
        assert _launch.row_block(17, cfg.layer_norm.bwd_max_fused_cols, cfg.layer_norm.loop_block)[1] is False
    assert _launch.current() is _launch.DEFAULT
    with pytest.raises(TypeError, match="LaunchConfig"):
        with _launch.use_config({"loop_block": 8}):
            pass
    with pytest.raises(Exception):
        _launch.DEFAULT.layer_norm.loop_block = 8  # frozen
