"""Every op launches on its tensors' device and that device's current stream, whatever
the current device is, and captures and replays in a CUDA graph in eager mode (forward
and backward). GPU only: the non-current-device tests need two GPUs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import pytest
import torch

from triton_layers import CoordinateDescentRouter, launch_config
from triton_layers import functional as F

from .training_cases import CARDS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _leaf(*shape, device, grad=True):
    return torch.randn(shape, device=device).requires_grad_(grad)


def _router(dev):
    router = CoordinateDescentRouter(64, n_iters=8).to(dev)
    mask = torch.rand(2, 40, device=dev) > 0.1

    def fn(x):
        out = router(x, num_tokens=10, mask=mask)
        return out.routed_tokens * out.scores[..., None]

    return [_leaf(2, 40, 64, device=dev)], fn


# name -> builder(device) of (leaves, fn(*leaves) -> output); fresh random inputs each call: the
# cards' on_device (tests/training_cases.py), and the router
CASES: dict[str, Callable] = {**{card.name: card.on_device for card in CARDS.values() if card.on_device},
                              "router": _router}


def _out_and_grads(leaves, fn, dy=None):
    y = fn(*leaves)
    if dy is None:
        dy = torch.randn_like(y)
    return [y, *torch.autograd.grad(y, leaves, dy)], dy


@needs_two
@pytest.mark.parametrize("name", list(CASES))
def test_op_runs_on_a_device_that_is_not_current(name):
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    leaves0, fn0 = CASES[name]("cuda:0")
    torch.manual_seed(0)
    leaves1, fn1 = CASES[name]("cuda:1")
    want, dy = _out_and_grads(leaves0, fn0)
    got, _ = _out_and_grads(leaves1, fn1, dy.to("cuda:1"))
    assert torch.cuda.current_device() == 0
    for g, w in zip(got, want):
        assert g.device == torch.device("cuda:1")
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=0, atol=0)  # same GPU model: bitwise


@needs_two
def test_inputs_on_two_devices_name_both():
    x = torch.randn(4, 16, device="cuda:0")
    w = torch.randn(16, device="cuda:1")
    for card in CARDS.values():
        if card.two_devices:
            call, message = card.two_devices
            with pytest.raises(ValueError, match=message):
                call(x, w)


@needs_cuda
@pytest.mark.parametrize("name", list(CASES))
def test_op_runs_on_the_current_stream(name):
    """On a side stream that is busy with earlier work, the op waits for it (stream order)."""
    leaves, fn = CASES[name]("cuda")
    want, dy = _out_and_grads(leaves, fn)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000)  # ~1 ms of work ahead of the op on this stream
        inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
        got, _ = _out_and_grads(inputs, fn, dy)
    torch.cuda.current_stream().wait_stream(side)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@needs_cuda
@pytest.mark.parametrize("name", list(CASES))
def test_op_captures_and_replays_in_a_cuda_graph(name):
    leaves, fn = CASES[name]("cuda")
    static = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    dy = torch.randn_like(fn(*static))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile) off the capturing stream
        for _ in range(2):
            _out_and_grads(static, fn, dy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, _ = _out_and_grads(static, fn, dy)
    for _ in range(2):
        with torch.no_grad():
            for s in static:
                s.copy_(torch.randn_like(s) if s.dim() > 1 else s * 0.9 + 0.1)
        graph.replay()
        torch.cuda.synchronize()
        want, _ = _out_and_grads([s.detach().clone().requires_grad_() for s in static], fn, dy)
        for g, w in zip(static_out, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


# The norm backward's prefetch at fp32 rows of 8,192 columns: z and dy (64 KB a stage), and
# dh with a residual (96 KB). Shared memory a program may use: H100/H200, A100, RTX 4090/L4, T4.
STAGE_CASES = [(232448, 64, 3), (232448, 96, 3), (166912, 64, 3), (166912, 96, 2), (101376, 64, 2),
               (101376, 96, 1), (65536, 64, 1)]


@pytest.fixture
def shared_memory():
    """``shared_memory(limit)``: the launches on this GPU are planned as on one whose programs
    may use ``limit`` bytes of shared memory (``launch_config.plan_as``), until the test ends."""
    with contextlib.ExitStack() as stack:
        def limit_to(limit: int) -> None:
            gpu = launch_config.GPU.of(torch.device("cuda", torch.cuda.current_device()))
            stack.enter_context(launch_config.plan_as(dataclasses.replace(gpu, shared_memory=limit)))

        yield limit_to


@pytest.mark.parametrize("limit,kib,stages", STAGE_CASES)
def test_prefetch_stages_fit_the_devices_shared_memory(limit, kib, stages):
    """Triton keeps stages - 1 tiles of every prefetched load in shared memory and refuses the
    launch past the device's limit: the default 3 stages fit an H100, not an A100 with a
    residual nor an RTX 4090, so the launcher takes fewer there."""
    from triton_layers.kernels._layer_norm_rules import prefetch_stages

    scratch = launch_config.DEFAULT.layer_norm.bwd_reduction_scratch_bytes
    gpu = launch_config.GPU("a GPU", sm_count=132, shared_memory=limit)
    got = prefetch_stages(3, kib * 1024, gpu, scratch)
    assert got == stages
    assert (got - 1) * kib * 1024 + scratch <= limit
    # the interpreter, or a limit nobody reported: as asked
    assert prefetch_stages(3, kib * 1024, launch_config.GPU.of(torch.device("cpu")), scratch) == 3
    assert prefetch_stages(3, kib * 1024, dataclasses.replace(gpu, shared_memory=None), scratch) == 3


@needs_cuda
@pytest.mark.parametrize("limit", [101376, 65536], ids=["99KB", "64KB"])
@pytest.mark.parametrize("residual", [False, True])
def test_norm_backward_with_fewer_prefetch_stages(shared_memory, limit, residual):
    """The backward kernels the launcher picks on a GPU with less shared memory (fewer
    prefetch stages) give the reference's gradients: fp32 rows of 8,192 columns."""
    from triton_layers import reference

    shared_memory(limit)
    x, r, w = _leaf(37, 8192, device="cuda"), _leaf(37, 8192, device="cuda"), _leaf(8192, device="cuda")
    dy = torch.randn(37, 8192, device="cuda")
    kwargs = dict(residual=r) if residual else {}
    out = F.rms_norm(x, w, 1e-6, **kwargs)
    y = out[0] + out[1] if residual else out
    leaves = [x, r, w] if residual else [x, w]
    got = torch.autograd.grad(y, leaves, dy)
    ref = reference.norm(x, w, None, 1e-6, rms=True, **kwargs)
    want = torch.autograd.grad(ref[0] + ref[1] if residual else ref, leaves, dy)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
