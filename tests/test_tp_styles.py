"""torch's own tensor-parallel styles around our norms, in the combinations users write (torch's
docs, torchtitan's Llama plan), against the same block with torch's norms in one process.

Each case is a pre-norm block ``x + w2(silu(w1(norm(x))))`` (or the loss head ``output(norm(x))``)
parallelized by one plan; its output, the input's gradient and every parameter's gathered
gradient must equal the one-process block's. The plans:

- ``colwise_shard1``: torch's ``SequenceParallel()`` on the norm, then
  ``ColwiseParallel(input_layouts=Shard(1))`` and ``RowwiseParallel(output_layouts=Shard(1))``
  (the norm's backward gets its gradient from the all-gather's backward, a reduce-scatter still
  in flight: an ``AsyncCollectiveTensor`` inside a DTensor);
- ``prepare_local`` / ``prepare_dtensor``: ``PrepareModuleInput`` from ``Shard(1)`` to
  ``Replicate()`` on the MLP (torchtitan's plan), ``use_local_output`` True and False;
- ``prepare_output``: the norm's output kept a DTensor (``use_local_output=False``), the MLP's
  output moved back to ``Shard(1)`` by ``PrepareModuleOutput``;
- ``uneven``: the sequence not divisible by the ranks, the input a DTensor, the residual added
  to ``RowwiseParallel(output_layouts=Shard(1), use_local_output=False)``'s DTensor (torch 2.13
  and newer: :data:`UNEVEN_RUNS`);
- ``loss_parallel``: the final norm, then ``ColwiseParallel(input_layouts=Shard(1),
  output_layouts=Shard(-1), use_local_output=False)`` into torch's ``loss_parallel()``;
- ``fused_residual``: our ``triton_layers.parallel.SequenceParallel`` (the norm takes the
  residual and returns ``(y, h)``), then ``ColwiseParallel(input_layouts=Shard(1))``;
- ``strided_shard``: ``colwise_shard1``'s plan on a local shard that is a strided view (a
  ``chunk`` of the sequence, not copied), which torch's ``SequenceParallel`` wraps as a DTensor
  of non-contiguous strides.

CPU ranks over gloo (the kernels through the Triton interpreter); over NCCL where the machine
has the GPUs (``tests/test_tensor_parallel.py``'s ``_spawn``), where the plans of
:data:`COMPILED_PLANS` also run under ``torch.compile`` in bf16.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as TF
from torch import nn

from tests.test_tensor_parallel import _spawn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

DIM, HIDDEN, BATCH, SEQ_PER_RANK, VOCAB = 24, 40, 2, 3, 32
PLANS = ("colwise_shard1", "prepare_local", "prepare_dtensor", "prepare_output", "uneven", "loss_parallel",
         "fused_residual", "strided_shard")
NORMS = ("rms", "layer")
# Before torch 2.13, the uneven plan fails inside torch's own redistribute in the backward
# ("view size is not compatible with input tensor's size and stride"), with torch's norms as
# with ours (torch 2.11, CPU ranks over gloo): there the case is torch's to fix, not ours.
# The plans also run under torch.compile on GPUs, in bf16 (each compile takes seconds: the crash's
# plan, torchtitan's, the loss head and the fused residual).
COMPILED_PLANS = ("colwise_shard1", "prepare_local", "loss_parallel", "fused_residual")
UNEVEN_RUNS = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13)


class FFN(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return self.w2(TF.silu(self.w1(x)))


class Block(nn.Module):
    """``x + ffn(norm(x))``; with ``fused``, ``norm(x, residual)`` adds first and returns ``(y, h)``."""

    def __init__(self, norm: nn.Module, fused: bool = False):
        super().__init__()
        self.norm, self.ffn, self.fused = norm, FFN(), fused

    def forward(self, x, residual=None):
        if self.fused:
            if isinstance(self.norm, nn.RMSNorm):  # (torch's norm: the add, then the norm)
                h = x + residual
                y = self.norm(h)
            else:
                y, h = self.norm(x, residual)
            return h + self.ffn(y)
        return x + self.ffn(self.norm(x))


class Head(nn.Module):
    """``output(norm(x))``: the logits for the loss."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm, self.output = norm, nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        return self.output(self.norm(x))


def _norm(kind: str, ours: bool, dtype) -> nn.Module:
    import triton_layers as tl

    if kind == "rms":
        return tl.TritonRMSNorm(DIM, dtype=dtype) if ours else nn.RMSNorm(DIM, eps=torch.finfo(torch.float32).eps,
                                                                         dtype=dtype)
    return tl.TritonLayerNorm(DIM, dtype=dtype) if ours else nn.LayerNorm(DIM, dtype=dtype)


def _model(plan: str, kind: str, ours: bool, dtype, device) -> nn.Module:
    """The case's model with fresh random weights (the same for ours and torch's: seeded)."""
    torch.manual_seed(1234)
    norm = _norm(kind, ours, dtype)
    model = Head(norm) if plan == "loss_parallel" else Block(norm, fused=plan == "fused_residual")
    model = model.to(device=device, dtype=dtype)
    with torch.no_grad():
        g = torch.Generator().manual_seed(99)
        norm.weight.copy_(1 + 0.3 * torch.randn(DIM, generator=g))
        if getattr(norm, "bias", None) is not None:
            norm.bias.copy_(0.2 * torch.randn(DIM, generator=g))
    return model


def _plan(plan: str) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel)

    from triton_layers.parallel import SequenceParallel as FusedSequenceParallel

    mlp = {"ffn.w1": ColwiseParallel(input_layouts=Shard(1)), "ffn.w2": RowwiseParallel(output_layouts=Shard(1))}
    if plan in ("colwise_shard1", "strided_shard"):
        return {"norm": SequenceParallel(), **mlp}
    if plan == "fused_residual":  # ((y, h) as local shards: h joins the MLP's local output)
        return {"norm": FusedSequenceParallel(use_local_output=True), **mlp}
    if plan in ("prepare_local", "prepare_dtensor"):
        return {"norm": SequenceParallel(),
                "ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                          use_local_output=plan == "prepare_local"),
                "ffn.w1": ColwiseParallel(), "ffn.w2": RowwiseParallel(output_layouts=Shard(1))}
    if plan == "prepare_output":
        return {"norm": SequenceParallel(use_local_output=False), "ffn.w1": ColwiseParallel(input_layouts=Shard(1)),
                "ffn.w2": RowwiseParallel(use_local_output=False),
                "ffn": PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),))}
    if plan == "uneven":
        return {"norm": SequenceParallel(), "ffn.w1": ColwiseParallel(input_layouts=Shard(1)),
                "ffn.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
    if plan == "loss_parallel":
        return {"norm": SequenceParallel(),
                "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}
    raise KeyError(plan)


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _err(got, want) -> float:
    got, want = _full(got).double(), want.double()
    assert got.shape == want.shape, f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def _run_case(mesh, device, plan: str, kind: str, dtype, compiled: bool) -> list[str]:
    """One case on this rank: what differs from the one-process block (empty when all agree)."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    world, rank = mesh.size(), mesh.get_local_rank()
    seq = SEQ_PER_RANK * world + (1 if plan == "uneven" else 0)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, seq, DIM, generator=g).to(device=device, dtype=dtype)
    residual = torch.randn(BATCH, seq, DIM, generator=g).to(device=device, dtype=dtype)
    labels = torch.randint(0, VOCAB, (BATCH, seq), generator=g).to(device)
    dy = torch.randn(BATCH, seq, DIM, generator=g).to(device=device, dtype=dtype)

    def loss_of(out):
        if plan == "loss_parallel":
            return TF.cross_entropy(out.flatten(0, 1).float(), labels.flatten())
        return (out.float() * dy.float()).sum()

    # One process, torch's norms: the definition.
    ref = _model(plan, kind, False, dtype, device)
    xr, rr = x.clone().requires_grad_(), residual.clone().requires_grad_()
    out_ref = ref(xr, rr) if plan == "fused_residual" else ref(xr)
    loss_ref = loss_of(out_ref)
    loss_ref.backward()

    model = _model(plan, kind, True, dtype, device)
    parallelize_module(model, mesh, _plan(plan))
    fn = torch.compile(model) if compiled else model
    if plan == "uneven":
        xs = distribute_tensor(x, mesh, [Shard(1)]).detach().requires_grad_()
    elif plan == "strided_shard":  # (a leaf whose strides are x's: not contiguous)
        xs = x.chunk(world, 1)[rank].detach().requires_grad_()
        assert not xs.is_contiguous()
    else:
        xs = x.chunk(world, 1)[rank].clone().requires_grad_()
    rs = residual.chunk(world, 1)[rank].clone().requires_grad_()
    out = fn(xs, rs) if plan == "fused_residual" else fn(xs)
    if plan == "loss_parallel":
        with loss_parallel():
            loss = loss_of(out)
            loss.backward()
    else:
        from torch.distributed.tensor import DTensor

        if not isinstance(out, DTensor):  # (a local shard of the sequence)
            dys = dy.chunk(world, 1)[rank]
            (out.float() * dys.float()).sum().backward()
        else:
            loss_of(_full(out)).backward()

    tol = 1e-4 if dtype == torch.float32 else 3e-2
    wrong = []

    def check(what, got, want):
        if got is None:
            wrong.append(f"{what}: None")
            return
        from torch.distributed.tensor import DTensor
        import torch.distributed as dist

        if not isinstance(got, DTensor) and got.shape != want.shape:  # a local shard of the sequence
            parts = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(parts, got.contiguous())
            got = torch.cat(parts, 1)
        e = _err(got, want)
        if not e <= tol:
            wrong.append(f"{what}: max error {e:.2e}")

    if plan == "loss_parallel":
        check("loss", loss.detach(), loss_ref.detach())
    else:
        check("output", out.detach(), out_ref.detach())
    check("grad x", xs.grad, xr.grad)
    if plan == "fused_residual":
        check("grad residual", rs.grad, rr.grad)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        check(f"grad {name}", p.grad, q.grad)
    return wrong


def _matrix(mesh, device, dtypes, norms: tuple = NORMS, compile_too: Optional[bool] = None) -> None:
    """Every case on this rank; all their differences in one failure. Compiled too on GPUs
    (``compile_too`` None): on CPUs a traced call takes the reference (torch's ops: torch's
    business, and a minute of Inductor's CPU compile a case), so the CPU runs are eager."""
    if compile_too is None:
        compile_too = device == "cuda"
    failures = []
    for dtype in dtypes:
        for kind in norms:
            for plan in PLANS:
                if plan == "fused_residual" and kind != "rms":
                    continue
                if plan == "uneven" and not UNEVEN_RUNS:
                    continue
                compiled_too = compile_too and dtype == torch.bfloat16 and plan in COMPILED_PLANS
                for compiled in (False, True) if compiled_too else (False,):
                    case = f"{plan}/{kind}/{str(dtype)[6:]}/{'compiled' if compiled else 'eager'}"
                    try:
                        failures += [f"{case}: {w}" for w in _run_case(mesh, device, plan, kind, dtype, compiled)]
                    except Exception as err:  # (one case's error must not hide the others')
                        failures.append(f"{case}: {type(err).__name__}: {err}")
    assert not failures, "\n".join(failures)


def _two_ranks(mesh, device):
    _matrix(mesh, device, (torch.float32, torch.bfloat16))


def _four_ranks(mesh, device):
    _matrix(mesh, device, (torch.float32,), norms=("rms",))


def test_torch_styles_two_ranks():
    """Every plan, both norms, fp32 and bf16, on 2 ranks (and compiled, on GPUs: COMPILED_PLANS)."""
    _spawn(2, _two_ranks)


def test_torch_styles_four_ranks():
    """Every plan on 4 ranks, in fp32, with the RMSNorm (the LayerNorm shares its door and rule,
    and CI's 2 cores its minutes)."""
    _spawn(4, _four_ranks)


if __name__ == "__main__":
    # Each rank of a torchrun (``torchrun --nproc_per_node 2 -m tests.test_tp_styles``), eager:
    # how scripts/sanitize.sh runs the matrix under compute-sanitizer, one rank a process.
    import os

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])
    dist.init_process_group("nccl" if cuda else "gloo")
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    from torch.distributed.device_mesh import init_device_mesh

    from .test_tensor_parallel import _fp8_rows_sharded

    try:
        mesh = init_device_mesh(device, (dist.get_world_size(),))
        _matrix(mesh, device, (torch.float32, torch.bfloat16), compile_too=False)
        _fp8_rows_sharded(mesh, device)  # (the FP8 norms' kernels on each rank's rows, and their two passes)
        print(f"rank {dist.get_rank()}: every case agrees", flush=True)
    finally:
        dist.destroy_process_group()
