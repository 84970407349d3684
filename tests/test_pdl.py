"""Programmatic dependent launch (PDL) in every kernel of ours (kernels/_pdl.py ``pdl_start``,
``_common.pdl``, ``LaunchConfig.pdl``): where it is on (eager launches on Hopper and newer),
where it is off (older GPUs, the interpreter, the knob or TRITON_LAYERS_PDL=0, the compiled
door), and on a Hopper GPU that it changes no result: the same bits with it on and off, back to
back on one stream, on a side stream and inside a CUDA graph."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from triton_layers import FP8Recipe, functional as F, launch_config
from triton_layers.kernels import ops as K
from triton_layers.calls.fast_launch import _FAST, KernelCall

from .conftest import H100
from .training_cases import CARDS

A100 = launch_config.GPU("NVIDIA A100-SXM4-80GB", sm_count=108, shared_memory=166912, capability=(8, 0))


def _meta(*shape, dtype=torch.bfloat16, grad=True):
    return torch.empty(shape, device="meta", dtype=dtype).requires_grad_(grad)


def _launches(gpu: launch_config.GPU, pdl: bool = True) -> list:
    """(kernel name, keyword arguments) of the eager launches of every op's forward and
    backward (the norms' at short and long rows) and an FP8 norm's, planned as on ``gpu``: the
    cards' ``pdl_launches``."""
    out = []
    config = dataclasses.replace(launch_config.current(), pdl=pdl)
    with launch_config.plan_as(gpu), launch_config.use_config(config):
        for card in CARDS.values():
            for op, args in card.pdl_launches(_meta) if card.pdl_launches else ():
                out += getattr(K, op).record_launches(*args)
    return [(kernel.__name__, kwargs) for kernel, _, kwargs in out]


def test_hopper_eager_launches_use_pdl():
    launches = _launches(H100)
    names = {name for name, _ in launches}
    assert {kernel for card in CARDS.values() for kernel in card.pdl_kernels} <= names
    for name, kwargs in launches:
        assert kwargs["USE_PDL"] is True and kwargs["launch_pdl"] is True, name


@pytest.mark.parametrize("gpu,pdl", [(A100, True), (H100, False)], ids=["pre_hopper", "knob_off"])
def test_pdl_off(gpu, pdl):
    for name, kwargs in _launches(gpu, pdl):
        assert kwargs["USE_PDL"] is False and "launch_pdl" not in kwargs, name


def test_the_compiled_door_launches_without_pdl():
    """wrap_triton is handed neither the launch option nor the wait (Inductor's mutation
    analysis would read the wait as a write to every argument: tests/test_compile_analysis.py)."""
    call = KernelCall(lambda: None, (1,), (), {"BLOCK": 4, "USE_PDL": True, "launch_pdl": True, "num_warps": 4}, 0)
    assert call._traced == {"BLOCK": 4, "USE_PDL": False, "num_warps": 4}
    assert call.constexprs["launch_pdl"] is True


def test_the_environment_switch_turns_it_off():
    code = "from triton_layers import launch_config as c; print(c.DEFAULT.pdl)"
    env = dict(os.environ, TRITON_LAYERS_PDL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert out.stdout.strip() == "False"
    assert launch_config.GPU("", 4, None, "cpu").has_pdl is False
    assert launch_config.GPU("x", 4, None, "cuda", interpreted=True, capability=(9, 0)).has_pdl is False
    assert H100.has_pdl and not A100.has_pdl


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def _steps(x, r, w, b):
    """Back-to-back kernels, each reading the one before's output: norm, fused add, FP8 norm
    of that, and the backward of the chain (its partial sums after the backward kernels)."""
    y = F.rms_norm(x, w)
    z, h = F.layer_norm(y, w, b, residual=r)
    q = F.rms_norm_fp8(z.detach(), w.detach(), recipe=FP8Recipe("per_tensor"))
    g = torch.randn_like(z, generator=torch.Generator(x.device).manual_seed(0))
    grads = torch.autograd.grad((z * g).sum() + h.float().square().sum(), (x, r, w, b))
    return (y, z, h, q.data.view(torch.uint8), q.scale, *grads)


@pytest.mark.skipif(not HOPPER, reason="programmatic dependent launch needs a Hopper GPU or newer")
@pytest.mark.parametrize("where", ["stream", "side_stream", "cuda_graph"])
def test_pdl_changes_no_result(where):
    torch.manual_seed(0)
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn_like(w, requires_grad=True)

    def run():
        if where == "stream":
            return _steps(x, r, w, b)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        if where == "side_stream":
            with torch.cuda.stream(s):
                out = _steps(x, r, w, b)
            torch.cuda.current_stream().wait_stream(s)
            return out
        with torch.no_grad():
            ys = (x.detach(), r.detach(), w.detach(), b.detach())
            with torch.cuda.stream(s):
                _forward(*ys)  # warm up (plans, compiled kernels) outside the capture
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = _forward(*ys)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            return out

    with launch_config.use_config(dataclasses.replace(launch_config.current(), pdl=False)):
        off = [t.clone() for t in run()]
    on = run()
    for a, b_ in zip(on, off):
        assert torch.equal(a, b_)
    # the eager launches went out with the attribute
    fwd = _FAST.get(next(k for k in _FAST if getattr(k, "__name__", "") == "_norm_fwd_kernel"))
    assert any(entry[2].metadata.launch_pdl for entry in fwd.compiled.values())


def _forward(x, r, w, b):
    """A forward chain with no autograd: ten fused adds, each on the one before's output."""
    h = x
    y = F.rms_norm(x, w)
    for _ in range(10):
        y, h = F.rms_norm(y, w, residual=h)
    q = F.rms_norm_fp8(y, w, recipe=FP8Recipe("per_token"), residual=h)
    return y, h, q.data.view(torch.uint8), q.scale
