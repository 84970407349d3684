"""Tensor and sequence parallelism: every op on DTensors, sharded, computing on the local
shards (the sharding rules of calls/sharding.py), with no communication inside our ops.

Each test spawns ranks over gloo on the CPU (the kernels run through the Triton
interpreter, as the rest of the suite) and checks, on every rank, the outputs and every
gradient against the same op on the whole tensors in one process; sequence lengths and
row counts are not divisible by the number of ranks (uneven shards). On a GPU machine with
two GPUs the same cases run over NCCL.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def rank_start_method() -> str:
    """How the multi-rank tests start their ranks (this file's, test_tp_styles' and
    test_torchtitan's). Forked on a machine without GPUs: a rank starts with torch, Triton and
    what the test imported already imported (about 5 s of CPU less a rank than a spawned one,
    which imports them again; more with torchtitan). Spawned on a machine with GPUs, where these
    tests were proven: a forked child cannot use CUDA once its parent has initialized it. A
    forked rank sets one thread first: a child whose parent ran OpenMP regions hangs in its own
    first parallel region (GNU OpenMP is not fork-safe); one thread opens none (torchrun sets one
    too)."""
    return "fork" if torch.cuda.device_count() == 0 else "spawn"


def _spawn(world: int, fn, shape: tuple = (), names: tuple = (), timeout: float = 600) -> None:
    """``fn(mesh, device)`` on ``world`` ranks; the mesh 1-D, or of ``shape`` with dim ``names``.
    A run past ``timeout`` seconds fails (its ranks killed): a rank that dies inside a collective
    can leave the others waiting for it forever, and a hung suite tells nothing."""
    import time

    import torch.multiprocessing as mp

    if 0 < torch.cuda.device_count() < world:
        # (CPU ranks there run the reference, not the kernels: the interpreter is only set up
        # where there is no GPU; a machine of `world` GPUs, or CI's CPUs, runs the case)
        pytest.skip(f"{world} ranks need {world} GPUs here, or none")

    with tempfile.TemporaryDirectory() as tmp:
        ranks = mp.start_processes(
            _worker, args=(world, os.path.join(tmp, "store"), fn, shape or (world,), names or None), nprocs=world,
            join=False, start_method=rank_start_method())
        deadline = time.monotonic() + timeout
        while not ranks.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                for p in ranks.processes:
                    p.kill()
                pytest.fail(f"{getattr(fn, '__name__', fn)} on {world} ranks took over {timeout:.0f} s (a rank hung)")


def _worker(rank: int, world: int, store: str, fn, shape: tuple, names) -> None:
    torch.set_num_threads(1)  # (one thread a rank: rank_start_method says why)
    if os.environ.get("TRITON_INTERPRET") == "1":  # (a spawned process: conftest's setup is not run)
        from tests import fast_interpreter

        fast_interpreter.install()
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank)
    from torch.distributed.device_mesh import init_device_mesh

    try:
        fn(init_device_mesh(device, shape, mesh_dim_names=names), device)
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown, where gloo can abort a process after all its
    # work (exit status 134: examples/distributed_check.py says more), which mp.spawn would
    # report as this rank's failure. (A failure above raises first, and is reported.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _no_comms():
    from torch.distributed.tensor.debug import CommDebugMode

    return CommDebugMode()


def _close(got, want, what: str, tol: float = 1e-4) -> None:
    from torch.distributed.tensor import DTensor

    assert got is not None, f"{what}: None"
    got = got.full_tensor() if isinstance(got, DTensor) else got
    want = want.full_tensor() if isinstance(want, DTensor) else want
    assert want is not None, f"{what}: want None"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-12))
    assert err <= tol, f"{what}: max error {err:.2e} of max |value|"


def _grads_and_comms(fn, inputs, dy):
    """The output of ``fn(*inputs)`` and the gradients of the inputs that require one, and the
    collectives DTensor ran inside (forward and backward)."""
    with _no_comms() as comm:
        y = fn(*inputs)
        grads = torch.autograd.grad(y, [t for t in inputs if t.requires_grad], dy)
    return y, grads, comm.get_total_counts()


def _norm_cases(mesh, device):
    """The norms under SequenceParallel (the sequence dim sharded, 7 rows a sequence), the fused
    residual norm on sequence-sharded x and residual, and row shards of a 2-D input."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import triton_layers
    from triton_layers import functional as F

    torch.manual_seed(0)
    x = torch.randn(2, 7, 24, device=device)
    res = torch.randn(2, 7, 24, device=device)
    w = 1 + 0.5 * torch.randn(24, device=device)
    b = torch.randn(24, device=device)
    shard = lambda t, d=1: distribute_tensor(t, mesh, [Shard(d)]).requires_grad_()  # noqa: E731
    rep = lambda t: distribute_tensor(t, mesh, [Replicate()]).requires_grad_()  # noqa: E731
    leaf = lambda t: t.clone().requires_grad_()  # noqa: E731
    cases = {
        "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), (x, w, b), (shard, rep, rep)),
        "rms_norm": (lambda x, w: F.rms_norm(x, w), (x, w), (shard, rep)),
        "layer_norm rows": (lambda x, w, b: F.layer_norm(x, w, b), (x[0], w, b), (lambda t: shard(t, 0), rep, rep)),
        "add_rms_norm": (lambda x, r, w: sum(t.float() for t in F.rms_norm(x, w, residual=r)), (x, res, w),
                         (shard, shard, rep)),
        "add_layer_norm bf16 residual": (
            lambda x, r, w: sum(t.float() for t in F.layer_norm(x, w, residual=r, residual_dtype=torch.float32)),
            (x.bfloat16(), res, w), (shard, shard, rep)),
    }
    if device == "cuda":  # the same under torch.compile (the interpreter cannot run traced kernels)
        cases.update({f"{name} compiled": (torch.compile(fn, fullgraph=False), values, how)
                      for name, (fn, values, how) in list(cases.items())})
    # A normalized dim sharded: no rule shards it; the replicated fallback (DTensor gathers).
    cases["layer_norm, the normalized dim sharded"] = (lambda x, w, b: F.layer_norm(x, w, b), (x, w, b),
                                                       (lambda t: shard(t, 2), rep, rep))
    # Eagerly, each case through both doors a DTensor can take (calls/dtensor.py): the
    # local one, where the placements are a strategy of the rule as they are (its ``run``),
    # and DTensor's dispatch of the custom op (``Op.through_custom_op``; the local door
    # turned off by a ``door_for`` that finds none).
    from triton_layers.calls import dtensor as _dtensor_eager
    from triton_layers.calls.doors import Op

    from triton_layers import _checks

    local_run, local_door_for, custom_op = _dtensor_eager.run, _dtensor_eager.door_for, Op.through_custom_op
    kernels_run = device == "cuda" or _checks.TRITON_INTERPRET  # (else CPU tensors take the reference)
    from triton_layers.calls import eager as _eager

    for door in ("local", "local, planned", "dispatch"):
        taken = []
        local = door.startswith("local")

        def counted_run(*args):
            taken.append(True)
            return local_run(*args)

        def counted_custom_op(self, *args):
            taken.append(False)
            return custom_op(self, *args)

        _dtensor_eager.run, Op.through_custom_op = counted_run, counted_custom_op
        if not local:  # (the doors kept by the local passes forgotten: each call decides anew)
            _dtensor_eager.door_for = lambda *args: None
            _eager.clear_plans()
        try:
            with _eager.checking_plans(door == "local, planned"):
                for name, (fn, values, how) in cases.items():
                    if door == "dispatch" and name.endswith("compiled"):
                        continue  # (traced: the custom op either way)
                    dy = torch.randn(values[0].shape, device=device)
                    want_y, want_grads, _ = _grads_and_comms(fn, [leaf(t) for t in values], dy)
                    dts = [h(t) for h, t in zip(how, values)]
                    d_dy = distribute_tensor(dy, mesh, [dts[0].placements[0]])
                    taken.clear()
                    got_y, got_grads, comms = _grads_and_comms(fn, dts, d_dy)
                    what = f"{name} ({door} door)"
                    if "normalized dim" in name:  # (no strategy takes it as it is: replicated whole)
                        assert taken == ([False] if kernels_run else []), f"{what}: {taken}"
                        if kernels_run:  # (the reference's torch ops: whatever DTensor's own rules give)
                            assert got_y.placements == (Replicate(),), f"{what}: {got_y.placements}"
                    else:
                        assert comms == 0, f"{what}: {comms} collectives inside the op"
                        if not name.endswith("compiled"):  # (compiled: whichever door Dynamo's graph leaves it)
                            assert taken == ([local] if kernels_run else []), f"{what}: {taken}"
                        assert got_y.placements == dts[0].placements, f"{what}: output {got_y.placements}"
                    tol = 2e-2 if values[0].dtype == torch.bfloat16 else 1e-4
                    _close(got_y, want_y, f"{what} output", tol)
                    for i, (g, wg) in enumerate(zip(got_grads, want_grads)):
                        _close(g, wg, f"{what} grad {i} ({g.placements})", tol)
        finally:
            _dtensor_eager.run, _dtensor_eager.door_for, Op.through_custom_op = local_run, local_door_for, custom_op
            if not local:
                _eager.clear_plans()  # (no door the patched door_for kept outlives the pass)

    # The modules under torch's SequenceParallel, as torchtitan plans its norms.
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    for cls, ref in ((triton_layers.TritonRMSNorm, torch.nn.RMSNorm), (triton_layers.TritonLayerNorm,
                                                                       torch.nn.LayerNorm)):
        torch.manual_seed(1)
        ours, theirs = cls(24).to(device), ref(24).to(device)
        with torch.no_grad():
            ours.weight.normal_()
        theirs.load_state_dict(ours.state_dict(), strict=False)
        for m in (ours, theirs):
            parallelize_module(m, mesh, SequenceParallel())
        xs = x.clone().requires_grad_()  # (each rank's x taken as its shard of the sequence)
        outs = [m(xs) for m in (ours, theirs)]
        for out in outs:
            out.pow(2).sum().backward()
        _close(outs[0], outs[1], f"{cls.__name__} local output", 1e-4)
        _close(ours.weight.grad, theirs.weight.grad, f"{cls.__name__} weight grad", 1e-4)


def _softmax_cases(mesh, device):
    """Scores sharded by heads (attention's ColwiseParallel) with a causal and a key padding
    mask, by batch; a causal shard of the queries is a clear error."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from triton_layers import functional as F

    torch.manual_seed(2)
    scores = torch.randn(3, 5, 6, 9, device=device)
    pad = torch.rand(3, 9, device=device) < 0.2
    dy = torch.randn(3, 5, 6, 9, device=device)
    for name, dim, mask_placement in (("heads", 1, Replicate()), ("batch", 0, Shard(0))):
        fn = lambda x, m: F.softmax(x, causal=True, scale=0.4, key_padding_mask=m)  # noqa: E731
        leaf = scores.clone().requires_grad_()
        want = fn(leaf, pad)
        want_grad, = torch.autograd.grad(want, leaf, dy)
        dx = distribute_tensor(scores, mesh, [Shard(dim)]).requires_grad_()
        dm = distribute_tensor(pad, mesh, [mask_placement])
        y, grads, comms = _grads_and_comms(lambda x: fn(x, dm), [dx], distribute_tensor(dy, mesh, [Shard(dim)]))
        assert comms == 0 and y.placements == (Shard(dim),), f"softmax by {name}: {comms} comms, {y.placements}"
        _close(y, want, f"softmax by {name}")
        _close(grads[0], want_grad, f"softmax by {name}: dx")
    with pytest.raises(ValueError, match="query dim"):
        F.softmax(distribute_tensor(scores, mesh, [Shard(2)]), causal=True)


def _row_op_cases(mesh, device):
    """The cards' ``tp_rows``: ops on row-sharded inputs (data-sharded DTensors)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from .training_cases import CARDS

    torch.manual_seed(3)
    shard = lambda t: distribute_tensor(t, mesh, [Shard(0)])  # noqa: E731
    cases = {card.name: card.tp_rows(device, shard) for card in CARDS.values() if card.tp_rows}
    for name, (fn, values, places) in cases.items():
        leaves = [t.clone().requires_grad_() for t in values]
        want = fn(*leaves)
        dy = torch.randn(want.shape, device=device)
        want_grads = torch.autograd.grad(want, leaves, dy)
        dts = [distribute_tensor(t, mesh, [p]).requires_grad_() for t, p in zip(values, places)]
        y, grads, comms = _grads_and_comms(fn, dts, distribute_tensor(dy, mesh, [Shard(0)]))
        assert comms == 0, f"{name}: {comms} collectives inside the op"
        _close(y, want, f"{name} output", 1e-3)
        for i, (g, wg) in enumerate(zip(grads, want_grads)):
            _close(g, wg, f"{name} grad {i} ({g.placements})", 1e-3)


def _residual_style_cases(mesh, device):
    """triton_layers.parallel.SequenceParallel: norm(x, residual) with the residual positional or
    keyword, x and residual each this rank's shard of the sequence, returns (y, h) sharded, as
    local tensors with use_local_output=True; the same values and gradients as one process."""
    import triton_layers
    from torch.distributed.tensor.parallel import parallelize_module
    from triton_layers.parallel import SequenceParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(4)
    x, res = torch.randn(2, 3 * world, 24, device=device), torch.randn(2, 3 * world, 24, device=device)
    dy, dh = torch.randn_like(x), torch.randn_like(x)
    mine = slice(3 * rank, 3 * rank + 3)
    for cls in (triton_layers.TritonRMSNorm, triton_layers.TritonLayerNorm):
        torch.manual_seed(5)
        whole = cls(24).to(device)
        with torch.no_grad():
            whole.weight.normal_()
        leaves = [x.clone().requires_grad_(), res.clone().requires_grad_()]
        y, h = whole(*leaves)
        want = torch.autograd.grad((y * dy + h * dh).sum(), [*leaves, whole.weight])
        for keyword in (False, True):
            norm = cls(24).to(device)
            norm.load_state_dict(whole.state_dict())
            parallelize_module(norm, mesh, SequenceParallel(use_local_output=True))
            xl, rl = x[:, mine].clone().requires_grad_(), res[:, mine].clone().requires_grad_()
            yl, hl = norm(xl, residual=rl) if keyword else norm(xl, rl)
            assert not isinstance(yl, type(norm.weight)) and yl.shape == xl.shape
            got = torch.autograd.grad((yl * dy[:, mine] + hl * dh[:, mine]).sum(), [xl, rl, norm.weight])
            _close(yl, y[:, mine], f"{cls.__name__} y (keyword={keyword})")
            _close(hl, h[:, mine], f"{cls.__name__} h")
            _close(got[0], want[0][:, mine], f"{cls.__name__} dx")
            _close(got[1], want[1][:, mine], f"{cls.__name__} dresidual")
            _close(got[2], want[2], f"{cls.__name__} dweight")


class _Attention(torch.nn.Module):
    """Multi-head causal attention whose softmax is our CausalSoftmax (torchtitan's layout)."""

    def __init__(self, dim: int, head_dim: int):
        super().__init__()
        import triton_layers

        self.head_dim = head_dim
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.softmax = triton_layers.CausalSoftmax(scale=head_dim ** -0.5)

    def forward(self, x):
        x = x.contiguous()  # (see _tp_plan)
        b, s, _ = x.shape
        q, k, v = (w(x).reshape(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = self.softmax(q @ k.transpose(-1, -2)) @ v  # this rank's heads (ColwiseParallel)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class _Contiguous(torch.nn.Module):
    def forward(self, x):
        return x.contiguous()  # (see _tp_plan)


class _Block(torch.nn.Module):
    """A torchtitan-style decoder block: RMSNorm, attention, then the fused residual RMSNorm
    (``y, h = norm(a, residual=x)``) and a feed-forward."""

    def __init__(self, dim: int = 32, head_dim: int = 8):
        super().__init__()
        import triton_layers

        self.attention_norm = triton_layers.TritonRMSNorm(dim)
        self.attention = _Attention(dim, head_dim)
        self.ffn_norm = triton_layers.TritonRMSNorm(dim)
        self.feed_forward = torch.nn.Sequential(_Contiguous(), torch.nn.Linear(dim, 3 * dim), torch.nn.SiLU(),
                                                torch.nn.Linear(3 * dim, dim))

    def forward(self, x):
        a = self.attention(self.attention_norm(x))
        y, h = self.ffn_norm(a, residual=x)
        return h + self.feed_forward(y)


def _seeded_block(seed: int, device) -> _Block:
    """A block with random norm weights (not all ones: a test must be able to fail)."""
    torch.manual_seed(seed)
    block = _Block().to(device)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return block


def _tp_plan(mesh):
    """torchtitan's plan for such a block: sequence-parallel norms, attention sharded by heads."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    from triton_layers.parallel import SequenceParallel

    # (local outputs: a sequence all-gathered from uneven shards over NCCL can have a local
    # tensor that is not contiguous while the DTensor says it is, which torch 2.11's CUDA linear
    # refuses; the modules below make the local tensor contiguous)
    gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),  # noqa: E731
                                        use_local_output=True)
    return {
        "attention_norm": SequenceParallel(), "attention": gather(),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "ffn_norm": SequenceParallel(), "feed_forward": gather(),
        "feed_forward.1": ColwiseParallel(),
        "feed_forward.3": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }


def _block_sequence() -> int:
    """The block tests' sequence length: 7, split unevenly (4 + 3 on 2 ranks), where torch can
    run the block's plan on uneven shards at all; 8 before torch 2.13. On torch 2.11 (2 H100s,
    NCCL; and CPU ranks over gloo) the block fails inside torch's own redistribute in the
    backward ("view size is not compatible with input tensor's size and stride") with torch's
    norms as with ours; our ops' uneven shards are checked by the other cases on every torch."""
    return 7 if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13) else 8


def _block_cases(mesh, device):
    """The block under the plan (the sequence split unevenly: :func:`_block_sequence`) against
    one process: output, input gradient, every parameter's gradient gathered, and the
    parameters after an AdamW step; the ffn norm's weight frozen. On GPUs, also the sharded
    block under torch.compile."""
    import copy

    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    for compiled in (False, True) if device == "cuda" else (False,):
        whole = _seeded_block(6, device)
        whole.ffn_norm.weight.requires_grad_(False)
        sharded = parallelize_module(copy.deepcopy(whole), mesh, _tp_plan(mesh))
        run = torch.compile(sharded) if compiled else sharded
        what = "compiled block" if compiled else "block"
        n = _block_sequence()
        x, dy = torch.randn(2, n, 32, device=device), torch.randn(2, n, 32, device=device)
        xw = x.clone().requires_grad_()
        xd = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
        outs = {}
        for name, model, inp, grad in (("whole", whole, xw, dy), ("tp", run, xd,
                                                                 distribute_tensor(dy, mesh, [Shard(1)]))):
            out = model(inp)
            out.backward(grad)
            outs[name] = out
        _close(outs["tp"], outs["whole"], f"{what} output")
        _close(xd.grad, xw.grad, f"{what} input gradient")
        params = dict(whole.named_parameters())
        for name, p in sharded.named_parameters():
            if p.requires_grad:
                _close(p.grad, params[name].grad, f"{what} grad {name}")
            else:
                assert p.grad is None and params[name].grad is None
        for model in (whole, sharded):
            torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2).step()
        for name, p in sharded.named_parameters():
            _close(p, params[name], f"{what} param {name} after AdamW")


def _fsdp_tp_cases(mesh, device):
    """FSDP2 over the data-parallel dim of a 2-D mesh and the block's tensor-parallel plan over
    the other: the batch split 2 ways, the sequence as :func:`_block_sequence` says; gradients (FSDP2 averages them
    over the data-parallel ranks) and the parameters after AdamW against one process."""
    import copy

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    dp, tp = mesh["dp"], mesh["tp"]
    whole = _seeded_block(7, device)
    sharded = parallelize_module(copy.deepcopy(whole), tp, _tp_plan(tp))
    fully_shard(sharded, mesh=dp)
    n = _block_sequence()
    x, dy = torch.randn(4, n, 32, device=device), torch.randn(4, n, 32, device=device)
    whole((x.clone().requires_grad_())).mul(dy).sum().div(dp.size()).backward()
    mine = slice(2 * dp.get_local_rank(), 2 * dp.get_local_rank() + 2)
    xd = distribute_tensor(x[mine].contiguous(), tp, [Shard(1)])
    out = sharded(xd)
    out.backward(distribute_tensor(dy[mine].contiguous(), tp, [Shard(1)]))
    params = dict(whole.named_parameters())
    for name, p in sharded.named_parameters():
        _close(p.grad, params[name].grad, f"FSDP2 x TP grad {name}")
    for model in (whole, sharded):
        torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    for name, p in sharded.named_parameters():
        _close(p, params[name], f"FSDP2 x TP param {name} after AdamW")


TWO_RANK_CASES = {"block": _block_cases, "residual_style": _residual_style_cases, "norms": _norm_cases,
                  "softmax": _softmax_cases, "row_ops": _row_op_cases}


@pytest.mark.parametrize("cases", list(TWO_RANK_CASES))
def test_every_op_on_dtensors_two_ranks(cases):
    _spawn(2, TWO_RANK_CASES[cases])


def test_norms_on_dtensors_four_ranks():
    """Four ranks: shards of 2 and 1 of 7 rows."""
    _spawn(4, _norm_cases)


def test_fsdp2_with_tensor_parallel_on_a_2d_mesh():
    _spawn(4, _fsdp_tp_cases, (2, 2), ("dp", "tp"))


def test_the_readme_plan_runs(tmp_path):
    """The README's tensor-parallel plan, as written, on 2 CPU ranks over gloo. Judged by what
    each rank prints after its last line: gloo can abort a process in the interpreter's
    teardown after everything ran (examples/distributed_check.py says more)."""
    import subprocess
    import sys

    if 0 < torch.cuda.device_count() < 2:
        pytest.skip("the plan takes a GPU a rank where there are GPUs: it needs 2 here, or none")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    start = readme.index("# torchrun --nproc_per_node=2 plan.py")
    plan = readme[start:readme.index("```", start)]
    script = tmp_path / "plan.py"
    script.write_text(plan + "print('PLAN-DONE', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.stdout.count("PLAN-DONE") == 2, (proc.stdout + proc.stderr)[-4000:]
    # (what the plan prints: each rank's error against one process, which must be rounding; read
    # as the number its ".1e" format writes, not up to the next space: the two ranks share one
    # pipe, and a CI run found one rank's line run on into the other's, "1.2e-07rank 1: ...")
    errors = [float(e) for e in re.findall(r"max error against one process (\d\.\de[-+]\d+)", proc.stdout)]
    assert len(errors) == 2 and max(errors) <= 1e-5, proc.stdout[-2000:]


def test_the_tp_step_benchmark_dry_runs(tmp_path):
    """benchmarks/bench_tp_step.py --quick on 2 CPU ranks: both impls step, and under one plan
    they run the same collectives, move the same bytes and start from the same loss."""
    import csv
    import subprocess

    import numpy
    import triton

    from triton_layers import _checks

    problem = _checks.interpreter_problem(triton.__version__, numpy.__version__)
    if problem:
        pytest.skip(problem)  # (torch 2.11's Triton 3.6 beside NumPy 2.5 on the GPU machines)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "benchmarks.bench_tp_step", "--quick", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with open(tmp_path / "tp_step.csv") as f:
        torch_row, ours = list(csv.DictReader(f))
    assert (torch_row["impl"], ours["impl"]) == ("torch", "triton_layers")
    assert float(ours["step_ms"]) > 0 and float(torch_row["step_ms"]) > 0, proc.stderr[-4000:]
    assert float(ours["step_ms"]) > 0 and "all_gather_into_tensor" in ours["comm_counts"]
    assert ours["comm_counts"] == torch_row["comm_counts"]
    assert float(ours["comm_bytes"]) == float(torch_row["comm_bytes"]) > 0
    assert abs(float(ours["loss"]) - float(torch_row["loss"])) <= 1e-4 * abs(float(torch_row["loss"]))
    # --per-call: one norm call's host time, each case and impl
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "benchmarks.bench_tp_step", "--quick", "--per-call", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with open(tmp_path / "tp_call.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["impl"]) for r in rows] == [
        (c, i) for c in ("rmsnorm", "add_rmsnorm", "rmsnorm_fp8_per_token") for i in ("torch", "triton_layers")]
    assert all(float(r["host_us"]) > 0 for r in rows) and (tmp_path / "tp_call_profile.txt").exists()


def _gathered(t):
    """The whole of a DTensor (FP8 gathered as bytes: gloo has no FP8), a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor) or t.dtype.itemsize != 1:
        return t.full_tensor() if isinstance(t, DTensor) else t
    as_bytes = DTensor.from_local(t.to_local().view(torch.uint8), t.device_mesh, t.placements, shape=t.shape,
                                  stride=t.stride())
    return as_bytes.full_tensor().view(t.dtype)


def _fp8_rows_sharded(mesh, device) -> None:
    """The FP8 norms on rows sharded over the ranks (an uneven sequence shard of (B, S, D), x
    and its residual Shard(1), the parameters replicated): each rank's data and scales are its
    rows of one process's result, bit for bit (the dynamic per-tensor scale, a cross-shard amax,
    replicated), through the kernels on the local rows (triton_layers/_fp8_shards.py), and the
    gradients of x, the residual and the parameters are one process's."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from triton_layers import FP8Recipe
    from triton_layers import functional as F
    from triton_layers.kernels import ops as kernel_ops

    world = dist.get_world_size()
    gen = torch.Generator().manual_seed(3)
    seq = 4 * world + 1  # (uneven: the last rank holds fewer rows)
    x = torch.randn(2, seq, 256, generator=gen).to(device)
    r = torch.randn(2, seq, 256, generator=gen).to(device)
    w = (1 + 0.1 * torch.randn(256, generator=gen)).to(device)
    b = (0.1 * torch.randn(256, generator=gen)).to(device)
    g = torch.randn(2, seq, 256, generator=gen).to(device)
    launches = []
    door = kernel_ops.norm_fp8_door

    class Spy:  # (counts the kernel door's calls: the local rows go through the kernels)
        def __getattr__(self, name):
            attr = getattr(door, name)
            if name in ("call_planned", "__call__"):
                return lambda *a, **k: (launches.append(name), attr(*a, **k))[1]
            return attr

        def __call__(self, *a, **k):
            launches.append("__call__")
            return door(*a, **k)

    cases = [(FP8Recipe(granularity), rms, fused) for granularity in ("per_tensor", "per_token", "per_group")
             for rms, fused in ((True, False), (False, True))]
    cases += [(FP8Recipe("per_tensor", torch.float8_e5m2, pow2_scales=True), True, True),
              (FP8Recipe("per_token", scale_ub=0.01), True, False)]
    from triton_layers.kernels import ops as kernel_ops

    real = kernel_ops.norm_fp8_door
    kernel_ops.norm_fp8_door = Spy()
    try:
        for recipe, rms, fused in cases:
            op = F.rms_norm_fp8 if rms else F.layer_norm_fp8
            kw = {} if rms else {"bias": None}
            outs = []
            for sharded in (True, False):
                if sharded:
                    leaves = [distribute_tensor(t, mesh, [Shard(1)]) for t in (x, r)]
                    leaves += [distribute_tensor(t, mesh, [Replicate()]) for t in (w, b)]
                else:
                    leaves = [t.clone() for t in (x, r, w, b)]
                xi, ri, wi, bi = (t.requires_grad_() for t in leaves)
                if not rms:
                    kw = {"bias": bi}
                launches.clear()
                out = op(xi, wi, residual=ri if fused else None, recipe=recipe, **kw)
                called = list(launches)
                gi = distribute_tensor(g, mesh, [Shard(1)]) if sharded else g
                loss = (out.activation.float() * gi).sum()
                if fused:
                    loss = loss + (out.h.float() * gi).sum()
                loss.backward()
                full = [_gathered(o) for o in (out.data, out.scale, out.h)]
                grads = [t.grad.full_tensor() if isinstance(t.grad, DTensor) else t.grad for t in (xi, ri, wi, bi)]
                outs.append((full, grads, called))
            (data, scale, h), grads, called = outs[0]
            (data1, scale1, h1), grads1, _ = outs[1]
            label = f"{recipe} rms={rms} fused={fused}"
            assert called, f"{label}: the local rows did not go through the kernels"
            assert torch.equal(data.view(torch.uint8), data1.view(torch.uint8)), label
            torch.testing.assert_close(scale, scale1, rtol=4 * 2.0 ** -23, atol=0, msg=label)
            if fused:
                torch.testing.assert_close(h, h1, rtol=0, atol=0)
            for name, ours, one in zip("xrwb", grads, grads1):
                assert (ours is None) == (one is None), (label, name)
                if one is not None:
                    torch.testing.assert_close(ours, one, rtol=1e-5, atol=1e-5, msg=f"{label}: d{name}")
        # A rank with no rows (one row of sequence over the ranks): its empty shard still joins the
        # per-tensor scale's all-reduce (the floor's scale), and the gradients are one process's.
        for recipe in (FP8Recipe("per_tensor"), FP8Recipe("per_token")):
            x1 = x[:, :1].contiguous()
            xs = distribute_tensor(x1, mesh, [Shard(1)]).requires_grad_()
            ws = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
            out = F.rms_norm_fp8(xs, ws, recipe=recipe)
            out.activation.float().sum().backward()
            xo, wo = x1.clone().requires_grad_(), w.clone().requires_grad_()
            one = F.rms_norm_fp8(xo, wo, recipe=recipe)
            one.activation.float().sum().backward()
            assert torch.equal(_gathered(out.data).view(torch.uint8), one.data.view(torch.uint8)), recipe
            torch.testing.assert_close(_gathered(xs.grad), xo.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(_gathered(ws.grad), wo.grad, rtol=1e-5, atol=1e-5)
        # Placements that are not row-local (a shard of the normalized dim), and layouts over the
        # flattened rows (column-major scales, the transposed copy): replicated first, then the
        # kernels on the whole on every rank; one process's results, replicated.
        for placement, recipe in ((Shard(2), FP8Recipe("per_token")),
                                  (Shard(1), FP8Recipe("per_group", column_major_scales=True)),
                                  (Shard(1), FP8Recipe("per_group", transposed=True))):
            launches.clear()
            out = F.rms_norm_fp8(distribute_tensor(x, mesh, [placement]), distribute_tensor(w, mesh, [Replicate()]),
                                 recipe=recipe)
            assert launches and all(t.placements == (Replicate(),) for t in (out.data, out.scale)), (placement, recipe)
            one = F.rms_norm_fp8(x, w, recipe=recipe)
            assert torch.equal(out.data.to_local().view(torch.uint8), one.data.view(torch.uint8)), (placement, recipe)
            assert torch.equal(out.scale.to_local(), one.scale) and out.scale.to_local().stride() == one.scale.stride()
            if recipe.transposed:
                assert torch.equal(out.data_t.to_local().view(torch.uint8), one.data_t.view(torch.uint8))
                assert torch.equal(out.scale_t.to_local(), one.scale_t)
    finally:
        kernel_ops.norm_fp8_door = real


def test_fp8_norms_on_row_sharded_dtensors():
    _spawn(2, _fp8_rows_sharded)
