"""The launch boundary's one rule, over every op and module, forward and backward: a kernel
launch receives only plain tensors whose memory may be read now.

- An ``AsyncCollectiveTensor`` (a functional collective's result, maybe still in flight) as an
  input, as an upstream gradient, or as a DTensor's local tensor is waited first, as torch's
  own ops do, and the kernels run on its data.
- A ``__torch_dispatch__`` wrapper, a ``__torch_function__`` subclass: their own protocol or the
  reference, with the right result.
- FakeTensor under ``FakeTensorMode`` and meta tensors: the right shapes and dtypes, no launch.
- A jagged NestedTensor: a clear error, no launch.

Every launch is watched (:func:`launches`): one whose tensors are not all plain fails the test,
whatever the result. Results are compared with float64 (``training_cases``); the collectives
run on a one-rank gloo group in this process (no second process is needed to make one).
"""
from __future__ import annotations

import os
import tempfile
import zlib

import pytest
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

import triton_layers as tl
from triton_layers.calls import eager as _eager, fast_launch as _fast_launch
from tests import training_cases as cases

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launches(monkeypatch) -> list:
    """Every eager kernel launch's tensors, in order; a launch on anything but plain tensors
    fails at once (the rule under test)."""
    seen: list = []
    call = _fast_launch.KernelCall.__call__

    def watched(self, launcher, *tensors):
        if launcher is _fast_launch.direct:
            kinds = [type(t).__name__ for t in tensors if isinstance(t, torch.Tensor)
                     and type(t) not in _eager.PLAIN_TENSORS]
            assert not kinds, f"a kernel launched on {kinds}"
            seen.append(tensors)
        return call(self, launcher, *tensors)

    monkeypatch.setattr(_fast_launch.KernelCall, "__call__", watched)
    return seen


@pytest.fixture(scope="module")
def group():
    """A one-rank process group in this process, for real functional collectives (gloo for CPU
    tensors, NCCL for CUDA ones: gloo's CUDA all-gather is not one to wait on)."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    backend = "cpu:gloo,cuda:nccl" if DEVICE == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(backend, init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            yield dist.group.WORLD
        finally:
            dist.destroy_process_group()


def in_flight(t: torch.Tensor, group) -> torch.Tensor:
    """``t``'s values as an ``AsyncCollectiveTensor`` (a one-rank all-reduce: the same values)."""
    from torch.distributed import _functional_collectives as funcol

    out = funcol.all_reduce(t.detach(), "sum", group)
    assert _eager.is_async_collective(type(out)), type(out)
    return out


class Wrapped(torch.Tensor):
    """A ``__torch_dispatch__`` wrapper subclass: every op unwraps, runs, rewraps (the shape of
    Float8 and quantized tensors, of torch's own test subclasses)."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                   device=elem.device, storage_offset=elem.storage_offset())

    def __init__(self, elem: torch.Tensor):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.elem if isinstance(t, Wrapped) else t  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda t: Wrapped(t) if isinstance(t, torch.Tensor) else t, out)


class Functioned(torch.Tensor):
    """A ``__torch_function__`` subclass (its data is a plain tensor's; it only watches calls)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Functioned.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def plain(t):
    """A result or gradient as a plain tensor, whatever class it came as."""
    if t is None:
        return None
    if isinstance(t, Wrapped):
        return t.elem
    if _eager.is_async_collective(type(t)):
        return t.trigger_wait()
    if isinstance(t, Functioned):
        return t.as_subclass(torch.Tensor)
    return t


def as_kind(kind: str, t: torch.Tensor, group) -> torch.Tensor:
    """``t``'s values as a leaf of ``kind`` (requiring a gradient where ``t`` does)."""
    if kind == "in_flight":
        out = in_flight(t, group)
    elif kind == "dispatch":
        out = Wrapped(t.detach().clone())
    elif kind == "function":
        out = t.detach().clone().as_subclass(Functioned)
    else:
        raise KeyError(kind)
    return out.requires_grad_(t.requires_grad)


def _gen(*names) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(names).encode()))


def _run_with(kind: str, where: str, group):
    """A ``training_cases`` run with the inputs (``where="inputs"``) or the upstream gradient
    (``"grads"``) of ``kind``."""
    def run(fn, inputs, dy):
        if where == "inputs":
            inputs = [as_kind(kind, t, group) if t.requires_grad else t for t in inputs]
        leaves = [t for t in inputs if t.requires_grad]
        y = fn(*inputs)
        dy = dy.to(plain(y).dtype)
        if where == "grads":
            dy = in_flight(dy, group) if kind == "in_flight" else as_kind(kind, dy, group).requires_grad_(False)
        grads = torch.autograd.grad(y, leaves, dy)
        return plain(y), [plain(g) for g in grads]
    return run


@pytest.mark.parametrize("name", cases.OPS)
@pytest.mark.parametrize("kind, where", [("in_flight", "inputs"), ("in_flight", "grads"), ("dispatch", "inputs"),
                                         ("dispatch", "grads"), ("function", "inputs")])
def test_every_op_on_each_kind(name, kind, where, group, launches):
    """Every op's output and every input's gradient against float64, with inputs or the upstream
    gradient of each kind; no launch on anything but plain tensors (the fixture). Collectives in
    flight run the kernels (launches are made, on their waited data); the dispatch and function
    subclasses' inputs take the reference (torch's ops, which their classes define)."""
    gen = _gen(name, kind, where)
    ours, exact, inputs = cases.make(name, DEVICE, torch.float32, "contiguous", gen)
    cases.check_grads(name, torch.float32, ours, exact, inputs, gen, run=_run_with(kind, where, group))
    kernels_ran = bool(launches)
    if kind == "in_flight" or where == "grads":  # (the forward on plain inputs launches in any case)
        assert kernels_ran, f"{name}: the kernels did not run on the waited collective"
    else:
        assert not kernels_ran, f"{name}: a kernel ran for a {kind} subclass's inputs"


def test_a_waited_input_keeps_its_autograd_history(group, launches):
    """An in-flight input inside a graph (the autograd-aware all-gather of ``2 * x``): the
    gradient reaches ``x`` through the wait."""
    from torch.distributed import _functional_collectives as funcol

    gen = _gen("history")
    x = torch.randn(5, 24, generator=gen).to(DEVICE).requires_grad_()
    w = (1 + 0.3 * torch.randn(24, generator=gen)).to(DEVICE)
    gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd  # (torch 2.11)
    z = gather(2.0 * x, 0, group)
    assert _eager.is_async_collective(type(z)) and z.requires_grad
    out = tl.functional.rms_norm(z, w)
    dy = torch.randn(out.shape, generator=gen).to(DEVICE)
    (gx,) = torch.autograd.grad(out, x, dy)
    x64 = x.detach().double().requires_grad_()
    want = torch.nn.functional.rms_norm(2.0 * x64, (24,), w.double(), torch.finfo(torch.float32).eps)
    (wx,) = torch.autograd.grad(want, x64, dy.double())
    assert cases.rel_err(plain(out), want) < 1e-5
    assert cases.rel_err(gx, wx) < 1e-5
    assert launches


def _modules(gen) -> list:
    """Every module, with an input: ``(name, module, inputs, kwargs)`` (the cards' zoo_modules)."""
    r = lambda *s: torch.randn(*s, generator=gen).to(DEVICE)  # noqa: E731
    return [m for card in cases.CARDS.values() if card.zoo_modules for m in card.zoo_modules(r)]


def _outputs(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in (out if isinstance(out, tuple) else tuple(out)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("kind", ["in_flight", "dispatch", "function"])
def test_every_module_on_each_kind(kind, group, launches):
    """Every module on inputs of each kind, forward and backward: the same outputs and gradients
    (inputs' and parameters') as on plain tensors."""
    for name, module, inputs, kwargs in _modules(_gen("modules", kind)):
        want_in = [t.clone().requires_grad_() for t in inputs]
        want = _outputs(module(*want_in, **kwargs))
        want_grads = torch.autograd.grad([o.float().sum() for o in want if o.requires_grad],
                                         [*want_in, *module.parameters()], allow_unused=True)
        got_in = [as_kind(kind, t.requires_grad_(), group) for t in inputs]
        got = _outputs(module(*got_in, **kwargs))
        got_grads = torch.autograd.grad([o.float().sum() for o in got if o.requires_grad],
                                        [*got_in, *module.parameters()], allow_unused=True)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            torch.testing.assert_close(plain(g), w, rtol=2e-5, atol=2e-5, msg=name)
        for g, w in zip(got_grads, want_grads):
            assert (g is None) == (w is None), name
            if w is not None:
                torch.testing.assert_close(plain(g), w, rtol=2e-5, atol=2e-5, msg=f"{name} gradient")


def test_a_dtensor_whose_local_tensor_is_in_flight(group, launches):
    """A DTensor whose local tensor is a collective in flight (what a redistribution leaves),
    forward and backward, also with an in-flight gradient inside a DTensor: as plain DTensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh(DEVICE, (1,))
    gen = _gen("dtensor")
    x = torch.randn(6, 24, generator=gen).to(DEVICE)
    w = (1 + 0.3 * torch.randn(24, generator=gen)).to(DEVICE)
    dy = torch.randn(6, 24, generator=gen).to(DEVICE)
    results = []
    for local in (x.clone(), in_flight(x, group)):
        xd = DTensor.from_local(local, mesh, (Shard(0),), run_check=False).detach().requires_grad_()
        wd = DTensor.from_local(w.clone(), mesh, (Replicate(),), run_check=False).detach().requires_grad_()
        y = tl.functional.rms_norm(xd, wd)
        gy = DTensor.from_local(in_flight(dy, group) if len(results) else dy, mesh, (Shard(0),), run_check=False)
        gx, gw = torch.autograd.grad(y, (xd, wd), gy)
        results.append([plain(t.to_local()) if isinstance(t, DTensor) else plain(t) for t in (y, gx, gw)])
    for got, want in zip(*results[::-1]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _meta_calls(factory):
    """Each op on tensors made by ``factory(shape, requires_grad)``: (name, output, the main
    input's gradient)."""
    w = factory((24,), True)
    calls = {card.name: card.meta_call(factory, w) for card in cases.CARDS.values() if card.meta_call}
    for name, (shape, call) in calls.items():
        x = factory(shape, True)
        y = call(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        yield name, x, y, g


def test_fake_tensors_under_fake_mode_never_launch(launches):
    """FakeTensors under FakeTensorMode: every op gives the shapes and dtypes of its result and of
    the gradient, and launches nothing."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        for name, x, y, g in _meta_calls(lambda s, rg: torch.randn(*s, device=DEVICE, requires_grad=rg)):
            assert isinstance(y, FakeTensor) and isinstance(g, FakeTensor), name
            assert y.dtype == torch.float32 and g.shape == x.shape, name
    assert not launches


def test_meta_tensors_never_launch(launches):
    """Meta tensors: the result's shape and dtype, forward and backward, and no launch."""
    for name, x, y, g in _meta_calls(lambda s, rg: torch.empty(*s, device="meta", requires_grad=rg)):
        assert y.is_meta and y.dtype == torch.float32, name
        assert g.is_meta and g.shape == x.shape, name
    assert not launches


@pytest.mark.parametrize("name", [card.name for card in cases.CARDS.values() if card.jagged_call])
def test_a_jagged_nested_tensor_is_refused_clearly(name, launches):
    """A jagged NestedTensor: a TypeError naming its layout, never a launch."""
    nt = torch.nested.nested_tensor([torch.randn(3, 24), torch.randn(5, 24)], layout=torch.jagged, device=DEVICE)
    with pytest.raises(TypeError, match="jagged"):
        cases.CARDS[name].jagged_call(nt)
    assert not launches
