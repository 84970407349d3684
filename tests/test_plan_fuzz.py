"""A fuzz test of the eager door's plan caches: random sequences of calls per op, each checked
against float64, with every planned call re-planned and compared (the plan check).

A sequence varies, call after call, what a plan could wrongly bake in: dtypes, sizes (1 and
multiples of 16 beside odd ones), the main input's layout (row-strided, not 16-byte
aligned), the grad mode, autocast, the launch config, saved-tensor hooks that relay
(``save_on_cpu``), re-lay or misalign the saved tensors, in-place writes to the inputs
between calls, a second backward (``retain_graph``); on a GPU also CUDA-graph replay, a side
stream and a second GPU where there is one. Seeded: a failure names its seed and step, and
replays. ``TRITON_LAYERS_FUZZ_STEPS`` (default 10 a sequence) and ``TRITON_LAYERS_FUZZ_SEEDS``
(default 2) make a larger run (the GPU run before a release, with memcheck: ``scripts/fuzz_plans.sh``).
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

from triton_layers import launch_config
from triton_layers.calls import eager as _eager

from .test_training_setups import HOOKS, under
from .training_cases import LAYOUTS, OPS, check_grads, make, plain_run, rel_err, tolerance

STEPS = int(os.environ.get("TRITON_LAYERS_FUZZ_STEPS", "10"))
SEEDS = range(int(os.environ.get("TRITON_LAYERS_FUZZ_SEEDS", "2")))
GPU = torch.cuda.is_available()
SIZES = [(1, 16), (16, 16), (7, 24), (3, 5), (2, 33)] + ([(64, 160), (16, 1024)] if GPU else [])


def _choice(gen, options):
    return options[int(torch.randint(len(options), (), generator=gen))]


def _run_in(setting: str, device: str):
    """How a step runs its forward and backward: plainly, under hooks, twice (retain_graph),
    on a side stream, or (on a GPU) captured in a CUDA graph and replayed."""
    if setting in HOOKS:
        return under(HOOKS[setting])
    if setting == "retain_graph":
        def run(fn, inputs, dy):
            leaves = [t for t in inputs if t.requires_grad]
            y = fn(*inputs)
            first = torch.autograd.grad(y, leaves, dy.to(y.dtype), retain_graph=True)
            second = torch.autograd.grad(y, leaves, dy.to(y.dtype))
            for a, b in zip(first, second):
                assert torch.equal(a, b)
            return y, second
        return run
    if setting == "side_stream":
        def run(fn, inputs, dy):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                y, grads = plain_run(fn, inputs, dy)
            torch.cuda.current_stream(device).wait_stream(stream)
            return y, grads
        return run
    if setting == "cuda_graph":
        def run(fn, inputs, dy):
            leaves = [t for t in inputs if t.requires_grad]
            static = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
            s = torch.cuda.Stream(device)
            s.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(s):  # warm up outside the graph (plans, compiles)
                plain_run(fn, static, dy)
            torch.cuda.current_stream(device).wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y, grads = plain_run(fn, static, dy)
            with torch.no_grad():
                for a, b in zip(static, inputs):
                    a.copy_(b)
            graph.replay()
            assert len(grads) == len(leaves)
            return y, grads
        return run
    return plain_run


def _settings(device):
    base = ["plain", "plain", "save_on_cpu", "restrided", "misaligned", "retain_graph"]
    # (graph capture needs torch's caching allocator, which a memory checker's run turns off)
    graphs = ["cuda_graph"] if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1" else []
    return base + (["side_stream", *graphs] if GPU else [])


def _devices(device):
    if GPU and torch.cuda.device_count() > 1:
        return [device, "cuda:1"]
    return [device]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", OPS)
def test_random_call_sequences_match_float64(name, seed, device):
    gen = torch.Generator().manual_seed(1000 * seed + OPS.index(name))
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if name != "coor_descent" else [])
    configs = [launch_config.DEFAULT, launch_config.TINY]
    with _eager.checking_plans():
        for step in range(STEPS):
            dtype, layout = _choice(gen, dtypes), _choice(gen, list(LAYOUTS))
            rows, cols = _choice(gen, SIZES)
            dev = _choice(gen, _devices(device))
            setting = _choice(gen, _settings(device))
            grad_mode = _choice(gen, [True, True, False])
            autocast = name.endswith("norm") and _choice(gen, [False, False, True])
            config = _choice(gen, configs)
            where = f"seed {seed} step {step}: {dtype} {layout} {rows}x{cols} {dev} {setting} grad={grad_mode} " \
                    f"autocast={autocast} config={'TINY' if config is launch_config.TINY else 'DEFAULT'}"
            ours, exact, inputs = make(name, dev, dtype, layout, gen, rows=rows, cols=cols)
            amp = torch.autocast(torch.device(dev).type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
            with launch_config.use_config(config), amp:
                if not grad_mode:
                    with torch.no_grad():
                        got = ours(*inputs)
                    err = rel_err(got, exact(*inputs))
                    assert err <= max(tolerance(name, dtype), 3e-2 if autocast else 0), f"{where}: output {err:.3g}"
                    continue
                try:
                    check_grads(name, torch.bfloat16 if autocast else dtype, ours, exact, inputs, gen,
                                run=_run_in(setting, dev))
                except AssertionError as err:
                    raise AssertionError(f"{where}: {err}") from None
                if _choice(gen, [False, True]):  # an in-place write to an input, then the same call again
                    with torch.no_grad():
                        inputs[0].mul_(-1.5)
                    check_grads(name, torch.bfloat16 if autocast else dtype, ours, exact, inputs, gen)
