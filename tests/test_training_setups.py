"""Every op under the ways PyTorch trains: saved-tensor hooks (offloading, re-laid copies),
activation checkpointing, double backward, tensor subclasses; typed plan keys; Triton's own
switches; the plan check (``TRITON_LAYERS_CHECK_PLANS``). Each case first makes its plans on
plain calls, then runs the setup on the same signatures: on 69d3fc2 the cached plans ran on
tensors they were not made for (wrong gradients, or a CUDA fault on a GPU)."""
from __future__ import annotations

import copy

import zlib

import pytest
import torch
import torch.nn.functional as TF
from torch.utils.checkpoint import checkpoint

import triton_layers
from triton_layers import functional as F
from triton_layers import reference
from triton_layers.calls import doors as _doors, eager as _eager

from .training_cases import CARDS, LAYOUTS, OPS, check_grads, make, misaligned_copy, plain_run, rel_err, rows

DTYPE_CASES = [torch.float32, torch.bfloat16]


def _warm(name, device, dtype, layout, gen):
    """The case, with its plans made by a plain forward and backward first."""
    ours, exact, inputs = make(name, device, dtype, layout, gen)
    check_grads(name, dtype, ours, exact, inputs, gen)
    return ours, exact, inputs


def under(hooks):
    """A ``run`` for :func:`check_grads` whose forward runs under ``hooks()`` (a context manager)."""
    def run(fn, inputs, dy):
        leaves = [t for t in inputs if t.requires_grad]
        with hooks():
            y = fn(*inputs)
        return y, torch.autograd.grad(y, leaves, dy.to(y.dtype))
    return run


def _restrided_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in another layout: its last dim padded (rows with another row stride),
    or one element into its buffer (not 16-byte aligned) for 1-D and 0-D tensors."""
    if t.dim() >= 2:
        wide = torch.empty(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype, device=t.device)
        out = wide[..., : t.shape[-1]]
    else:
        out = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    return out.copy_(t)


HOOKS = {
    "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(),
    "restrided": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, _restrided_copy),
    "misaligned": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach().clone(), misaligned_copy),
}


@pytest.mark.parametrize("hooks", list(HOOKS))
@pytest.mark.parametrize("layout", ["strided", "contiguous"])
@pytest.mark.parametrize("name", OPS)
def test_saved_tensor_hooks(name, layout, hooks, device):
    """Saved tensors handed back by hooks in another layout or alignment: the backward plans
    for them (a plan made for the tensors the forward saved must not run on them)."""
    # (a seed of the case's own: Python's hash() of strings changes from process to process)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{layout}/{hooks}".encode()))
    ours, exact, inputs = _warm(name, device, torch.float32, layout, gen)
    check_grads(name, torch.float32, ours, exact, inputs, gen, run=under(HOOKS[hooks]))
    check_grads(name, torch.float32, ours, exact, inputs, gen)  # and back


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", OPS)
def test_activation_checkpointing(name, reentrant, device):
    """torch.utils.checkpoint, reentrant or not: the forward runs again inside the backward."""
    gen = torch.Generator().manual_seed(7)
    ours, exact, inputs = _warm(name, device, torch.float32, "strided", gen)

    def run(fn, inputs, dy):
        leaves = [t for t in inputs if t.requires_grad]
        y = checkpoint(fn, *inputs, use_reentrant=reentrant)
        return y, torch.autograd.grad(y, leaves, dy.to(y.dtype)) if not reentrant else _reentrant_grads(y, leaves, dy)

    check_grads(name, torch.float32, ours, exact, inputs, gen, run=run)


def _reentrant_grads(y, leaves, dy):
    # The reentrant checkpoint supports .backward() only (not autograd.grad).
    for t in leaves:
        t.grad = None
    y.backward(dy.to(y.dtype))
    grads = tuple(t.grad for t in leaves)
    for t in leaves:
        t.grad = None
    return grads


# --- double backward ----------------------------------------------------------------------

def _penalty(fn, inputs, gen):
    """A gradient penalty: the gradient of |d(sum(y * c))/d inputs|^2 with respect to the inputs."""
    leaves = [t for t in inputs if t.requires_grad]
    y = fn(*inputs)
    c = torch.randn(y.shape, generator=gen).to(device=y.device, dtype=y.dtype)
    grads = torch.autograd.grad((y * c).sum() + 0.1 * y.float().pow(2).sum(), leaves, create_graph=True)
    return torch.autograd.grad(sum(g.float().pow(2).sum() for g in grads), leaves, allow_unused=True)


@pytest.mark.parametrize("name", OPS)
def test_double_backward_matches_float64(name, device):
    """create_graph=True through an op (a gradient penalty): the second-order terms are there,
    against the same penalty through the float64 definition (max error 223 on 69d3fc2)."""
    gen = torch.Generator().manual_seed(11)
    ours, exact, inputs = _warm(name, device, torch.float32, "strided", gen)
    got = _penalty(ours, inputs, torch.Generator().manual_seed(3))
    want = _penalty(exact, inputs, torch.Generator().manual_seed(3))
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None or g.abs().max() < 1e-6
            continue
        assert g is not None, f"{name}: grad {i} missing"
        assert rel_err(g, w) < (5e-3 if name == "coor_descent" else 1e-3), f"{name} grad {i}: {rel_err(g, w):.3g}"


# the references in float64, where gradgradcheck checks their own second derivatives: name ->
# (the reference, its arguments): the cards' references
REFERENCES = rows("references")


@pytest.mark.parametrize("name", list(REFERENCES))
def test_references_have_second_derivatives(name):
    """The double backward's torch ops: torch.autograd.gradgradcheck of each reference in float64."""
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    fn, args = REFERENCES[name]
    assert torch.autograd.gradgradcheck(fn, args(r, g))


PENALTY_MODULES = rows("penalty_modules")


@pytest.mark.parametrize("module", list(PENALTY_MODULES))
def test_double_backward_through_modules(module, device):
    """A gradient penalty through each module: the same as through the torch layer."""
    torch.manual_seed(2)
    ours, ref = PENALTY_MODULES[module](device)
    if isinstance(ref, torch.nn.Module):
        with torch.no_grad():
            for p in ours.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + 1)
        ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 24, device=device, requires_grad=True)

    def penalty(fn):
        gx, = torch.autograd.grad((fn(x) * torch.arange(24.0, device=device)[:fn(x).shape[-1]]).sum()
                                  if fn(x).dim() == 3 else fn(x).pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), x)[0]

    assert rel_err(penalty(ours), penalty(ref)) < 1e-3


def test_double_backward_without_a_differentiable_backward_names_the_op(device, monkeypatch):
    """An op whose description has no differentiable backward raises, naming it, instead of
    dropping the second-order term."""
    from triton_layers.kernels import ops

    monkeypatch.setattr(ops.softmax, "desc", ops.softmax.desc.__class__(
        **{**ops.softmax.desc.__dict__, "backward_graph": None}))
    x = torch.randn(2, 5, 7, device=device, requires_grad=True)
    y = F.softmax(x, causal=True)
    with pytest.raises(RuntimeError, match="softmax.*not differentiable"):
        torch.autograd.grad((y * torch.randn_like(y)).sum(), x, create_graph=True)


# --- plan keys ----------------------------------------------------------------------------

@pytest.mark.parametrize("call, bad", [
    (lambda x, v: F.softmax(x, scale=v), True),  # scale=True after scale=1
    (lambda x, v: F.coor_descent(x, n_iters=v, k=2.0), True),  # n_iters=True after 1
    (lambda x, v: F.coor_descent(x, n_iters=v, k=2.0), 2.0),  # n_iters=2.0 after 2
    (lambda x, v: F.coor_descent(x, n_iters=2, k=v), True),  # k=True after 1
    (lambda x, v: F.coor_descent(x, n_iters=2, k=2.0, eps=v), True),  # eps=True after 1
])
def test_plan_keys_are_typed(call, bad, device):
    """A value equal to a planned one but of another type (True == 1 == 1.0) is a new key:
    its checks run and reject it, as on a fresh call."""
    x = torch.randn(3, 8, device=device)
    good = {True: 1, 2.0: 2}[bad] if not isinstance(bad, bool) or bad is not True else 1
    for _ in range(2):
        call(x, good)
    with pytest.raises((TypeError, ValueError)):
        call(x, bad)


# --- Triton's own switches ----------------------------------------------------------------

def test_the_cached_launch_steps_aside_for_tritons_switches(monkeypatch):
    """Triton's debug switch, its instrumentation mode, a stages-inspection hook and a kernel's
    pre-run hooks each send the eager launch through Triton's own ``JITFunction.run`` (which
    compiles the variant they ask for and calls the hooks); with none set, ours runs."""
    from triton import knobs

    from triton_layers.kernels._launcher import TritonRuntime

    runtime = TritonRuntime.__new__(TritonRuntime)  # (without a GPU driver's stream)
    runtime.read_knobs(knobs)

    hooks: list = []  # a kernel's pre_run_hooks (Triton appends to the list in place)
    assert not runtime.stepped_aside(hooks)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert runtime.stepped_aside(hooks)
    monkeypatch.setattr(knobs.runtime, "debug", False)
    monkeypatch.setattr(knobs.compilation, "instrumentation_mode", "fpsan")
    assert runtime.stepped_aside(hooks)
    monkeypatch.setattr(knobs.compilation, "instrumentation_mode", "")
    hooks.append(lambda *a, **k: None)
    assert runtime.stepped_aside(hooks)
    hooks.clear()
    if hasattr(knobs.runtime, "add_stages_inspection_hook"):
        monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", lambda: ("k", "h"))
        assert runtime.stepped_aside(hooks)
        monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", None)
    assert not runtime.stepped_aside(hooks)
    enter = knobs.runtime.launch_enter_hook
    if hasattr(enter, "add"):  # (a chain of hooks, added to in place after a quiet look)
        hook = lambda *a, **k: None  # noqa: E731
        enter.add(hook)
        try:
            assert runtime.stepped_aside(hooks) and runtime.stepped_aside(hooks)
        finally:
            enter.remove(hook)
        assert not runtime.stepped_aside(hooks)
    monkeypatch.setattr(knobs.runtime, "debug", True)  # (after quiet looks too)
    assert runtime.stepped_aside(hooks)
    monkeypatch.undo()
    assert not runtime.stepped_aside(hooks)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pre-run hooks run on a GPU launch (the interpreter "
                    "launches through Triton's own run on every call)")
def test_pre_run_hooks_run_on_every_planned_call(device):
    """A kernel's pre-run hook is called on every planned launch (0 of 3 on 69d3fc2)."""
    from triton_layers.kernels import softmax as softmax_kernels

    x = torch.randn(4, 40, device=device)
    F.softmax(x)
    calls = []
    hook = lambda *a, **k: calls.append(1)  # noqa: E731
    softmax_kernels._softmax_fwd_kernel.add_pre_run_hook(hook)
    try:
        for _ in range(3):
            F.softmax(x)
    finally:
        softmax_kernels._softmax_fwd_kernel.pre_run_hooks.remove(hook)
    assert len(calls) == 3


# --- tensor subclasses --------------------------------------------------------------------

def test_fake_tensors_never_reach_a_launcher(device, monkeypatch):
    """Under FakeTensorMode (shape inference outside torch.compile), every op gives fakes of
    the right shape and dtype, launching nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    launched = []
    monkeypatch.setattr(_doors.Op, "call_planned", lambda *a: launched.append(a))
    with FakeTensorMode():
        x = torch.randn(3, 5, 24, device=device)
        w = torch.ones(24, device=device)
        for card in CARDS.values():
            for out, shape in card.fake_shapes(x, w) if card.fake_shapes else ():
                assert out.shape == shape, card.name
    assert not launched


def test_the_eager_door_refuses_a_subclass(device):
    """The safety net: a plan is never made for a tensor subclass (no launch on one)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from triton_layers.kernels import ops

    with FakeTensorMode():
        x = torch.randn(3, 24, device=device)
        with pytest.raises(TypeError, match="norm.*FakeTensor"):
            ops.norm.plan(x, None, None, 1e-5, False, False, False, False, x.dtype)


@pytest.fixture
def one_rank_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if owned:
            dist.destroy_process_group()


@pytest.mark.parametrize("module", ["TritonLayerNorm", "TritonRMSNorm"])
def test_dtensors_never_reach_the_eager_door(module, one_rank_mesh, monkeypatch):
    """A DTensor input (tensor parallel's SequenceParallel hands the norm one) never reaches the
    eager door's launch as a wrapper: the door for DTensors (calls/dtensor.py) hands it
    the local shards, plain tensors (tests/test_tensor_parallel.py: that and the custom op's
    sharding rule); the output and the gradients are the plain call's."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    planned = []
    real, real_shards = _doors.Op.call_planned, _doors.Op.call_on_shards
    monkeypatch.setattr(_doors.Op, "call_planned", lambda self, plan, *a: (
        planned.append({type(t) for t in a if isinstance(t, torch.Tensor)}), real(self, plan, *a))[1])
    monkeypatch.setattr(_doors.Op, "call_on_shards", lambda self, door, shards, args: (
        planned.append({type(t) for t in shards if isinstance(t, torch.Tensor)}),
        real_shards(self, door, shards, args))[1])
    layer = getattr(triton_layers, module)(24)
    with torch.no_grad():
        layer.weight.normal_()
    x = torch.randn(4, 6, 24, requires_grad=True)
    want = layer(x)
    want_grads = torch.autograd.grad(want.pow(2).sum(), (x, layer.weight))
    planned.clear()
    parallelize_module(layer, one_rank_mesh, SequenceParallel(use_local_output=False))
    dx = distribute_tensor(x.detach(), one_rank_mesh, [Shard(1)]).requires_grad_()
    got = layer(dx)
    got_grads = torch.autograd.grad(got.pow(2).sum(), (dx, layer.weight))
    from triton_layers import _checks

    # (the kernels run on CPU tensors under TRITON_INTERPRET=1 alone; else the reference, unplanned)
    assert bool(planned) == _checks.TRITON_INTERPRET and all(kinds <= {torch.Tensor} for kinds in planned), planned
    torch.testing.assert_close(got.full_tensor(), want, atol=1e-5, rtol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g.full_tensor(), w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fused", [False, True], ids=["norm", "fused_residual"])
def test_dtensor_door_double_backward(fused, one_rank_mesh):
    """A gradient penalty through the DTensor door (create_graph=True: its backward runs the op's
    differentiable backward on the DTensors), and a second call of the same signature (the door
    kept): gradients of the inputs and the weight equal the plain module's in float64."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from triton_layers.parallel import SequenceParallel

    layer = triton_layers.TritonRMSNorm(24)
    with torch.no_grad():
        layer.weight.normal_()
    exact = copy.deepcopy(layer).double()
    gen = torch.Generator().manual_seed(3)
    x, r = torch.randn(4, 6, 24, generator=gen), torch.randn(4, 6, 24, generator=gen)

    def penalty(norm, x, r):
        inputs = (x, r) if fused else (x,)
        out = norm(x, residual=r)[0] if fused else norm(x)
        grads = torch.autograd.grad((out * out.detach().sin()).sum(), inputs, create_graph=True)
        return sum(g.pow(2).sum() for g in grads), inputs

    xe, re_ = x.double().requires_grad_(), r.double().requires_grad_()
    loss, inputs = penalty(exact, xe, re_)
    want = torch.autograd.grad(loss, (*inputs, exact.weight))
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(layer, one_rank_mesh, SequenceParallel(use_local_output=False))
    for _ in range(2):
        xs = distribute_tensor(x, one_rank_mesh, [Shard(1)]).requires_grad_()
        rs = distribute_tensor(r, one_rank_mesh, [Shard(1)]).requires_grad_()
        loss, inputs = penalty(layer, xs, rs)
        got = torch.autograd.grad(loss, (*inputs, layer.weight))
        for g, w in zip(got, want):
            g = g.redistribute(placements=[Replicate()]).to_local() if g.placements != (Replicate(),) else g.to_local()
            torch.testing.assert_close(g.double(), w, atol=2e-4, rtol=2e-4)


# --- the plan check -----------------------------------------------------------------------

def test_the_plan_check_passes_on_every_op(device):
    """TRITON_LAYERS_CHECK_PLANS (here :func:`checking_plans`): every planned call, forward and
    backward, re-planned and compared, over the cases and the hooks above."""
    gen = torch.Generator().manual_seed(13)
    with _eager.checking_plans():
        for name in OPS:
            for layout in LAYOUTS:
                ours, exact, inputs = make(name, device, torch.float32, layout, gen)
                for run in (plain_run, plain_run, under(HOOKS["restrided"]), plain_run):
                    check_grads(name, torch.float32, ours, exact, inputs, gen, run=run)


def test_the_plan_check_catches_a_key_that_misses_something(device, monkeypatch):
    """The check can fail: with the backward key blind to the saved tensors' strides (the bug
    of 69d3fc2), a re-laid saved tensor meets the cached plan and the check raises."""
    gen = torch.Generator().manual_seed(17)
    ours, exact, inputs = _warm("layer_norm", device, torch.float32, "strided", gen)
    monkeypatch.setattr(_eager, "backward_key", lambda grads, saved: tuple(
        None if t is None else (t.shape, t.dtype) for t in (*grads, *saved)))
    _eager.clear_plans()
    check_grads("layer_norm", torch.float32, ours, exact, inputs, gen)
    with _eager.checking_plans(), pytest.raises(_eager.PlanMismatch):
        check_grads("layer_norm", torch.float32, ours, exact, inputs, gen, run=under(HOOKS["restrided"]))
