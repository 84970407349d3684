"""triton_layers.convert on Hugging Face models whose norms are RMSNorms (Llama, Mistral,
Qwen2/3, Qwen3-MoE, Gemma, Gemma2/3, Phi3, Olmo2, Llama4, Mixtral, DeepSeek-V3), each built
tiny from its config (nothing is downloaded); every RMSNorm class transformers routes through
its kernel hook recognized; dtypes under autocast; and convert's report: what it replaced
(and would, with dry_run), which norms it did not know and left alone.

Each family keeps its own numerics (triton_layers/_families.py): Llama's rounds the
normalized value to the input's dtype before multiplying by the weight; Olmo2's multiplies
in fp32 and then casts; Gemma's multiplies by (1 + weight) in fp32 and then casts. Skipped
without transformers.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import triton_layers
from triton_layers import TritonRMSNorm

from .conftest import DEVICE
from .oracle import roundings_apart

transformers = pytest.importorskip("transformers")

# model -> (config class, model class, norm class, family of numerics, config beyond the common one)
_MOE = dict(num_experts_per_tok=2)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaRMSNorm", "llama", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralRMSNorm", "llama", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2RMSNorm", "llama", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "GemmaRMSNorm", "gemma", {"head_dim": 16}),
    # per-head q_norm/k_norm (rows of head_dim) besides the decoder's norms
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3RMSNorm", "llama", {"head_dim": 16}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "Qwen3MoeRMSNorm", "llama",
                  {"head_dim": 16, "num_experts": 4, "moe_intermediate_size": 32, **_MOE}),
    # pre and post norms, and (Gemma3) q/k norms
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "Gemma2RMSNorm", "gemma", {"head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3RMSNorm", "gemma", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "Phi3RMSNorm", "llama", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "Olmo2RMSNorm", "olmo2", {}),  # the product in fp32, then the cast
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", "Llama4TextRMSNorm", "llama",
               {"head_dim": 16, "num_local_experts": 4, "intermediate_size_mlp": 128, "interleave_moe_layer_step": 1,
                "num_experts_per_tok": 1}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "MixtralRMSNorm", "llama", {"num_local_experts": 4, **_MOE}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", "DeepseekV3RMSNorm", "llama",
                    {"moe_intermediate_size": 32, "n_routed_experts": 4, "n_group": 1, "topk_group": 1,
                     "first_k_dense_replace": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                     "qk_nope_head_dim": 8, "v_head_dim": 16, **_MOE}),
}
VOCAB = 128


def _model(family: str, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A 2-layer model of the family (hidden 64), its norm weights drawn away from their
    init (1 for Llama's and Olmo2's form, 0 for Gemma's) so that they count."""
    config_cls, model_cls, _, numerics, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if numerics == "gemma" else 1.0, 0.3)
    return model.to(DEVICE, dtype)


def _norm_class(family: str) -> type:
    return getattr(transformers, FAMILIES[family][1]).__module__, FAMILIES[family][2]


def _logits_and_grads(model, ids):
    logits = model(ids).logits
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(logits.float().square().mean(), list(params.values()))
    return logits.detach(), dict(zip(params, grads))


MIXTURES = ("qwen3_moe", "llama4", "mixtral", "deepseek_v3")


def _each_norm_matches(original: nn.Module, converted: nn.Module, ids, norm_cls: type) -> None:
    """Every norm of ``original`` and its replacement in ``converted`` on the input the
    original met in a forward of ``ids``: the same dtype, and the same values to within one
    rounding of the output's dtype (bit for bit on nearly every element on a GPU; the
    interpreter truncates each bf16 rounding, two of them in Llama's form)."""
    inputs = {}
    hooks = [m.register_forward_hook(lambda m, a, y, name=name: inputs.__setitem__(name, a[0]))
             for name, m in original.named_modules() if type(m) is norm_cls]
    with torch.no_grad():
        original(ids)
    for h in hooks:
        h.remove()
    assert inputs
    with torch.no_grad():
        for name, x in inputs.items():
            want, got = original.get_submodule(name)(x), converted.get_submodule(name)(x)
            assert got.dtype == want.dtype, f"{name}: {got.dtype}, expected {want.dtype}"
            ulps = 1 if DEVICE == "cuda" else 2
            near = roundings_apart(got, want, x.dtype, ulps, floor=1e-6 if x.dtype == torch.float32 else 0.0)
            bad = (~near).float().mean().item()
            assert bad == 0, f"{name}: {bad:.2%} of the elements differ by more than {ulps} ulp"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_convert_hf_model(family, dtype):
    original = _model(family, dtype)
    norm_cls = type(original.model.norm)
    numerics = FAMILIES[family][3]
    assert norm_cls.__name__ == FAMILIES[family][2]
    n_norms = sum(type(m) is norm_cls for m in original.modules())
    converted, summary = triton_layers.convert(copy.deepcopy(original), return_summary=True)
    # every one (2 or 4 a layer, q/k norms, the final one) as its family; none of the original
    # class remains; keys unchanged.
    assert dict(summary.replaced) == {norm_cls.__name__: n_norms} and not summary.left_alone
    assert summary.families == {norm_cls.__name__: numerics}
    assert not any(isinstance(m, norm_cls) for m in converted.modules())
    assert sum(isinstance(m, TritonRMSNorm) for m in converted.modules()) == n_norms
    assert list(converted.state_dict()) == list(original.state_dict())
    assert converted.model.norm.cast_before_weight == (numerics == "llama")
    assert converted.model.norm.unit_offset == (numerics == "gemma")

    ids = torch.randint(0, VOCAB, (2, 16), device=DEVICE)
    _each_norm_matches(original, converted, ids, norm_cls)
    want_logits, want_grads = _logits_and_grads(original, ids)
    got_logits, got_grads = _logits_and_grads(converted, ids)
    assert got_logits.dtype == want_logits.dtype
    # fp32: the norms agree to a few ulps. bf16: they agree bit for bit on nearly every
    # element on the GPU (the interpreter truncates to bf16, one ulp); the logits inherit that,
    # except through a router: one ulp can send a token to another expert, so mixtures of
    # experts in bf16 are judged by each norm alone (above).
    if dtype == torch.bfloat16 and family in MIXTURES:
        return
    scale = want_logits.float().abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else (2e-2 if DEVICE == "cuda" else 6e-2)
    torch.testing.assert_close(got_logits.float(), want_logits.float(), rtol=0, atol=tol * scale)
    for name, want in want_grads.items():
        got, g_scale = got_grads[name], want.float().abs().max().item() or 1.0
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol * 5 * g_scale,
                                   msg=lambda m: f"{name}: {m}")

    # The converted state_dict loads strictly into a fresh, unconverted model: same logits.
    fresh = _model(family, dtype, seed=1)
    fresh.load_state_dict(converted.state_dict(), strict=True)
    assert torch.equal(fresh(ids).logits, want_logits)


def _swapped_pair(family: str, weight_dtype: torch.dtype, use_triton):
    module_name, class_name = _norm_class(family)
    import importlib

    hf_cls = getattr(importlib.import_module(module_name), class_name)
    hf = hf_cls(64, eps=1e-6).to(DEVICE, weight_dtype)
    with torch.no_grad():
        hf.weight.normal_(0.0 if FAMILIES[family][3] == "gemma" else 1.0, 0.3)
    ours = triton_layers.convert(nn.Sequential(copy.deepcopy(hf)), use_triton=use_triton)[0]
    assert isinstance(ours, TritonRMSNorm)
    return hf, ours


@pytest.mark.parametrize("path", ["kernels", "reference"])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["bf16_weight", "fp32_weight"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_swapped_norm_bitwise_bf16(family, weight_dtype, path):
    """A bf16 input through the swapped norm and through the original class: the same
    output dtype, bit-identical values on nearly every element and one ulp at most
    elsewhere (the kernels in the interpreter truncate each rounding to bf16, Llama's
    two of them: two ulps), matching gradients."""
    hf, ours = _swapped_pair(family, weight_dtype, use_triton=None if path == "kernels" else False)
    x = (torch.randn(64, 64, device=DEVICE) * 3).bfloat16().requires_grad_()
    want, got = hf(x), ours(x)
    assert got.dtype == want.dtype  # Llama's fp32 weight makes an fp32 output, as in torch
    equal = (got == want).float().mean().item()
    roundings = 1  # (Llama's fp32 output: of the bf16 rounding)
    if path == "reference" or DEVICE == "cuda":
        assert equal >= 0.99, f"only {equal:.1%} of the elements are bit-identical"
    else:
        roundings = 2
    assert roundings_apart(got, want, torch.bfloat16, roundings).all()
    dy = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (x, ours.weight), dy), torch.autograd.grad(want, (x, hf.weight), dy)):
        scale = b.float().abs().max().item()
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=2e-2 * scale)


def test_convert_reports_and_leaves_unknown_norms():
    class T5LayerNorm(nn.Module):  # a norm convert does not know
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return x * self.weight

    llama_norm = getattr(transformers.models.llama.modeling_llama, "LlamaRMSNorm")

    class MyRMSNorm(llama_norm):  # w * x before the rsqrt: no family's roundings, left alone
        def forward(self, x):
            xf = x.float()
            scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (self.weight * xf * scale).to(x.dtype)

    class SameRMSNorm(llama_norm):  # a subclass computing what Llama's does: replaced, as llama
        pass

    class GatedRMSNorm(llama_norm):  # a second input: not a norm we replace
        def forward(self, x, gate=None):
            return super().forward(x if gate is None else x * gate)

    shared = nn.RMSNorm(8)
    model = nn.Sequential(T5LayerNorm(), MyRMSNorm(8), shared, nn.Linear(8, 8), shared, llama_norm(8),
                          SameRMSNorm(8), GatedRMSNorm(8))
    dry = triton_layers.convert(model, dry_run=True)  # changes nothing, says what would change
    assert type(model[1]) is MyRMSNorm and isinstance(model[2], nn.RMSNorm) and type(model[5]) is llama_norm
    with pytest.warns(UserWarning, match="GatedRMSNorm, MyRMSNorm, T5LayerNorm"):
        model, summary = triton_layers.convert(model, return_summary=True)
    assert str(dry) == "would replace" + str(summary).removeprefix("replaced").replace("; left", "; would leave")
    assert dict(summary.replaced) == {"RMSNorm": 1, "LlamaRMSNorm": 1, "SameRMSNorm": 1}
    assert dict(summary.left_alone) == {"T5LayerNorm": 1, "MyRMSNorm": 1, "GatedRMSNorm": 1}
    assert type(model[0]).__name__ == "T5LayerNorm" and type(model[1]) is MyRMSNorm
    assert model[2] is model[4] and isinstance(model[2], TritonRMSNorm)  # still one shared module
    assert isinstance(model[6], TritonRMSNorm) and model[6].cast_before_weight
    assert str(summary) == ("replaced 1 LlamaRMSNorm (llama), 1 RMSNorm (rms_norm), 1 SameRMSNorm (llama); "
                            "left alone (unknown norms): 1 GatedRMSNorm, 1 MyRMSNorm, 1 T5LayerNorm")


def test_convert_reports_what_it_did_and_a_dry_run_what_it_would_do(caplog):
    """One wording, in ConversionSummary: a dry run says "would replace" (it said "replaced 2
    ..." having replaced nothing), and both log that line (logger triton_layers, INFO) that
    they return; a plain convert prints nothing (a library's report is for logging to show)."""
    def model():
        return nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.RMSNorm(8))

    m = model()
    with caplog.at_level("INFO", logger="triton_layers"):
        dry = triton_layers.convert(m, dry_run=True)
    assert isinstance(m[0], nn.LayerNorm) and isinstance(m[2], nn.RMSNorm)  # nothing replaced
    assert str(dry) == "would replace 1 LayerNorm (layer_norm), 1 RMSNorm (rms_norm)" and dry.dry_run
    assert [r.getMessage() for r in caplog.records] == [f"triton_layers.convert: {dry}"]
    caplog.clear()
    with caplog.at_level("INFO", logger="triton_layers"):
        m, summary = triton_layers.convert(m, return_summary=True)
    assert str(summary) == "replaced 1 LayerNorm (layer_norm), 1 RMSNorm (rms_norm)" and not summary.dry_run
    assert [r.getMessage() for r in caplog.records] == [f"triton_layers.convert: {summary}"]
    assert dict(summary.replaced) == dict(dry.replaced) and summary.families == dry.families
    # Nothing to replace: said so, in both moods.
    assert str(triton_layers.convert(nn.Linear(8, 8), dry_run=True)) == "would replace nothing"
    assert str(triton_layers.convert(nn.Linear(8, 8), return_summary=True)[1]) == "replaced nothing"


def test_llama_rounds_before_the_weight():
    """Llama's fp16 input with an fp32 weight gives an fp32 output whose only rounding is
    the normalized value's to fp16 (the interpreter rounds to fp16 as the GPU does): bit
    for bit on nearly every element, which a product taken in fp32 alone would miss."""
    hf, ours = _swapped_pair("llama", torch.float32, use_triton=None)
    x = (torch.randn(64, 64, device=DEVICE) * 3).half()
    want, got = hf(x), ours(x)
    assert want.dtype == got.dtype == torch.float32
    assert (got == want).float().mean().item() >= 0.99
    no_cast = hf.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6))
    assert (no_cast == want).float().mean().item() < 0.9


def test_converted_norms_leave_traced_calls_to_inductor(monkeypatch):
    """convert marks its layers torch_ops_when_compiled: a traced call without a residual takes
    torch ops (Inductor then fuses the model's residual add and casts into its norm kernel),
    eager calls and calls with a residual keep the kernels' path, and use_triton=True keeps
    the kernels when traced too. Layers built directly are not marked."""
    from triton_layers.layers import _compiled

    llama_norm = getattr(transformers.models.llama.modeling_llama, "LlamaRMSNorm")
    model = triton_layers.convert(nn.Sequential(nn.LayerNorm(8), nn.RMSNorm(8), llama_norm(8)))
    forced = triton_layers.convert(nn.Sequential(nn.RMSNorm(8)), use_triton=True)
    assert all(m.torch_ops_when_compiled for m in [*model, *forced])
    assert "torch_ops_when_compiled=True" in repr(model[0]) and "torch_ops_when_compiled=True" in repr(model[2])
    direct = [triton_layers.TritonLayerNorm(8), TritonRMSNorm(8)]
    assert not any(m.torch_ops_when_compiled for m in direct)
    residual = torch.randn(2, 8)
    monkeypatch.setattr(_compiled, "tracing", lambda: True)
    assert [_compiled.use_triton_for(m, None) for m in model] == [False, False, False]
    assert [_compiled.use_triton_for(m, residual) for m in model] == [None, None, None]
    assert _compiled.use_triton_for(forced[0], None) is True
    assert [_compiled.use_triton_for(m, None) for m in direct] == [None, None]
    monkeypatch.setattr(_compiled, "tracing", lambda: False)
    assert [_compiled.use_triton_for(m, None) for m in model] == [None, None, None]


@pytest.mark.parametrize("residual", [False, True])
def test_torch_ops_path_normalizes_the_input_as_it_is(residual):
    """The torch-ops path (what a converted norm hands Inductor) puts no reshape to rows
    around the norm: on a GPU one kept Inductor from fusing the backward's row sums with the
    dx that reads them (a converted Llama's compiled step ran 14 more kernels than the
    original's, two per decoder layer)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from triton_layers import functional as F

    x, r, w = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8)

    def norm(x, r, w):
        return F.rms_norm(x, w, 1e-6, residual=r if residual else None, use_triton=False)

    graph = make_fx(norm)(x, r, w).graph
    ops = [str(node.target) for node in graph.nodes if node.op == "call_function"]
    assert not [op for op in ops if "view" in op or "reshape" in op], ops


def _custom_ops_in_compiled_graph(model: nn.Module, ids: torch.Tensor) -> int:
    """Calls of triton_layers' custom ops in the graph torch.compile captures of ``model(ids)``."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture)(ids)  # (graph breaks inside transformers would only add graphs)
    torch._dynamo.reset()
    return sum("triton_layers" in str(node.target) for gm in graphs for node in gm.graph.nodes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernels' custom ops are traced on a GPU only")
def test_converted_llama_compiles_its_norms_as_torch_ops():
    """A converted Llama under torch.compile: no custom op of ours in the graph (Inductor generates
    the norms, as for the unconverted model); converted with use_triton=True, one per norm."""
    ids = torch.randint(0, VOCAB, (2, 16), device=DEVICE)
    model = triton_layers.convert(_model("llama", torch.bfloat16))
    assert _custom_ops_in_compiled_graph(model, ids) == 0
    forced = triton_layers.convert(_model("llama", torch.bfloat16), use_triton=True)
    assert _custom_ops_in_compiled_graph(forced, ids) == 5  # 2 layers x 2 norms + the final norm


class _LlamaScale(nn.Module):
    """A norm of a user's own code with Llama's numerics, not named like a norm: convert does
    not run it on its probes, so it does not know it until it is registered."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(d))
        self.variance_epsilon = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class _GemmaScale(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(0.3 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


@pytest.mark.parametrize("cls, family", [(_LlamaScale, "llama"), (_GemmaScale, "gemma")])
def test_register_norm_teaches_convert_a_class(cls, family, monkeypatch):
    """register_norm(cls, family): convert replaces that class (and only it) with a layer
    computing the same; unknown families and non-modules are refused."""
    from triton_layers import conversion

    monkeypatch.setattr(conversion, "_REGISTERED", {})
    model = nn.Sequential(nn.Linear(24, 24), cls(24), nn.Linear(24, 24)).to(DEVICE)
    assert not triton_layers.convert(copy.deepcopy(model), return_summary=True)[1].replaced
    triton_layers.register_norm(cls, family)
    converted, summary = triton_layers.convert(copy.deepcopy(model), return_summary=True)
    assert summary.replaced == {cls.__name__: 1} and isinstance(converted[1], TritonRMSNorm)
    x = torch.randn(3, 5, 24, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        got, want = converted[1](x), model[1](x)
    # the family's numerics: bitwise in bf16 on a GPU; the interpreter truncates each bf16
    # rounding (two ulps at most: see test_swapped_norm_bitwise_bf16)
    assert got.dtype == want.dtype and roundings_apart(got, want, torch.bfloat16, 0 if DEVICE == "cuda" else 2).all()
    converted.load_state_dict(model.state_dict())  # same names
    with pytest.raises(ValueError, match="family"):
        triton_layers.register_norm(cls, "bert")
    with pytest.raises(TypeError, match="nn.Module"):
        triton_layers.register_norm(int, "llama")
    assert triton_layers.register_norm(family="llama")(cls) is cls  # as a decorator


def _hub_rms_norm_classes() -> list[tuple[str, str]]:
    """(module, class) of every class transformers' modeling code decorates with
    ``@use_kernel_forward_from_hub("RMSNorm")`` (read from the source: without the ``kernels``
    package the decorator leaves no mark on the class)."""
    import glob
    import os
    import re

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    found = []
    for path in sorted(glob.glob(os.path.join(root, "*", "modeling_*.py"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in re.finditer(r'use_kernel_forward_from_hub\("RMSNorm"\)\s*\nclass (\w+)\(', text):
            package = os.path.basename(os.path.dirname(path))
            found.append((f"transformers.models.{package}.{os.path.basename(path)[:-3]}", m.group(1)))
    return found


def test_every_rms_norm_transformers_routes_to_kernels_is_recognized():
    """Every class transformers routes through its kernel hook for "RMSNorm" computes one of
    our families, and convert's probe says which: 144 classes in transformers 5.24 (130 of
    Llama's form, 14 of Olmo2's). A class that computes otherwise would be named here."""
    import importlib

    from triton_layers._families import family_of

    classes = _hub_rms_norm_classes()
    assert len(classes) >= 50, f"found only {len(classes)} decorated RMSNorm classes: has the source moved?"
    unknown, families = [], {}
    for module_name, name in classes:
        cls = getattr(importlib.import_module(module_name), name)
        family = family_of(cls(16))
        families[name] = family
        if family is None:
            unknown.append(name)
    assert not unknown, f"convert would leave these RMSNorms alone: {unknown}"
    for name, family in (("LlamaRMSNorm", "llama"), ("Qwen3RMSNorm", "llama"), ("Olmo2RMSNorm", "olmo2"),
                         ("DeepseekV3RMSNorm", "llama"), ("MixtralRMSNorm", "llama")):
        assert families.get(name) == family, f"{name}: {families.get(name)}, expected {family}"


def _norm_output_dtypes(model: nn.Module, run) -> dict:
    """The dtype each norm-like module (by name) writes in ``run()``."""
    seen = {}
    hooks = [m.register_forward_hook(lambda m, a, y, name=name: seen.__setitem__(name, y.dtype))
             for name, m in model.named_modules() if "Norm" in type(m).__name__]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _bert(dtype: torch.dtype = torch.float32) -> nn.Module:
    """A post-norm model: BERT's LayerNorm output is the residual stream."""
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.BertModel(config).eval().to(DEVICE, dtype)


def _torch_rms() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 64), nn.RMSNorm(64), nn.Linear(64, 64)).to(DEVICE)


@pytest.mark.parametrize("family", ["bert", "torch_rms", "llama", "gemma2", "olmo2"])
def test_converted_norms_write_the_originals_dtypes_under_autocast(family):
    """Under autocast with fp32 parameters (what the Trainer's bf16=True does), each converted
    norm writes the dtype the module it replaced wrote: nn.LayerNorm float32 under CUDA
    autocast (the input's dtype under the CPU's), Hugging Face's RMSNorms their own. With
    fast_autocast=True they write autocast's dtype (bf16) instead."""
    original = {"bert": _bert, "torch_rms": _torch_rms}.get(family, lambda: _model(family, torch.float32))()
    ids = torch.randint(0, VOCAB, (2, 16), device=DEVICE)

    def dtypes(model):
        def run():
            with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
                model(ids)
        return _norm_output_dtypes(model, run)

    want = dtypes(original)
    assert want and torch.float32 in set(want.values())  # (some fp32: a wrong rule can fail)
    assert dtypes(triton_layers.convert(copy.deepcopy(original))) == want
    fast = dtypes(triton_layers.convert(copy.deepcopy(original), fast_autocast=True))
    assert set(fast) == set(want) and set(fast.values()) == {torch.bfloat16}


def test_output_under_autocast_is_checked():
    norm = TritonRMSNorm(8)
    norm.output_under_autocast = "bf16"
    with pytest.raises(ValueError, match="'autocast', 'torch', 'unchanged'"):
        norm(torch.randn(2, 8, device=DEVICE))


def _layer_norm_model(name: str) -> tuple[nn.Module, dict]:
    """A config-built nn.LayerNorm model (BERT, ViT, Whisper) and one batch of its inputs."""
    torch.manual_seed(0)
    if name == "bert":
        return _bert(), {"input_ids": torch.randint(0, VOCAB, (2, 16), device=DEVICE)}
    if name == "vit":
        config = transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, image_size=32, patch_size=8)
        model = transformers.ViTModel(config)
        inputs = {"pixel_values": torch.randn(2, 3, 32, 32, device=DEVICE)}
    else:
        config = transformers.WhisperConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                            num_mel_bins=16, max_source_positions=32, max_target_positions=32,
                                            vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                            decoder_start_token_id=1)
        model = transformers.WhisperModel(config)
        inputs = {"input_features": torch.randn(2, 16, 64, device=DEVICE),
                  "decoder_input_ids": torch.randint(0, VOCAB, (2, 8), device=DEVICE)}
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)
    return model.eval().to(DEVICE), inputs


@pytest.mark.parametrize("name", ["bert", "vit", "whisper"])
def test_layer_norm_models_keep_converting(name):
    """Every nn.LayerNorm of a config-built BERT, ViT and Whisper becomes a TritonLayerNorm
    (bias included, names unchanged): the same outputs, and the state_dict loads back strictly."""
    from triton_layers import TritonLayerNorm

    original, inputs = _layer_norm_model(name)
    n_norms = sum(isinstance(m, nn.LayerNorm) for m in original.modules())
    converted, summary = triton_layers.convert(copy.deepcopy(original), return_summary=True)
    assert n_norms and dict(summary.replaced) == {"LayerNorm": n_norms} and not summary.left_alone
    assert sum(isinstance(m, TritonLayerNorm) for m in converted.modules()) == n_norms
    with torch.no_grad():
        want, got = original(**inputs).last_hidden_state, converted(**inputs).last_hidden_state
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    original.load_state_dict(converted.state_dict(), strict=True)
