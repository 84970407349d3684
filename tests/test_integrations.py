"""The layers in the PyTorch ecosystem: torch.compile, autocast, CUDA graphs, DDP/FSDP2,
Hugging Face transformers and safetensors.

Each test uses a small model built from all four layers (``FourLayerNet``). On a machine
without a GPU the kernels run through the Triton interpreter, except under torch.compile,
which cannot trace interpreted kernels (docs/ARCHITECTURE.md, "Paths"): there the reference path is
compiled, and the kernel path is compiled on the GPU.
"""
from __future__ import annotations

import copy
import io
import os
import subprocess
import sys

import pytest
import torch
from torch import Tensor, nn

import triton_layers
from triton_layers import CausalSoftmax, CoordinateDescentRouter, TritonLayerNorm, TritonRMSNorm, WeightedSum
from triton_layers import functional as F

from .training_cases import CARDS

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


class FourLayerNet(nn.Module):
    """(b, n, d) tokens -> (b, num_tokens) scores, through every layer of the library:
    TritonLayerNorm -> single-head attention with CausalSoftmax (and key padding) ->
    CoordinateDescentRouter picks tokens -> WeightedSum scores them, times the router's
    (straight-through) scores, so every parameter and the input get a gradient."""

    def __init__(self, dim: int = 24, num_tokens: int = 5, use_triton: bool | None = None) -> None:
        super().__init__()
        self.norm = TritonLayerNorm(dim, bias=True, use_triton=use_triton)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.softmax = CausalSoftmax(scale=dim**-0.5, use_triton=use_triton)
        self.router = CoordinateDescentRouter(dim, n_iters=8, use_triton=use_triton)
        self.head = WeightedSum(dim, bias=True, use_triton=use_triton)
        self.num_tokens = num_tokens
        with torch.no_grad():  # LayerNorm starts at weight 1, bias 0: make both count
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """``valid`` (b, n) bool, False at padding tokens."""
        h = self.norm(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = h + self.softmax(q @ k.transpose(-1, -2), key_padding_mask=~valid) @ v
        routed = self.router(h, num_tokens=self.num_tokens, mask=valid)
        return self.head(routed.routed_tokens) * routed.scores


def _batch(device, b: int = 2, n: int = 13, d: int = 24) -> tuple[Tensor, Tensor]:
    x = torch.randn(b, n, d, device=device)
    valid = torch.ones(b, n, dtype=torch.bool, device=device)
    valid[-1, -3:] = False  # the last sequence is padded
    return x, valid


def _loss_and_grads(model: nn.Module, x: Tensor, valid: Tensor, w: Tensor) -> tuple[Tensor, ...]:
    """Output, then the gradients of (output * w).sum() for x and every parameter (by autograd.grad,
    which leaves .grad alone)."""
    x = x.detach().requires_grad_()
    out = model(x, valid)
    return (out, *torch.autograd.grad((out * w).sum(), [x, *model.parameters()]))


# ------------------------------------------------------------------------- torch.compile


def _check_compiles_once(model: nn.Module, backend: str, device, rtol: float, atol: float) -> None:
    """fullgraph compile: one frame for two calls with the same shapes, no graph break, and
    the eager forward and backward."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for _ in range(2):  # fresh data, same shapes: must not recompile
        x, valid = _batch(device)
        w = torch.randn(x.shape[0], model.num_tokens, device=device)
        got = _loss_and_grads(compiled, x, valid, w)
        want = _loss_and_grads(model, x, valid, w)
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    assert counter.frame_count == 1, f"compiled {counter.frame_count} frames (a recompile)"
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()


def test_compile_fullgraph_reference_path():
    """CPU: the reference path compiles whole (the interpreted kernels cannot be traced)."""
    _check_compiles_once(FourLayerNet(use_triton=False), "aot_eager", "cpu", rtol=1e-5, atol=1e-6)


@needs_cuda
def test_compile_fullgraph_kernels_inductor():
    """GPU: the kernels, as torch.library triton_ops, under Inductor."""
    _check_compiles_once(FourLayerNet().cuda(), "inductor", "cuda", rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------ autocast

# The output dtype of each layer under autocast(bfloat16) with fp32 parameters (README,
# "Integrations"). The norms write autocast's dtype: what the next matmul reads, so no cast
# kernel runs between them (their statistics are fp32 inside the kernels whatever the
# dtypes). The others keep the input's dtype, as outside autocast.
# (the cards' layer and autocast_bf16: tests/training_cases.py)
LAYERS = {card.name: card.layer for card in CARDS.values() if card.layer}
# The norms under autocast compute what they compute outside it with out_dtype=bfloat16.
EXPLICIT_BF16 = {card.name: card.autocast_bf16 for card in CARDS.values() if card.autocast_bf16}


def _away_from_init(name: str, layer: nn.Module) -> nn.Module:
    """``layer``, a norm's weight drawn away from 1 and bias away from 0 (where every instance
    starts: a comparison there could not tell a swapped or missing parameter)."""
    if name in EXPLICIT_BF16:
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5)
            if getattr(layer, "bias", None) is not None:
                layer.bias.uniform_(-0.5, 0.5)
    return layer


@pytest.mark.parametrize("use_triton", [None, False], ids=["kernels", "reference"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["fp32_in", "bf16_in"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_autocast_layer_output_dtype(name, x_dtype, use_triton, device):
    layer = _away_from_init(name, LAYERS[name](use_triton).to(device))
    norm = name in EXPLICIT_BF16
    x = torch.randn(3, 7, 24, device=device).to(x_dtype).requires_grad_()
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == (torch.bfloat16 if norm else x_dtype)
    # The very same result as without autocast (norms: asked for bf16 explicitly).
    y_plain = EXPLICIT_BF16[name](layer, x) if norm else layer(x)
    assert torch.equal(y, y_plain)
    assert layer(x).dtype == x_dtype  # outside autocast: x's dtype
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *layer.parameters()], dy)
    assert grads[0].dtype == x_dtype and all(g.dtype == torch.float32 for g in grads[1:])
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("use_triton", [None, False], ids=["kernels", "reference"])
def test_autocast_router(use_triton, device):
    """The routing scores come from a matmul (x @ routing_token), which autocast runs in
    bf16: scores are bf16, routed tokens keep x's dtype, and the soft top-k matches the
    same computation outside autocast on the bf16 scores."""
    router = CoordinateDescentRouter(24, n_iters=8, use_triton=use_triton).to(device)
    x = torch.randn(2, 13, 24, device=device, requires_grad=True)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out = router(x, num_tokens=4)
    assert out.scores.dtype == torch.bfloat16 and out.routed_tokens.dtype == torch.float32
    s = torch.einsum("bnd,rd->brn", x.bfloat16(), router.routing_token.bfloat16()).reshape(2, 13)
    soft = F.coor_descent(
        s, n_iters=8, k=4 * router.fetch_k_ratio, eps=router.eps, eps_init=router.eps_init,
        eps_decay=router.eps_decay, use_triton=use_triton,
    )
    assert torch.equal(out.indices, soft.topk(4, dim=-1).indices)
    torch.testing.assert_close(out.routed_tokens, x[torch.arange(2, device=device)[:, None], out.indices])
    dx, dtoken = torch.autograd.grad((out.routed_tokens * out.scores.unsqueeze(-1)).sum(), [x, router.routing_token])
    assert dx.dtype == dtoken.dtype == torch.float32 and torch.isfinite(dtoken).all() and dtoken.abs().sum() > 0


def test_autocast_model_trains(device):
    """The whole model under autocast: fp32 parameters, bf16 activations, fp32 gradients."""
    model = FourLayerNet().to(device)
    x, valid = _batch(device)
    x.requires_grad_()
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out = model(x, valid)
    # The norm writes bf16 under autocast (what the qkv matmul reads); this model adds the
    # attention output to the norm's output, so its stream and output are bf16.
    assert out.dtype == torch.bfloat16
    out.square().sum().backward()  # backward outside autocast, as torch recommends
    for name, p in [("x", x), *model.named_parameters()]:
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------- CUDA graphs


@needs_cuda
def test_cuda_graph_forward_backward_replays():
    """Forward + backward of the four layers captured in one CUDA graph and replayed on
    new data gives the eager results; no host synchronisation on the way (capture would
    fail on one, and sync debug mode raises on one in eager mode)."""
    torch.manual_seed(1)
    model = FourLayerNet().cuda()
    static_x, valid = _batch("cuda")
    static_x.requires_grad_()
    static_w = torch.randn(static_x.shape[0], model.num_tokens, device="cuda")
    params = list(model.parameters())

    def step() -> Tensor:
        out = model(static_x, valid)
        (out * static_w).sum().backward()
        return out

    side = torch.cuda.Stream()  # warm up (compile the kernels) off the capturing stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)

    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")

    for t in [static_x, *params]:
        t.grad = None  # the graph allocates the gradients in its own pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    for _ in range(2):
        x, _ = _batch("cuda")
        w = torch.randn_like(static_w)
        with torch.no_grad():
            static_x.copy_(x)
            static_w.copy_(w)
        graph.replay()
        torch.cuda.synchronize()
        replayed = (static_out, static_x.grad, *(p.grad for p in params))
        torch.testing.assert_close(replayed, _loss_and_grads(model, x, valid, w), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- DDP / FSDP2


def _run_distributed_check(extra_args: list[str]) -> str:
    env = dict(os.environ)  # as is: keeps NCCL_NVLS_ENABLE and TRITON_INTERPRET if set
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "examples", "distributed_check.py"), *extra_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    assert "PASS: DDP and FSDP2 match one process" in proc.stdout, output[-5000:]
    assert "FAIL" not in proc.stdout, output[-5000:]
    return proc.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_and_fsdp2_on_two_gpus():
    assert "nccl on cuda, the Triton kernels" in _run_distributed_check([])


@pytest.mark.skipif(CUDA, reason="the GPU machine runs the NCCL variant")
def test_ddp_and_fsdp2_on_cpu_gloo():
    """Two CPU processes with gloo; the kernels run through the interpreter when the
    suite does (TRITON_INTERPRET=1 is inherited), so our autograd under DDP/FSDP2 is
    tested. Small sizes keep it at ~15 s of CPU time, most of it two Python start-ups."""
    out = _run_distributed_check(["--cpu", "--per-rank-batch", "1", "--seq", "16", "--dim", "32"])
    assert "gloo on cpu" in out


# ----------------------------------------------------------------------- Hugging Face


def test_convert_hf_gpt2(device):
    """triton_layers.convert on a transformers GPT-2 (built from a config, no download)
    replaces its five LayerNorms (with bias); logits and every gradient match, and the
    state_dict still loads into the original model class."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    original = transformers.GPT2LMHeadModel(config).to(device).eval()
    with torch.no_grad():  # GPT-2 starts its LayerNorms at weight 1, bias 0
        for module in original.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    converted = triton_layers.convert(copy.deepcopy(original))
    norms = [m for m in converted.modules() if isinstance(m, TritonLayerNorm)]
    assert len(norms) == 5 and all(m.bias is not None for m in norms)
    assert not any(isinstance(m, nn.LayerNorm) for m in converted.modules())

    ids = torch.randint(0, 100, (2, 19), device=device)
    logits = {}
    grads = {}
    for name, model in (("torch", original), ("triton", converted)):
        out = model(ids, labels=ids)
        out.loss.backward()
        logits[name] = out.logits
        grads[name] = {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(logits["triton"], logits["torch"], rtol=1e-4, atol=1e-4)
    assert grads["triton"].keys() == grads["torch"].keys()
    for n, g in grads["torch"].items():
        torch.testing.assert_close(grads["triton"][n], g, rtol=1e-4, atol=1e-5, msg=n)

    reloaded = transformers.GPT2LMHeadModel(config).to(device).eval()
    reloaded.load_state_dict(converted.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, logits["torch"], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- safetensors


def _modules(device) -> dict[str, nn.Module]:
    """A fresh instance of each card's layer, the router and the model; the seed decides the
    parameters."""
    return {**{name: _away_from_init(name, layer(None).to(device)) for name, layer in LAYERS.items()},
            "router": CoordinateDescentRouter(24, n_iters=8, device=device),
            "model": FourLayerNet().to(device)}


def _outputs(name: str, module: nn.Module, device) -> Tensor:
    torch.manual_seed(7)
    x, valid = _batch(device)
    if name == "model":
        return module(x, valid)
    if name == "router":
        return module(x, num_tokens=4).routed_tokens
    return module(x)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_state_dicts_save_and_load(fmt, tmp_path, device):
    if fmt == "safetensors":
        st = pytest.importorskip("safetensors.torch")
    torch.manual_seed(1)
    saved = _modules(device)
    torch.manual_seed(2)
    fresh = _modules(device)
    for name, module in saved.items():
        if fmt == "safetensors":
            path = str(tmp_path / f"{name}.safetensors")
            st.save_file(module.state_dict(), path)
            state = st.load_file(path, device=str(device))
        else:
            buffer = io.BytesIO()
            torch.save(module.state_dict(), buffer)
            buffer.seek(0)
            state = torch.load(buffer, weights_only=True)
        expected = module.state_dict()
        assert state.keys() == expected.keys(), name
        other = fresh[name]
        if state:  # a different draw before loading: the comparison below can fail
            assert any(not torch.equal(a, b) for a, b in zip(other.state_dict().values(), expected.values()))
        other.load_state_dict(state, strict=True)
        with torch.no_grad():
            assert torch.equal(_outputs(name, other, device), _outputs(name, module, device)), name



# ------------------------------------------------------------------ platforms and tracing


def test_import_and_reference_path_without_triton():
    """Where Triton is not installed (macOS, Windows), the package imports, every op runs on
    the reference path, and forcing the kernels says that Triton is missing."""
    code = (
        "import sys; sys.modules['triton'] = None\n"  # an import of triton now fails
        "import torch, triton_layers\n"
        "from triton_layers import functional as F\n"
        "x = torch.randn(3, 8)\n"
        "assert torch.allclose(F.layer_norm(x), torch.nn.functional.layer_norm(x, (8,)), atol=1e-6)\n"
        "triton_layers.TritonRMSNorm(8)(x); triton_layers.CausalSoftmax()(torch.randn(2, 4, 4))\n"
        "try:\n"
        "    F.layer_norm(x, use_triton=True)\n"
        "except ValueError as e:\n"
        "    assert 'triton, which is not installed' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('use_triton=True without triton did not raise')\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.parametrize("triton_version, numpy_version, broken", [
    ("3.6.0", "2.4.0", True), ("3.6.1", "2.5.2", True), ("3.5.0+git1234", "2.4.6", True),
    ("3.6.0", "2.3.5", False), ("3.7.0", "2.4.0", False), ("3.10.0", "2.5.2", False), ("3.9.0", "1.26.4", False)])
def test_which_interpreters_cannot_run(triton_version, numpy_version, broken):
    """Triton before 3.7 beside NumPy 2.4+: the interpreter fails inside every range loop
    (triton-lang/triton#9171), which the path choice names, with both versions and the way out."""
    from triton_layers import _checks

    problem = _checks.interpreter_problem(triton_version, numpy_version)
    assert (problem is not None) == broken
    if broken:
        assert triton_version in problem and numpy_version in problem and "numpy<2.4" in problem and "9171" in problem


@pytest.mark.skipif(CUDA, reason="the CPU interpreter's path")
def test_a_broken_interpreter_is_named_not_run(monkeypatch):
    """Where the interpreter cannot run (:func:`_checks.interpreter_problem`), a CPU call under
    TRITON_INTERPRET=1 raises a RuntimeError naming it, at the call, instead of the
    interpreter's TypeError from inside a kernel; use_triton=False still takes the reference."""
    from triton_layers import _checks
    from triton_layers.calls import eager as _eager

    if not _checks.TRITON_INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest without a GPU)")
    monkeypatch.setattr(_checks, "INTERPRETER_PROBLEM", _checks.interpreter_problem("3.6.0", "2.4.0"))
    # The problem is read when a call signature is first planned: an earlier test of this worker
    # that ran layer_norm on a (3, 8) CPU tensor left a plan, which would skip the check.
    _eager.clear_plans()
    x = torch.randn(3, 8)
    for use_triton in (None, True):
        with pytest.raises(RuntimeError, match=r"Triton 3\.6\.0 cannot run beside NumPy 2\.4\.0"):
            F.layer_norm(x, use_triton=use_triton)
    torch.testing.assert_close(F.layer_norm(x, use_triton=False), torch.nn.functional.layer_norm(x, (8,)))


@pytest.mark.skipif(CUDA, reason="the CPU interpreter's fallback")
def test_compile_and_export_trace_the_reference_under_the_interpreter():
    """With TRITON_INTERPRET=1, torch.compile and torch.export of an op on CPU tensors trace
    the reference path (the interpreter needs real data), and use_triton=True there says why."""
    from triton_layers import _checks

    if not _checks.TRITON_INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest without a GPU)")
    x, w = torch.randn(4, 16, requires_grad=True), torch.randn(16)
    eager = F.layer_norm(x, w)  # the kernels, through the interpreter
    compiled = torch.compile(lambda x: F.layer_norm(x, w), backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    exported = torch.export.export(TritonLayerNorm(16), (x.detach(),))
    torch.testing.assert_close(exported.module()(x.detach()), TritonLayerNorm(16)(x.detach()))
    with pytest.raises(Exception, match="cannot run the Triton interpreter"):
        torch.compile(lambda x: F.layer_norm(x, w, use_triton=True), backend="aot_eager", fullgraph=True)(x)
