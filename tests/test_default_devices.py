"""Every default device and dtype (issue 46 item 4): what users build under
``torch.set_default_device(...)``, ``with torch.device(...):`` and ``torch.set_default_dtype``.

- ``convert`` recognizes Hugging Face's RMSNorms whatever the default device: its family probe
  (``_families.family_of``) runs on CPU copies. A CUDA default device made the probe draw
  with a CPU generator on CUDA (a RuntimeError for every model); meta is the same class of
  bug on a CPU-only machine (tensors created where the default device says), so the meta
  cases run everywhere and the CUDA ones where there is a GPU. A model built on meta,
  converted, then ``to_empty``'d and loaded computes what the unconverted model does.
- Our modules built under a default device put their parameters where torch's would, and
  meta init, ``to_empty``, ``reset_parameters()`` (FSDP2's and torchtitan's way) gives
  exactly the initial values of a module built directly (torch's layer where ours replaces one).
"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

import triton_layers
from triton_layers import CausalSoftmax, CoordinateDescentRouter, TritonLayerNorm, TritonRMSNorm, WeightedSum
from triton_layers._families import family_of

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# (how, device): torch.set_default_device around the block, or `with torch.device(...)`.
DEVICE_SETUPS = [
    pytest.param("set", "meta", id="set_default_device-meta"),
    pytest.param("with", "meta", id="with_device-meta"),
    pytest.param("set", "cuda", id="set_default_device-cuda", marks=needs_cuda),
    pytest.param("with", "cuda", id="with_device-cuda", marks=needs_cuda),
]


@contextlib.contextmanager
def default_device(how: str, device: str):
    """``device`` as the default device inside the block, set as ``how`` says ("set" or "with")."""
    if how == "with":
        with torch.device(device):
            yield
        return
    before = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None if before == torch.device("cpu") else before)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


# --- convert: the family probe and a small Hugging Face Llama --------------------------------

transformers = pytest.importorskip("transformers")
VOCAB = 64


def _llama() -> nn.Module:
    """A 1-layer Llama (hidden 32: three LlamaRMSNorms), built where the default device says,
    its norm weights drawn away from their init (ones) so that they count."""
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    return model


def _llama_norm(device=None) -> nn.Module:
    return transformers.models.llama.modeling_llama.LlamaRMSNorm(16, eps=1e-6).to(device)


@pytest.mark.parametrize("how,device", DEVICE_SETUPS)
@pytest.mark.parametrize("built_on", ["cpu", "default"])
def test_family_probe_ignores_the_default_device(how, device, built_on):
    """A norm built on the CPU, or on the default device itself (meta: no values at all), is
    told as Llama's under any default device, and the probe leaves the device as it was."""
    norm = _llama_norm() if built_on == "cpu" else None
    with default_device(how, device):
        if norm is None:
            norm = _llama_norm()
            assert norm.weight.device.type == device
        assert family_of(norm) == "llama"
        assert torch.empty(1).device.type == device  # (the default device is back)


def test_family_probe_ignores_the_default_dtype():
    with default_dtype(torch.float64):
        assert family_of(_llama_norm()) == "llama"
        assert torch.empty(1).dtype == torch.float64


def _converted_under(how: str, device: str):
    """Build a Llama and convert it under the default device: (unconverted copy, converted, summary)."""
    with default_device(how, device):
        model = _llama()
        original = copy.deepcopy(model)
        converted, summary = triton_layers.convert(model, return_summary=True)
    assert dict(summary.replaced) == {"LlamaRMSNorm": 3} and not summary.left_alone
    assert summary.families == {"LlamaRMSNorm": "llama"}
    norms = [m for m in converted.modules() if isinstance(m, TritonRMSNorm)]
    assert len(norms) == 3 and all(m.weight.device.type == device and m.cast_before_weight for m in norms)
    return original, converted


def _logits_close(got: nn.Module, want: nn.Module, device) -> None:
    ids = torch.randint(0, VOCAB, (2, 8), device=device)
    with torch.no_grad():
        g, w = got(ids).logits, want(ids).logits
    torch.testing.assert_close(g, w, rtol=0, atol=1e-5 * w.abs().max().item())


@pytest.mark.parametrize("how,device", [p for p in DEVICE_SETUPS if p.values[1] == "cuda"])
def test_convert_under_a_cuda_default_device(how, device):
    original, converted = _converted_under(how, device)
    _logits_close(converted, original, device)


@pytest.mark.parametrize("how", ["set", "with"])
def test_convert_a_model_built_on_meta(how):
    """Built on meta, converted, to_empty'd on the CPU, then loaded: our norms in the model,
    computing what the unconverted model computes, and bit for bit what the model converted on
    the CPU computes."""
    _, converted = _converted_under(how, "meta")
    converted.to_empty(device="cpu")
    want = _llama()  # (the same weights, on the CPU)
    converted.load_state_dict(want.state_dict(), strict=True)
    # Non-persistent buffers (the rotary inv_freq) are not in a state_dict: a meta-built model
    # computes them again after to_empty (torchtitan's init_weights); here they are copied.
    with torch.no_grad():
        for name, buf in want.named_buffers():
            converted.get_buffer(name).copy_(buf)
    _logits_close(converted, want, "cpu")
    on_cpu = triton_layers.convert(copy.deepcopy(want))
    ids = torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, on_cpu(ids).logits)


# --- modules built under a default device or dtype -----------------------------------------

# name -> (ours, what torch would build in its place, or None where ours replaces nothing of torch)
MODULES = {
    "layer_norm": (lambda: TritonLayerNorm(8), lambda: nn.LayerNorm(8)),
    "layer_norm_no_bias": (lambda: TritonLayerNorm((2, 4), bias=False), lambda: nn.LayerNorm((2, 4), bias=False)),
    "rms_norm": (lambda: TritonRMSNorm(8), lambda: nn.RMSNorm(8)),
    "rms_norm_unit_offset": (lambda: TritonRMSNorm(8, unit_offset=True), None),
    "weighted_sum": (lambda: WeightedSum(8, bias=True), lambda: nn.Linear(8, 1)),
    "router": (lambda: CoordinateDescentRouter(8, num_routing_tokens=2, n_iters=3), None),
    "softmax": (lambda: CausalSoftmax(), None),
}


@pytest.mark.parametrize("how,what", [*DEVICE_SETUPS, pytest.param("dtype", torch.float64, id="default_dtype-float64")])
@pytest.mark.parametrize("name", list(MODULES))
def test_parameters_go_where_torchs_go(name, how, what):
    """Each parameter on the device and in the dtype of nn.LayerNorm's built in the same setup."""
    ours, _ = MODULES[name]
    with (default_dtype(what) if how == "dtype" else default_device(how, what)):
        module, oracle = ours(), nn.LayerNorm(8).weight
    params = list(module.parameters())
    assert len(params) == (0 if name == "softmax" else 1 if name in ("rms_norm", "rms_norm_unit_offset", "router",
                                                                      "layer_norm_no_bias") else 2)
    for p in params:
        assert (p.device, p.dtype) == (oracle.device, oracle.dtype)


@pytest.mark.parametrize("name", [n for n in MODULES if n != "softmax"])
def test_meta_init_then_reset_gives_the_initial_values(name):
    """FSDP2's and torchtitan's way: built on meta, to_empty on the device, reset_parameters():
    exactly the values of the module built directly under the same seed (torch's layer's where
    ours replaces one: nn.Linear(8, 1)'s draws for WeightedSum)."""
    ours, theirs = MODULES[name]
    with torch.device("meta"):
        module = ours()
    module.to_empty(device="cpu")
    torch.manual_seed(1)
    module.reset_parameters()
    torch.manual_seed(1)
    fresh = ours()
    torch.manual_seed(1)
    reference = theirs() if theirs is not None else None
    got = module.state_dict()
    assert got.keys() == fresh.state_dict().keys()
    for key, value in fresh.state_dict().items():
        assert torch.equal(got[key], value), key
    if reference is not None:
        for key, value in reference.state_dict().items():
            assert torch.equal(got[key], value.reshape(got[key].shape)), key


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_built_on_meta_run_on_meta(name):
    """Shape inference on meta (what a meta-built model's dry run does): the reference runs."""
    ours, _ = MODULES[name]
    with torch.device("meta"):
        module = ours()
        x = torch.randn(2, 5, 8)
        scores = torch.randn(2, 5, 5)
    if name == "router":
        out = module(x, num_tokens=2)
        assert out.routed_tokens.shape == (2, 2, 2, 8) and out.routed_tokens.device.type == "meta"
        return
    y = module(scores if name == "softmax" else x.reshape(2, 5, 2, 4) if name == "layer_norm_no_bias" else x)
    assert y.device.type == "meta"
