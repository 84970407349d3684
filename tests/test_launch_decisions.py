"""The launch decisions are what they were before the launch config went public (the knobs
in ``triton_layers/launch_config.py``, each op's heuristics beside it, the GPU passed as a
value), and GPU rules name whole names or model tokens.

``launch_decisions.json`` holds a fingerprint of every launch (kernel, grid, arguments after
the tensors, constexprs and options) of a forward and backward at each case of the cards'
``decisions`` (tests/training_cases.py): on meta tensors as on an H100, an H200, an A100 and an
RTX 4090, under the default and the tiny configs, and on CPU tensors in the Triton interpreter. They were recorded from 8ba01aa's
``kernels/_launch.py`` with its device lookups mocked as ``benchmarks/dev/registers.py`` did
then (SMs, shared memory, name; the name rules applied to meta tensors as to CUDA ones); the
same cases recorded there and here gave byte-identical JSON. A mismatch prints the launches
made now: to see the old ones, run this file's ``_record`` at that commit with those mocks.

Where a change of launches is meant (a knob's new default, a new heuristic: measured on the
GPUs first), record the file anew, from the repository's root, and commit it with the change::

    TRITON_INTERPRET=1 python -m tests.test_launch_decisions --record
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

from triton_layers import launch_config
from triton_layers.kernels import ops as K

from .conftest import H100, H200
from .training_cases import CARDS

EXPECTED = json.loads((Path(__file__).parent / "launch_decisions.json").read_text(encoding="utf-8"))
GPUS = {"H100": H100, "H200": H200,
        "A100": launch_config.GPU("NVIDIA A100-SXM4-80GB", sm_count=108, shared_memory=166912, capability=(8, 0)),
        "RTX4090": launch_config.GPU("NVIDIA GeForce RTX 4090", sm_count=128, shared_memory=101376, capability=(8, 9))}
CONFIGS = {"DEFAULT": launch_config.DEFAULT, "TINY": launch_config.TINY}


def _t(shape, dtype, device, grad=True):
    if device == "meta":
        t = torch.empty(shape, device="meta", dtype=dtype)
    else:
        g = torch.Generator().manual_seed(sum(shape) + len(shape))
        t = torch.randn(shape, generator=g).to(dtype)
    return t.requires_grad_(grad)


def _cases(device: str) -> dict:
    """label -> (op, a builder of its arguments), from every card's ``decisions``: the benchmarks'
    shapes and the limits around them on meta tensors, small ones on the CPU."""
    t = lambda shape, dtype: _t(shape, dtype, device)  # noqa: E731
    return {label: (card.kernel_op, build) for card in CARDS.values() if card.decisions
            for label, build in card.decisions(t, device == "meta").items()}


def _describe(launches: list) -> list:
    """JSON-able (kernel name, grid, arguments, keyword arguments) of recorded launches."""
    def value(v):
        if isinstance(v, torch.Tensor):
            return f"tensor {str(v.dtype)[6:]}"
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, torch.dtype):
            return str(v)
        return v
    return [[k.__name__, list(grid), [value(a) for a in args], sorted([n, value(v)] for n, v in kw.items())]
            for k, grid, args, kw in launches]


def _record(op: str, args: tuple) -> list:
    return _describe(getattr(K, op).record_launches(*args, grids=True))


# (the tiny config at the shapes whose chunked paths differ most)
TINY_SHAPES = ("x131072", "x1024 ", "4096x32768", "x40")


def _gpu_decisions(gpu: launch_config.GPU, config_name: str) -> dict:
    out = {}
    with launch_config.plan_as(gpu), launch_config.use_config(CONFIGS[config_name]):
        for label, (op, build) in _cases("meta").items():
            if config_name == "DEFAULT" or any(s in label for s in TINY_SHAPES):
                out[label] = _record(op, build())
    return out


def _fingerprint(decisions: list) -> str:
    return hashlib.sha256(json.dumps(decisions).encode()).hexdigest()[:16]


def _mismatches(prefix: str, decisions: dict) -> list:
    keys = {k for k in EXPECTED if k.startswith(prefix + " ")}
    assert keys == {f"{prefix} {label}" for label in decisions}, "the cases differ from the recorded ones"
    return [f"{prefix} {label}: now {json.dumps(d)}" for label, d in decisions.items()
            if _fingerprint(d) != EXPECTED[f"{prefix} {label}"]]


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("gpu_name", list(GPUS))
def test_gpu_launch_decisions_are_unchanged(gpu_name, config_name):
    bad = _mismatches(f"{gpu_name} {config_name}", _gpu_decisions(GPUS[gpu_name], config_name))
    assert not bad, "\n".join(bad[:5])


@pytest.mark.skipif(not launch_config.GPU.of(torch.device("cpu")).interpreted,
                    reason="recorded for CPU tensors in the Triton interpreter")
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_interpreter_launch_decisions_are_unchanged(config_name):
    with launch_config.use_config(CONFIGS[config_name]):
        decisions = {label: _record(op, build()) for label, (op, build) in _cases("cpu").items()}
    bad = _mismatches(f"cpu {config_name}", decisions)
    assert not bad, "\n".join(bad[:5])


def test_the_recorded_gpus_differ_where_their_rules_say():
    """The fingerprints are not all alike: an H200 runs bf16 whole rows of 8,192 forward at 4
    warps (fwd_4_warps_8192_gpus), an H100 the plain long-row forward in one pass
    (fwd_one_pass_gpus), an A100 and an RTX 4090 fewer prefetch stages (their shared memory)."""
    def key(gpu, label):
        return EXPECTED[f"{gpu} DEFAULT {label}"]
    assert key("H100", "layernorm 8192x8192 torch.bfloat16") != key("H200", "layernorm 8192x8192 torch.bfloat16")
    assert key("H100", "rmsnorm 1024x131072 torch.bfloat16") != key("H200", "rmsnorm 1024x131072 torch.bfloat16")
    assert key("H100", "add_rmsnorm 2048x4096 torch.float32") == key("H200", "add_rmsnorm 2048x4096 torch.float32")
    assert len({key(g, "add_rmsnorm 8192x8192 torch.float32") for g in ("H100", "A100", "RTX4090")}) == 3


def test_a_gh200_takes_the_fallback_not_the_h200_rule():
    """ "NVIDIA GH200 480GB" is not named by the "H200" of fwd_4_warps_8192_gpus (a whole-token
    rule; a substring rule matched it): it plans as every GPU no rule names does, with its own
    SMs and shared memory, and bf16 whole rows of 8,192 forward at 16 warps, where an H200 takes 4."""
    gh200 = launch_config.GPU("NVIDIA GH200 480GB", sm_count=132, shared_memory=232448, capability=(9, 0))
    unnamed = dataclasses.replace(gh200, name="a GPU no rule names")
    assert not gh200.named(("H200",)) and not gh200.named(("H100",)) and gh200.named(("GH200",))
    assert H200.named(("H200",)) and dataclasses.replace(H200, name="NVIDIA H200 NVL").named(("H200",))
    assert gh200.named(("NVIDIA GH200 480GB",))  # a whole name matches too
    assert _gpu_decisions(gh200, "DEFAULT") == _gpu_decisions(unnamed, "DEFAULT")
    label = "layernorm 8192x8192 torch.bfloat16"
    forward = {name: dict(_gpu_decisions(gpu, "DEFAULT")[label][0][3])["num_warps"]
               for name, gpu in (("GH200", gh200), ("H200", H200))}
    assert forward == {"GH200": 16, "H200": 4}


def test_a_cuda_device_is_queried_once(monkeypatch):
    """GPU.of asks CUDA about a device once and keeps the value (plans are kept per call
    signature, and a new signature's plan asks again: no query on that path)."""
    calls = []

    class Props:
        multi_processor_count = 7
        major, minor = 9, 0
        shared_memory_per_block_optin = 1234

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: (calls.append(index), Props())[1])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: (calls.append(index), "NVIDIA H100 PCIe")[1])
    launch_config._cuda_gpu.cache_clear()
    try:
        first = launch_config.GPU.of(torch.device("cuda", 3))
        assert launch_config.GPU.of(torch.device("cuda", 3)) is first
        assert len(calls) == 2  # (its properties and its name, once)
        assert (first.name, first.sm_count, first.device_type) == ("NVIDIA H100 PCIe", 7, "cuda")
        assert first.named(("H100",)) and not first.named(("H200",))
        with launch_config.plan_as(H200):  # meta and CUDA tensors planned as on another GPU
            assert launch_config.GPU.of(torch.device("cuda", 3)) is H200
            assert launch_config.GPU.of(torch.device("meta")) is H200
            assert launch_config.GPU.of(torch.device("cpu")).device_type == "cpu"  # (the interpreter's)
        assert launch_config.GPU.of(torch.device("cuda", 3)) is first and len(calls) == 2
    finally:
        launch_config._cuda_gpu.cache_clear()


def record() -> dict:
    """Every case's fingerprint, as ``launch_decisions.json`` holds them: each GPU under each
    config (meta tensors), and the CPU under each config (the Triton interpreter)."""
    out = {}
    for gpu_name, gpu in GPUS.items():
        for config_name in CONFIGS:
            for label, d in _gpu_decisions(gpu, config_name).items():
                out[f"{gpu_name} {config_name} {label}"] = _fingerprint(d)
    for config_name, config in CONFIGS.items():
        with launch_config.use_config(config):
            for label, (op, build) in _cases("cpu").items():
                out[f"cpu {config_name} {label}"] = _fingerprint(_record(op, build()))
    return dict(sorted(out.items()))


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--record"] or not launch_config.GPU.of(torch.device("cpu")).interpreted:
        sys.exit("usage: TRITON_INTERPRET=1 python -m tests.test_launch_decisions --record")
    path = Path(__file__).parent / "launch_decisions.json"
    path.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in record().items()) + "\n}\n",
                    encoding="utf-8")
    print(f"recorded {path}")
