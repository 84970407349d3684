"""QK-norm: RMSNorm (and LayerNorm) over head_dim of the q or k slice of a fused qkv
projection, read in place from its strided layout (``_checks.kernel_heads``,
``_common.head_layout``, the forward kernel's ``head_rows``): the same values and gradients as
torch's, through the functional ops, the module Hugging Face's q/k norms are converted to, and
torch.compile; no copy of the input on the way in (the launch's arguments on the CPU, the
profiler's ops on a GPU)."""
import pytest
import torch
import torch.nn.functional as TF

from triton_layers import TritonRMSNorm, functional as F
from triton_layers._checks import kernel_heads
from triton_layers.kernels import _common
from triton_layers.kernels import ops as K

from .conftest import DTYPES

TOKENS, HEADS, KV_HEADS, HEAD_DIM = 7, 4, 2, 64


def _fused_qkv(device, dtype, batch=None):
    """A fused projection's output (..., tokens, (heads + 2 kv heads) * head_dim) and its q and
    k slices as (..., tokens, heads, head_dim) views, as a model's attention takes them."""
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    shape = (TOKENS, width) if batch is None else (batch, TOKENS, width)
    qkv = (torch.randn(shape, device=device) * 2 + 0.3).to(dtype).requires_grad_()
    q = qkv[..., : HEADS * HEAD_DIM].unflatten(-1, (HEADS, HEAD_DIM))
    k = qkv[..., HEADS * HEAD_DIM: (HEADS + KV_HEADS) * HEAD_DIM].unflatten(-1, (KV_HEADS, HEAD_DIM))
    return qkv, q, k


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("batch", [None, 2], ids=["tokens", "batch_tokens"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_strided_heads_matches_torch(device, dtype, batch):
    qkv, q, k = _fused_qkv(device, dtype, batch)
    assert not q.is_contiguous() and kernel_heads(q, HEAD_DIM).data_ptr() == q.data_ptr()
    wq = torch.randn(HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    wk = torch.randn(HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    ys = [F.rms_norm(q, wq, 1e-6), F.rms_norm(k, wk, 1e-6)]
    refs = [TF.rms_norm(t.float(), (HEAD_DIM,), w.float(), 1e-6) for t, w in ((q, wq), (k, wk))]
    for y, ref, t in zip(ys, refs, (q, k)):
        assert y.shape == t.shape and y.dtype == dtype
        torch.testing.assert_close(y.float(), ref, **_tol(dtype))
    gs = [torch.randn_like(y) for y in ys]
    got = torch.autograd.grad(sum((y.float() * g.float()).sum() for y, g in zip(ys, gs)), (qkv, wq, wk))
    want = torch.autograd.grad(sum((r * g.float()).sum() for r, g in zip(refs, gs)), (qkv, wq, wk))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), **_tol(dtype))
    assert got[0][..., (HEADS + KV_HEADS) * HEAD_DIM:].abs().max() == 0  # (v got no gradient)


def test_layer_norm_of_strided_heads_and_stable_mode(device):
    qkv, q, _ = _fused_qkv(device, torch.float32)
    w, b = torch.randn(HEAD_DIM, device=device), torch.randn(HEAD_DIM, device=device)
    torch.testing.assert_close(F.layer_norm(q, w, b), TF.layer_norm(q, (HEAD_DIM,), w, b), atol=1e-5, rtol=1e-5)
    # stable mode on the heads in place: the same bits as on a contiguous copy
    qkv_big = qkv.detach() * 1e4
    big = qkv_big[:, : HEADS * HEAD_DIM].unflatten(-1, (HEADS, HEAD_DIM))
    assert torch.equal(F.layer_norm(big, w, b, stable=True), F.layer_norm(big.contiguous(), w, b, stable=True))


def test_the_launch_reads_the_slice_in_place():
    """The forward's launch gets the q view itself, with its token stride, head count and head stride."""
    qkv = torch.empty(4608, 8192, device="meta", dtype=torch.bfloat16)
    q = qkv[:, :6144].view(4608, 48, 128)
    assert _common.head_layout(q) == (8192, 48, 128)
    assert _common.head_layout(q.contiguous()) is None and _common.head_layout(qkv) is None
    w = torch.empty(128, device="meta", dtype=torch.bfloat16)
    (kernel, args, kwargs), = K.norm.record_launches(q, w, None, 1e-6, True, False, False, False, torch.bfloat16)
    assert kernel.__name__ == "_norm_fwd_kernel" and args[0] is q
    assert args[7] == 8192 and args[-2:] == (48, 128)  # (the row stride; heads and the head stride)


def test_module_form_hugging_face_uses(device):
    """Qwen3's ``q_norm(q_proj(x).view(..., heads, head_dim))`` on a fused projection's slice:
    the module (as ``convert`` makes it) equals torch's RMSNorm module, and compiles."""
    torch.manual_seed(0)
    _, q, _ = _fused_qkv(device, torch.float32, batch=2)
    ours = TritonRMSNorm(HEAD_DIM, eps=1e-6, device=device)
    theirs = torch.nn.RMSNorm(HEAD_DIM, eps=1e-6, device=device)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(HEAD_DIM))
        theirs.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(q), theirs(q), atol=1e-5, rtol=1e-5)
    compiled = torch.compile(ours, fullgraph=True)
    torch.testing.assert_close(compiled(q.detach()), theirs(q.detach()), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the profiler's view of a GPU launch")
def test_no_copy_on_a_gpu():
    _, q, _ = _fused_qkv("cuda", torch.bfloat16)
    w = torch.randn(HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        F.rms_norm(q, w)  # (plans and compiles)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            F.rms_norm(q, w)
    names = {e.name for e in prof.events()}
    assert not names & {"aten::copy_", "aten::clone", "aten::contiguous"}, names
