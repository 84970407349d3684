"""Every default device and dtype: what users build under
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
- float64 (a default dtype, ``module.double()``), which torch's layers take: every op and
  module gives torch's answer and gradients through the reference (the kernels compute in
  fp32), ``use_triton=True`` on it is a ValueError, and the eager door's plans never hand a
  float64 call a kernel plan.
"""
from __future__ import annotations

import contextlib
import copy

import warnings

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import triton_layers
from triton_layers import CausalSoftmax, CoordinateDescentRouter, TritonRMSNorm
from triton_layers import functional as F
from triton_layers._checks import KERNELS
from triton_layers._families import family_of
from triton_layers.calls.eager import OP_ROUTERS, checking_plans

from .conftest import DEVICE, spy_main_inputs
from .training_cases import CARDS, causal_softmax as _causal, f64_leaf as _f64, rows

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

# name -> (ours, what torch would build in its place or None, how many parameters, a run on meta
# (module, x of (2, 5, 8), scores of (2, 5, 5)) -> output): the cards' default_modules
MODULES = rows("default_modules")


@pytest.mark.parametrize("how,what", [*DEVICE_SETUPS, pytest.param("dtype", torch.float64, id="default_dtype-float64")])
@pytest.mark.parametrize("name", list(MODULES))
def test_parameters_go_where_torchs_go(name, how, what):
    """Each parameter on the device and in the dtype of nn.LayerNorm's built in the same setup."""
    ours, _, n_params, _ = MODULES[name]
    with (default_dtype(what) if how == "dtype" else default_device(how, what)):
        module, oracle = ours(), nn.LayerNorm(8).weight
    params = list(module.parameters())
    assert len(params) == n_params
    for p in params:
        assert (p.device, p.dtype) == (oracle.device, oracle.dtype)


@pytest.mark.parametrize("name", [n for n, (_, _, n_params, _) in MODULES.items() if n_params])
def test_meta_init_then_reset_gives_the_initial_values(name):
    """FSDP2's and torchtitan's way: built on meta, to_empty on the device, reset_parameters():
    exactly the values of the module built directly under the same seed (torch's layer's where
    ours replaces one: nn.Linear(8, 1)'s draws for a weighted sum)."""
    ours, theirs, _, _ = MODULES[name]
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
    ours, _, _, run = MODULES[name]
    with torch.device("meta"):
        module = ours()
        x = torch.randn(2, 5, 8)
        scores = torch.randn(2, 5, 5)
    assert run(module, x, scores).device.type == "meta"


# --- float64: torch's answer, through the reference ---------------------------------------

F64 = torch.float64


# name -> (inputs, ours(*inputs, use_triton=...), torch's definition(*inputs)); small shapes
# (gradcheck): the cards' float64 cases (tests/training_cases.py)
OPS = rows("float64")


@pytest.mark.parametrize("use_triton", [None, False], ids=["auto", "reference"])
@pytest.mark.parametrize("name", list(OPS))
def test_float64_gives_torchs_answer(name, use_triton):
    make, ours, theirs = OPS[name]
    inputs = make()
    got, want = ours(*inputs, use_triton=use_triton), theirs(*inputs)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    dys = [torch.randn_like(w) for w in want]
    for g, w in zip(got, want):
        assert g.dtype == F64
        torch.testing.assert_close(g, w)
    for g, w in zip(torch.autograd.grad(got, inputs, dys), torch.autograd.grad(want, inputs, dys)):
        torch.testing.assert_close(g, w)


# (not the 1e-6 rows: gradcheck's finite differences are as large as they are)
@pytest.mark.parametrize("name", [n for n in OPS if n != "rms_norm_default_eps"])
def test_float64_gradcheck(name):
    make, ours, _ = OPS[name]
    assert torch.autograd.gradcheck(lambda *t: ours(*t), make())


@pytest.mark.parametrize("name", list(OPS))
def test_float64_with_use_triton_true_is_a_value_error(name):
    make, ours, _ = OPS[name]
    inputs = make()
    assert not F.uses_kernels(inputs[0])
    with pytest.raises(ValueError, match=r"use_triton=True cannot compute in torch\.float64 \((x|s) has dtype"):
        ours(*inputs, use_triton=True)


# an fp32 x with one float64 argument: (the call, the argument named in the error); the cards'
# mixed_float64
MIXED = rows("mixed_float64")


@pytest.mark.parametrize("name", list(MIXED))
def test_a_float64_argument_beside_fp32_takes_the_reference(name):
    """use_triton=True names the float64 argument; use_triton=None gives the reference's result,
    in the op's usual output dtype (x's, or out_dtype's where given)."""
    call, argument = MIXED[name]
    x, w = torch.randn(3, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    with pytest.raises(ValueError, match=rf"use_triton=True cannot compute in torch\.float64 \({argument} has"):
        call(x, w, use_triton=True)
    got, want = call(x, w, use_triton=None), call(x, w, use_triton=False)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert got[0].dtype == (F64 if name == "out_dtype" else torch.float32)
    for g, r in zip(got, want):
        assert g.dtype == r.dtype and torch.equal(g, r)


def test_mixed_float64_rms_norm_is_torchs():
    """torch's rms_norm takes an fp32 x with a float64 weight (nn.LayerNorm and nn.Linear refuse
    mixed dtypes): the statistics in fp32, the product in float64, rounded to x's dtype."""
    x, w = torch.randn(3, 8, device=DEVICE), torch.randn(8, dtype=F64, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's "Mismatch dtype between input and weight")
        want = TF.rms_norm(x, (8,), w)
    got = F.rms_norm(x, w)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    x64 = x.double()
    torch.testing.assert_close(F.rms_norm(x64, w.float()), TF.rms_norm(x64, (8,), w.float()))


# each kernel op's first float64 case (in the cards' order) -> the kernel op
PLANNED_F64 = {}
for _card in CARDS.values():
    if _card.kernel_op and _card.float64 and _card.kernel_op not in PLANNED_F64.values():
        PLANNED_F64[next(iter(_card.float64))] = _card.kernel_op


@pytest.mark.skipif(KERNELS is None, reason="needs Triton")
@pytest.mark.parametrize("name", list(PLANNED_F64))
def test_float64_never_gets_a_kernel_plan(name, monkeypatch):
    """The eager door keys its plans by each tensor's dtype: an fp32 call of a shape plans a
    kernel launch, a float64 call of the same shape then goes through the route and returns
    the reference's result, with no launch and no plan of its own; while plans are checked too."""
    make, ours, theirs = OPS[name]
    inputs = [t.detach() for t in make()]
    op = PLANNED_F64[name]
    eager = OP_ROUTERS["norm" if "norm" in op else op]
    seen = spy_main_inputs(monkeypatch, getattr(KERNELS, op))
    if DEVICE == "cuda" or F.uses_kernels(inputs[0].float()):
        ours(*[t.float() for t in inputs])
        assert len(seen) == 1 and any(key[0][3] == torch.float32 for key in eager.plans)  # (planned)
    seen.clear()
    for checked in (False, True):
        with checking_plans(checked):
            got, ref, want = ours(*inputs), ours(*inputs, use_triton=False), theirs(*inputs)
        for g, r, w in zip(*((got, ref, want) if isinstance(got, tuple) else ((got,), (ref,), (want,)))):
            assert g.dtype == F64 and torch.equal(g, r)
            torch.testing.assert_close(g, w)
    assert not seen
    assert not any(part is F64 or (isinstance(part, tuple) and F64 in part) for key in eager.plans for part in key)


# torch's layer(dim) (its parameters drawn at random) -> ours(dim, **kwargs), loaded from its
# state_dict, and torch's output as ours gives it: the cards' float64_modules
MODULES_F64 = rows("float64_modules")


@pytest.mark.parametrize("how", ["double", "default_dtype"])
@pytest.mark.parametrize("name", list(MODULES_F64))
def test_float64_modules_match_torchs(name, how):
    """A float64 module (``.double()``, or built under a float64 default dtype) on float64
    input: torch's layer's output and gradients; under CPU autocast still float64 (autocast
    casts no float64 tensor); ``use_triton=True`` is a ValueError."""
    make_theirs, make_ours, as_ours = MODULES_F64[name]
    with (default_dtype(F64) if how == "default_dtype" else contextlib.nullcontext()):
        theirs, ours = make_theirs(8).to(DEVICE), make_ours(8, device=DEVICE)
    if how == "double":
        theirs, ours = theirs.double(), ours.double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    assert all(p.dtype == F64 for p in ours.parameters())
    x = _f64(2, 5, 8)
    y = ours(x)
    want = as_ours(theirs(x))
    assert y.dtype == F64
    torch.testing.assert_close(y, want)
    dy = torch.randn_like(want)
    for g, w in zip(torch.autograd.grad(y, [x, *ours.parameters()], dy),
                    torch.autograd.grad(want, [x, *theirs.parameters()], dy)):
        torch.testing.assert_close(g, w.reshape(g.shape))
    for mode in ("autocast", "torch", "unchanged") if hasattr(ours, "output_under_autocast") else ("",):
        if mode:
            ours.output_under_autocast = mode  # (layers/_autocast.py; "torch" is what convert sets)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            assert ours(x).dtype == theirs(x).dtype == F64
    ours.use_triton = True
    with pytest.raises(ValueError, match=r"use_triton=True cannot compute in torch\.float64"):
        ours(x)


@pytest.mark.parametrize("how", ["double", "default_dtype"])
def test_float64_softmax_and_router(how):
    """The modules without a torch counterpart: CausalSoftmax against torch's masked softmax,
    the router against itself on the reference; both float64 through, and ``use_triton=True``
    a ValueError."""
    with (default_dtype(F64) if how == "default_dtype" else contextlib.nullcontext()):
        softmax = CausalSoftmax(scale=0.5)
        torch.manual_seed(2)
        router = CoordinateDescentRouter(8, n_iters=3, device=DEVICE)
        torch.manual_seed(2)
        reference_router = CoordinateDescentRouter(8, n_iters=3, use_triton=False, device=DEVICE)
    if how == "double":
        router, reference_router = router.double(), reference_router.double()
    scores, x = _f64(2, 4, 5), _f64(2, 10, 8)
    torch.testing.assert_close(softmax(scores), _causal(scores, 0.5))
    got, want = router(x, num_tokens=3), reference_router(x, num_tokens=3)
    assert got.scores.dtype == got.routed_tokens.dtype == F64
    assert torch.equal(got.indices, want.indices) and torch.equal(got.scores, want.scores)
    (gx,) = torch.autograd.grad(got.scores.sum(), x)
    (wx,) = torch.autograd.grad(want.scores.sum(), x)
    assert torch.equal(gx, wx)
    for module, call in ((CausalSoftmax(use_triton=True), lambda m: m(scores)),
                         (CoordinateDescentRouter(8, n_iters=3, use_triton=True, device=DEVICE).double(),
                          lambda m: m(x, num_tokens=3))):
        with pytest.raises(ValueError, match=r"use_triton=True cannot compute in torch\.float64"):
            call(module)
