"""triton_layers.hub.RMSNorm through the ``kernels`` package, as transformers' kernel hook
uses it: config-built Llama and Qwen3 kernelized with our mapping train as the originals
(logits and every gradient), and compile on a GPU. Skipped without kernels or transformers."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from .conftest import DEVICE
from .oracle import roundings_apart
from .test_convert_norms import VOCAB, _logits_and_grads
from .test_convert_norms import _model as config_built

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

MODELS = ("llama", "qwen3")  # (config-built as tests/test_convert_norms.py builds them)


def _model(name: str) -> torch.nn.Module:
    return config_built(name, torch.float32)


def _kernelized(model: torch.nn.Module, monkeypatch, mode) -> torch.nn.Module:
    """``model`` kernelized with our mapping. Its RMSNorm classes are marked as transformers'
    decorator marks them (``kernel_layer_name``) where that decorator is inactive: transformers
    5.24 activates it only with kernels >= 0.18.2."""
    import triton_layers.hub

    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and getattr(type(m), "kernel_layer_name", None) is None:
            monkeypatch.setattr(type(m), "kernel_layer_name", "RMSNorm", raising=False)
    with warnings.catch_warnings():  # (transformers' hook off: marked by hand above, as the warning says)
        warnings.simplefilter("ignore", UserWarning)
        mapping = triton_layers.hub.kernel_mapping()
    with kernels.use_kernel_mapping(mapping):
        return kernels.kernelize(model, mode=mode, device=DEVICE)


@pytest.mark.parametrize("name", list(MODELS))
def test_kernelized_model_trains_as_the_original(name, monkeypatch):
    import triton_layers.hub

    original = _model(name)
    ours = _kernelized(copy.deepcopy(original), monkeypatch, kernels.Mode.TRAINING)
    norms = [m for m in ours.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(m.forward.__func__ is triton_layers.hub.RMSNorm.forward for m in norms)
    ids = torch.randint(0, VOCAB, (2, 16), device=DEVICE)
    want_logits, want_grads = _logits_and_grads(original, ids)
    got_logits, got_grads = _logits_and_grads(ours, ids)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5 * want_logits.abs().max().item())
    for n, want in want_grads.items():
        torch.testing.assert_close(got_grads[n], want, rtol=0, atol=1e-4 * (want.abs().max().item() or 1.0),
                                   msg=lambda m: f"{n}: {m}")
    assert list(ours.state_dict()) == list(original.state_dict())


def test_the_mapping_warns_where_transformers_hook_is_off(monkeypatch):
    """With a kernels version transformers does not take (the README's recipe, kernels 0.17 beside
    transformers 5.24), kernelize would leave every norm as it is: the mapping says so, naming
    the versions; with the hook on, or transformers not imported, it says nothing."""
    import sys

    from transformers.utils import import_utils

    import triton_layers.hub as hub

    for available in (False, True):
        monkeypatch.setattr(import_utils, "is_kernels_available", lambda *a, available=available: available)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert hub.kernel_mapping() == {"RMSNorm": {"cuda": hub.Repository(), "cpu": hub.Repository()}}
        said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        if available:
            assert not said and hub.transformers_hook_off() is None
        else:
            assert len(said) == 1 and "kernels.kernelize leaves every Hugging Face norm" in said[0], said
            assert f">={import_utils.KERNELS_MIN_VERSION},<{import_utils.KERNELS_MAX_VERSION}" in said[0]
            assert f"kernels {kernels.__version__} is installed" in said[0]
    monkeypatch.setenv("USE_HUB_KERNELS", "NO")  # (transformers' own switch, the hook off with any version)
    assert "USE_HUB_KERNELS turns transformers' kernel hook off" in hub.transformers_hook_off()
    monkeypatch.delitem(sys.modules, "transformers")
    assert hub.transformers_hook_off() is None


def test_the_layer_follows_the_rules_of_kernels():
    """No constructor, no members but can_torch_compile and has_backward (kernels checks this
    when it loads a layer), both True; a class computing no family keeps its forward."""
    import triton_layers.hub as hub

    assert hub.RMSNorm.__init__ is torch.nn.Module.__init__
    assert hub.RMSNorm.can_torch_compile and hub.RMSNorm.has_backward

    class OddNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.eps = 1e-6

        def forward(self, x):
            return x * self.weight  # not a norm of any family

    x = torch.randn(2, 8, device=DEVICE)
    odd = OddNorm().to(DEVICE)
    torch.testing.assert_close(hub.rms_norm_forward(odd, x), odd(x))


@pytest.mark.skipif(DEVICE != "cuda", reason="our kernels compile on a GPU only (the interpreter cannot be traced)")
@pytest.mark.parametrize("name", list(MODELS))
def test_kernelized_model_compiles(name, monkeypatch):
    original = _model(name)
    ours = _kernelized(copy.deepcopy(original), monkeypatch, kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE)
    ids = torch.randint(0, VOCAB, (2, 16), device=DEVICE)
    want_logits, want_grads = _logits_and_grads(original, ids)
    ours.compile()  # (in place: the parameters keep their names, no _orig_mod. prefix)
    got_logits, got_grads = _logits_and_grads(ours, ids)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-4 * want_logits.abs().max().item())
    for n, want in want_grads.items():
        torch.testing.assert_close(got_grads[n], want, rtol=0, atol=1e-3 * (want.abs().max().item() or 1.0))


@pytest.mark.parametrize("module_name, class_name", [("llama", "LlamaRMSNorm"), ("olmo2", "Olmo2RMSNorm"),
                                                     ("gemma3", "Gemma3RMSNorm"), ("qwen3", "Qwen3RMSNorm")])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["fp32_weight", "bf16_weight"])
def test_the_layer_computes_its_hosts_family(module_name, class_name, weight_dtype):
    """In a host of each family, a bf16 input: the host's own dtype (Llama's fp32 weight makes
    fp32; Olmo2's and Gemma's write bf16) and its values within one rounding (two in the
    interpreter, which truncates each bf16 rounding)."""
    import importlib

    import triton_layers.hub as hub

    cls = getattr(importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}"), class_name)
    host = cls(64, eps=1e-6).to(DEVICE, weight_dtype)
    with torch.no_grad():
        host.weight.normal_(0.0 if "Gemma" in class_name else 1.0, 0.3)
    x = (3 * torch.randn(16, 64, device=DEVICE)).bfloat16()
    with torch.no_grad():
        want, got = host(x), hub.rms_norm_forward(host, x)
    assert got.dtype == want.dtype
    ulps = 1 if DEVICE == "cuda" else 2
    assert roundings_apart(got, want, torch.bfloat16, ulps).all()
