"""triton_layers.hub.RMSNorm through the ``kernels`` package, as transformers' kernel hook
uses it: config-built Llama and Qwen3 kernelized with our mapping train as the originals
(logits and every gradient), and compile on a GPU. Skipped without kernels or transformers."""
from __future__ import annotations

import copy

import pytest
import torch

from .conftest import DEVICE

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

MODELS = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
          "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16})}


def _model(name: str) -> torch.nn.Module:
    config_cls, model_cls, extra = MODELS[name]
    config = getattr(transformers, config_cls)(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.3)
    return model.to(DEVICE)


def _kernelized(model: torch.nn.Module, monkeypatch, mode) -> torch.nn.Module:
    """``model`` kernelized with our mapping. Its RMSNorm classes are marked as transformers'
    decorator marks them (``kernel_layer_name``) where that decorator is inactive: transformers
    5.24 activates it only with kernels >= 0.18.2."""
    import triton_layers.hub

    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and getattr(type(m), "kernel_layer_name", None) is None:
            monkeypatch.setattr(type(m), "kernel_layer_name", "RMSNorm", raising=False)
    with kernels.use_kernel_mapping(triton_layers.hub.kernel_mapping()):
        return kernels.kernelize(model, mode=mode, device=DEVICE)


def _step(model, ids):
    logits = model(ids).logits
    params = dict(model.named_parameters())
    return logits.detach(), dict(zip(params, torch.autograd.grad(logits.float().square().mean(), list(params.values()))))


@pytest.mark.parametrize("name", list(MODELS))
def test_kernelized_model_trains_as_the_original(name, monkeypatch):
    import triton_layers.hub

    original = _model(name)
    ours = _kernelized(copy.deepcopy(original), monkeypatch, kernels.Mode.TRAINING)
    norms = [m for m in ours.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all(m.forward.__func__ is triton_layers.hub.RMSNorm.forward for m in norms)
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    want_logits, want_grads = _step(original, ids)
    got_logits, got_grads = _step(ours, ids)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5 * want_logits.abs().max().item())
    for n, want in want_grads.items():
        torch.testing.assert_close(got_grads[n], want, rtol=0, atol=1e-4 * (want.abs().max().item() or 1.0),
                                   msg=lambda m: f"{n}: {m}")
    assert list(ours.state_dict()) == list(original.state_dict())


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
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    want_logits, want_grads = _step(original, ids)
    got_logits, got_grads = _step(torch.compile(ours), ids)
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
    assert ((got.float() - want.float()).abs() <= ulps * torch.finfo(torch.bfloat16).eps * want.float().abs()).all()
