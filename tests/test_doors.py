"""Both doors of every op give the same results, bitwise: the torch.library custom op
(what torch.compile traces) and the eager autograd.Function, both built by
``calls/doors.py`` from one description per op. Also: the descriptions themselves
(every gradient is named after an input that exists) and the launch-config switch.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from triton_layers import functional as F
from triton_layers import launch_config
from triton_layers.calls import doors as _doors, eager as _eager, fast_launch as _fast_launch
from triton_layers.kernels import _common
from triton_layers.kernels import ops as kernel_ops

from .conftest import SMALL, spy_main_inputs
from .training_cases import CARDS, FP32, misaligned_copy, rows
from .training_cases import randn_leaf as _r


# kernel op form -> a builder of its 2-D inputs (in the description's order) on a device: the cards' doors.
CASES = rows("doors")


def _run(fn, args):
    """fn(*args) (one output or several) and the gradients of every tensor argument that
    requires one, for a fixed gradient of each output."""
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    ys = fn(*args)
    ys = (ys,) if isinstance(ys, torch.Tensor) else tuple(ys)
    gen = torch.Generator(device=ys[0].device).manual_seed(1)
    dys = [torch.randn(y.shape, device=y.device, generator=gen).to(y.dtype) for y in ys]
    return [*(y.detach() for y in ys), *torch.autograd.grad(ys, leaves, dys)]


@pytest.mark.parametrize("looped", [False, True], ids=["fused", "looped"])
@pytest.mark.parametrize("case", list(CASES))
def test_custom_op_door_matches_eager_door(case, looped, device):
    op = getattr(kernel_ops, case.split("-")[0])
    n_out = len(op.desc.outputs)
    args = CASES[case](device)
    with launch_config.use_config(SMALL if looped else launch_config.DEFAULT):
        eager = _run(op, args)  # the eager door (a plan made for this call)
        # The custom op returns the outputs and the statistics kept for the backward.
        compiled = _run(lambda *a: op.forward_op(*a)[:n_out] if len(op.desc.residuals) else op.forward_op(*a), args)
    assert len(eager) == len(compiled) > 1
    for a, b in zip(eager, compiled):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "no_input_needs_grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_calls_without_gradients_skip_autograd(case, how, device, monkeypatch):
    """Where no gradient can flow (no_grad, inference mode, inputs that need none) the op
    runs its forward alone, without the autograd.Function: the same outputs, bitwise."""
    op = getattr(kernel_ops, case.split("-")[0])
    args = CASES[case](device)
    with_grad = op(*args)
    with_grad = (with_grad,) if isinstance(with_grad, torch.Tensor) else with_grad
    assert all(y.grad_fn is not None for y in with_grad)

    def autograd_door(*_):
        raise AssertionError("the autograd.Function ran for a call that needs no gradient")

    monkeypatch.setattr(op, "_planned_apply", autograd_door)
    if how == "no_input_needs_grad":
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        without = op(*args)
    else:
        with torch.no_grad() if how == "no_grad" else torch.inference_mode():
            without = op(*args)
    without = (without,) if isinstance(without, torch.Tensor) else without
    assert len(without) == len(with_grad) == len(op.desc.outputs)
    for a, b in zip(with_grad, without):
        assert b.grad_fn is None and not b.requires_grad
        assert a.dtype == b.dtype and torch.equal(a.detach(), b)


@pytest.mark.parametrize("door", ["eager", "custom_op"])
def test_output_without_consumer(door, device):
    """Only h of residual_norm is used: its gradient reaches x and residual as is, the
    weight gets zeros; only y is used: no zero tensor is made for h's gradient."""
    op = kernel_ops.residual_norm
    fn = op if door == "eager" else (lambda *a: op.forward_op(*a)[:2])
    x, r, w = _r(4, 40, device=device), _r(4, 40, device=device), _r(40, device=device)
    y, h = fn(x, r, w, None, 1e-6, True, False, False, False, FP32, FP32)
    dh = torch.randn_like(h)
    gx, gr, gw = torch.autograd.grad(h, (x, r, w), dh, allow_unused=True)
    assert torch.equal(gx, dh) and torch.equal(gr, dh) and (gw is None or not gw.any())
    y, h = fn(x, r, w, None, 1e-6, True, False, False, False, FP32, FP32)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, r, w), dy)
    y, h = fn(x, r, w, None, 1e-6, True, False, False, False, FP32, FP32)
    want = torch.autograd.grad((y, h), (x, r, w), (dy, torch.zeros_like(h)))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", kernel_ops.__all__)
def test_descriptions_are_consistent(name):
    desc = getattr(kernel_ops, name).desc
    inputs = [n for n, _ in desc.inputs]
    assert set(desc.differentiable) <= set(inputs)
    assert len(set(inputs)) == len(inputs)
    # The custom ops' schemas were made from the descriptions.
    fwd = getattr(torch.ops.triton_layers, f"{name}_fwd").default._schema
    assert [a.name for a in fwd.arguments] == inputs
    assert len(fwd.returns) == len(desc.outputs) + len(desc.residuals)
    bwd = getattr(torch.ops.triton_layers, f"{name}_bwd").default._schema
    assert len(bwd.returns) == len(desc.differentiable)


def test_gradient_reaches_only_its_own_input(device):
    """With only the weight needing a gradient, it arrives there and nowhere else."""
    x, w = _r(7, 40, device=device, grad=False), _r(40, device=device)
    b = _r(40, device=device, grad=False)
    y = kernel_ops.norm(x, w, b, 1e-5, False, False, False, False, torch.float32)
    y.backward(torch.randn_like(y))
    assert w.grad is not None and x.grad is None and b.grad is None


def test_use_config_switches_and_restores():
    assert launch_config.current() is launch_config.DEFAULT
    with launch_config.use_config(launch_config.TINY) as cfg:
        assert launch_config.current() is cfg is launch_config.TINY
        assert _common.row_block(17, cfg.layer_norm.bwd_max_fused_cols, cfg.layer_norm.loop_block)[1] is False
    assert launch_config.current() is launch_config.DEFAULT
    with pytest.raises(TypeError, match="LaunchConfig"):
        with launch_config.use_config({"loop_block": 8}):
            pass
    with pytest.raises(Exception):
        launch_config.DEFAULT.layer_norm.loop_block = 8  # frozen


def test_use_knobs_changes_one_knob_of_one_op():
    """``use_knobs`` (``LaunchConfig.with_knobs`` under ``use_config``): the one knob changes,
    every other knob and op keeps its value, the plans kept are dropped on the way in and out,
    and a name that is no op or no knob is a TypeError naming what there is."""
    base, plans = launch_config.current(), _eager.PlanCache()
    plans.put("a key", "a plan")
    with launch_config.use_knobs("layer_norm", loop_block=8) as cfg:
        assert not plans
        plans.put("a key", "a plan")
        assert launch_config.current() is cfg and cfg.layer_norm.loop_block == 8
        assert dataclasses.replace(cfg.layer_norm, loop_block=base.layer_norm.loop_block) == base.layer_norm
        others = [f.name for f in dataclasses.fields(cfg) if f.name != "layer_norm"]
        assert [getattr(cfg, n) for n in others] == [getattr(base, n) for n in others]
        with launch_config.use_knobs("layer_norm", fwd_max_fused_cols=16) as inner:  # from the current config
            assert inner.layer_norm.loop_block == 8 and inner.layer_norm.fwd_max_fused_cols == 16
    assert launch_config.current() is base and not plans
    assert launch_config.DEFAULT.with_knobs("softmax", loop_block=64).softmax.loop_block == 64
    with pytest.raises(TypeError, match="no op 'layernorm'.*'layer_norm'"):
        launch_config.DEFAULT.with_knobs("layernorm", loop_block=8)
    with pytest.raises(TypeError, match="LayerNormLaunch has no knob 'loop_blocks'.*'loop_block'"):
        with launch_config.use_knobs("layer_norm", loop_blocks=8):
            pass
    assert launch_config.current() is base


# card -> (its kernel op, a public call of an N-D x that reaches it)
PUBLIC_CALLS = {card.name: (card.kernel_op, card.public_call) for card in CARDS.values() if card.public_call}


def test_every_op_has_a_card():
    """The ops are the library's own lists (``kernels.ops.__all__``, ``functional.__all__``);
    every one has its card in tests/training_cases.py, and every kernel op the forms and the
    public call the cross-cutting tests need from its cards, so a new op fails here, naming
    what is missing, rather than going untested."""
    ops = set(kernel_ops.__all__)
    assert {card.kernel_op for card in CARDS.values()} - {None} <= ops, "a card names no kernel op"
    assert {case.split("-")[0] for case in CASES} == ops, "tests/training_cases.py: a kernel op without doors"
    for card in CARDS.values():
        assert all(case.split("-")[0] == card.kernel_op for case in card.doors), card.name
    assert {op for op, _ in PUBLIC_CALLS.values()} == ops, "tests/training_cases.py: a kernel op without a public_call"
    assert {card.kernel_op for card in CARDS.values() if card.references} == ops, \
        "tests/training_cases.py: a kernel op without references (its double backward's)"
    assert {card.kernel_op for card in CARDS.values() if card.float64} == ops, \
        "tests/training_cases.py: a kernel op without float64 cases"
    for attr, what in (("planned_calls", "planned calls (bitwise again)"), ("pdl_launches", "PDL launches"),
                       ("decisions", "launch decisions (record them: tests/test_launch_decisions.py)"),
                       ("determinism", "determinism cases (tests/test_gpu_reliability.py)")):
        assert {card.kernel_op for card in CARDS.values() if getattr(card, attr)} - {None} == ops, \
            f"tests/training_cases.py: a kernel op without {what}"
    public = {name for name in F.__all__ if name != "uses_kernels"}
    assert public <= set(CARDS), "tests/training_cases.py: a public op without a card"


@pytest.mark.parametrize("card", list(PUBLIC_CALLS))
def test_contiguous_inputs_reach_the_kernels_as_they_are(card, device, monkeypatch):
    """No reshape (a view node in the graph: host time each way) between a contiguous N-D
    input and the kernel op; a non-contiguous one arrives as rows with last stride 1."""
    op, call = PUBLIC_CALLS[card]
    # Both ways into an op: planned (a signature met before, or a plan just made) and plain.
    seen = spy_main_inputs(monkeypatch, getattr(kernel_ops, op))
    x = torch.randn(2, 3, 5, 8, device=device, requires_grad=True)
    call(x).sum().backward()
    assert seen[-1] is x and x.grad.shape == x.shape
    call(x.transpose(1, 2))
    assert seen[-1].dim() == 2 and seen[-1].stride(-1) == 1


def test_fast_launch_key_separates_what_triton_specializes_on():
    """The eager door's cache of compiled kernels (``_fast_launch._key``) must give another key
    wherever Triton could compile another kernel: a tensor's dtype or 16-byte alignment, an
    argument's type (1, True and 1.0 are equal in Python), a constexpr's value, the device."""
    from triton_layers.calls.fast_launch import _key

    t = torch.zeros(16)
    base = _key(0, (t, 1, 2.0), {"BLOCK": 64})
    assert base == _key(0, (torch.ones(16), 1, 2.0), {"BLOCK": 64})  # same specialization
    differing = [
        _key(0, (t.half(), 1, 2.0), {"BLOCK": 64}),  # dtype
        _key(0, (t[1:], 1, 2.0), {"BLOCK": 64}),  # 4-byte offset: not 16-byte aligned
        _key(0, (t, True, 2.0), {"BLOCK": 64}),  # bool, equal to 1
        _key(0, (t, 1.0, 2.0), {"BLOCK": 64}),  # float, equal to 1
        _key(0, (t, 16, 2.0), {"BLOCK": 64}),  # another int value
        _key(0, (t, 1, 2.0), {"BLOCK": 128}),  # constexpr
        _key(0, (t, 1, 2.0), {"SIZE": 64}),  # constexpr name
        _key(1, (t, 1, 2.0), {"BLOCK": 64}),  # device
    ]
    assert all(k != base for k in differing)
    assert len(set(differing)) == len(differing)


class _Launcher36:
    """A launcher object with Triton 3.6's layout (``CudaLauncher``)."""

    def __init__(self, scratch=0):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.calls = []
        self.launch = lambda *args: self.calls.append(("c", args))

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.calls.append(("py", (gridX, gridY, gridZ, stream, function, *args)))


class _LauncherOther(_Launcher36):
    """Another layout (Triton 3.9's ``__call__`` names its metadata and hooks)."""

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):
        self.calls.append(("py", (gridX, gridY, gridZ, stream, function, kernel_metadata, *args)))


class _Compiled:
    def __init__(self, runner):
        self.run, self.packed_metadata, self.function = runner, "meta", "fn"


@pytest.mark.parametrize("runner, direct", [(_Launcher36(), True), (_Launcher36(scratch=64), False),
                                            (_LauncherOther(), False)])
def test_fast_launch_calls_the_c_launch_only_where_it_knows_the_layout(runner, direct):
    """A cached launch skips the launcher object's Python ``__call__`` (Triton 3.6's builds two
    closures a call) only where that object has 3.6's layout and the kernel needs no scratch
    buffer, and passes what ``__call__`` would have: grid, stream, function, cooperative and
    PDL flags, no scratch, the packed metadata, no launch metadata or hooks, the arguments."""
    from triton_layers.kernels._launcher import compiled_launcher

    compiled = _Compiled(runner)
    launch, prefix = compiled_launcher(compiled)
    launch(4, 1, 1, "stream", compiled.function, *prefix, "x", 7, "BLOCK")
    kind, args = runner.calls[-1]
    if direct:
        assert kind == "c"
        assert args == (4, 1, 1, "stream", "fn", False, True, None, None, "meta", None, None, None, "x", 7, "BLOCK")
    else:
        assert kind == "py"
        assert args[:6] == (4, 1, 1, "stream", "fn", "meta") and args[-3:] == ("x", 7, "BLOCK")


class _FakeRuntime:
    def __init__(self):
        self.hooks = False

    def stepped_aside(self, pre_run_hooks):
        return self.hooks

    def stream(self, device):
        return f"stream{device}"


class _FakeKernel:
    """A stand-in @triton.jit kernel: ``kernel[grid](...)`` is Triton's own launch."""

    def __init__(self, compiled):
        self.compiled, self.calls = compiled, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: (self.calls.append((grid, args, kwargs)), self.compiled)[1]


def test_kernel_call_launches_the_compiled_kernel_it_found(monkeypatch):
    """A planned launch (``KernelCall``) goes through the cached launch once, keeps the
    compiled kernel it found and then calls its C launch directly with what the cached
    launch passed (grid, the tensors' device's stream, arguments, constexpr values); with a
    launch hook set, every call goes through Triton's own launch; under ``wrap_triton``
    (any other launch) it never takes the shortcut."""
    runtime = _FakeRuntime()
    runner = _Launcher36()
    compiled = _Compiled(runner)
    kernel = _FakeKernel(compiled)
    fast = _fast_launch._FastLaunch.__new__(_fast_launch._FastLaunch)
    fast.kernel, fast.constexprs, fast.n_params, fast.compiled, fast.pre_run_hooks = kernel, ("BLOCK",), 3, {}, ()
    monkeypatch.setattr(_fast_launch, "_RUNTIME", [runtime])
    monkeypatch.setitem(_fast_launch._FAST, kernel, fast)
    monkeypatch.setattr(_fast_launch, "current_device", lambda: 1)
    t = torch.zeros(16)
    call = _fast_launch.KernelCall(kernel, (4, 2), (7,), {"BLOCK": 64}, 1)
    call(_fast_launch.direct, t)  # a first launch: through Triton, which compiles
    assert len(kernel.calls) == 1 and not runner.calls and call._hit is False
    call(_fast_launch.direct, t)  # now cached by _FastLaunch (keyed), then by the call itself (not keyed)
    assert call._hit
    call(_fast_launch.direct, t)
    want = ("c", (4, 2, 1, "stream1", "fn", False, True, None, None, "meta", None, None, None, t, 7, 64))
    assert runner.calls == [want, want]
    runtime.hooks = True
    call(_fast_launch.direct, t)
    assert len(kernel.calls) == 2 and len(runner.calls) == 2
    runtime.hooks = False
    traced = []
    call(lambda k: (traced.append(k), k)[1], t)
    assert traced == [kernel] and len(kernel.calls) == 3 and len(runner.calls) == 2


def _norm_case(device, **kw):
    x = torch.randn(5, 24, device=device, requires_grad=True)
    w = (1 + 0.5 * torch.randn(24, device=device)).requires_grad_()
    b = torch.randn(24, device=device, requires_grad=True)
    return x, w, b


def test_a_call_signature_is_planned_once_and_any_change_plans_again(device, monkeypatch):
    """The functional ops keep each eager call signature's plan (checks passed, launches
    decided): a repeated signature makes none, and whatever the plan read (shape, strides,
    alignment, dtype, requires_grad, the tensor's class, eps, the grad mode, autocast, the
    launch config) makes a new one. Every call's output and gradients are right."""
    made = []
    plan = _doors.Op.plan
    monkeypatch.setattr(_doors.Op, "plan", lambda self, *a: (made.append(self.desc.name), plan(self, *a))[1])
    _eager.clear_plans()
    x, w, b = _norm_case(device)
    misaligned = torch.randn(5 * 24 + 1, device=device)[1:].view(5, 24).requires_grad_()
    strided = torch.randn(5, 40, device=device)[:, 3:27].requires_grad_()

    def run(x, w, b, eps=1e-5, grad=True):
        y = F.layer_norm(x, w, b, eps)
        want = torch.nn.functional.layer_norm(x.detach().float(), (24,), w.detach(), b.detach(), eps)
        torch.testing.assert_close(y.float(), want, atol=2e-2 if y.dtype != torch.float32 else 1e-5, rtol=1e-2)
        if grad and y.requires_grad and x.dtype == torch.float32:
            dy = torch.randn(24, len(x), device=device).t()  # a transposed gradient: its own backward plan
            inputs = [t for t in (x, w, b) if t.requires_grad]
            got = torch.autograd.grad(y, inputs, dy)
            ref = torch.autograd.grad(torch.nn.functional.layer_norm(x, (24,), w, b, eps), inputs, dy)
            for g, r in zip(got, ref):
                torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)

    steps = [
        (lambda: run(x, w, b), 1),
        (lambda: run(x, w, b), 0),  # the same signature
        (lambda: run(torch.randn_like(x).requires_grad_(), w, b), 0),  # new values, same signature
        (lambda: run(torch.randn(7, 24, device=device), w, b), 1),  # shape (and requires_grad)
        (lambda: run(x.detach(), w, b), 1),  # requires_grad
        (lambda: run(misaligned, w, b), 1),  # 16-byte alignment
        (lambda: run(strided, w, b), 1),  # row stride
        (lambda: run(x, w, b, eps=1e-3), 1),
        (lambda: run(x, torch.nn.Parameter(w.detach()), b), 1),  # the tensor's class
        (lambda: run(x.half().detach(), w, b), 1),  # dtype
    ]
    for i, (step, new) in enumerate(steps):
        before = len(made)
        step()
        assert len(made) - before == new, f"step {i}: {len(made) - before} plans made, expected {new}"
    before = len(made)
    with torch.no_grad():
        run(x, w, b)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        assert F.layer_norm(x, w, b).dtype == torch.bfloat16
    with launch_config.use_config(launch_config.TINY):  # rows of 24 take the chunked path there
        run(x, w, b)
    run(x, w, b)  # back to the default config: its plans were dropped with the switch
    assert len(made) - before == 4


def test_a_planned_signature_still_rejects_bad_inputs(device):
    """A plan skips the checks only for the signature that passed them: a weight of another
    shape, dtype or device, or a non-tensor, still gets the checks' error."""
    x, w, b = _norm_case(device)
    F.layer_norm(x, w, b)
    F.layer_norm(x, w, b)
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(x, torch.randn(23, device=device), b)
    with pytest.raises(TypeError, match="weight"):
        F.layer_norm(x, w.to(torch.int32), b)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        F.layer_norm(x.tolist(), w, b)
    with pytest.raises(ValueError, match="eps"):
        F.layer_norm(x, w, b, eps=-1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the guard's logic, faked on the CPU (a faked device on a "
                    "GPU would file a compiled kernel under another device's key); tests/test_devices.py on 2 GPUs")
def test_a_planned_call_enters_its_tensors_device(device, monkeypatch):
    """A planned call whose tensors are not on the current CUDA device runs under that
    device's guard (Triton launches on the current device), and only then; the real thing
    runs in tests/test_devices.py where two GPUs are present."""
    x, w, b = _norm_case(device)
    op = kernel_ops.norm
    args = (x, w, b, 1e-5, False, False, False, False, x.dtype)
    plan = op.plan(*args)
    current = [0]
    entered = []

    class Guard:  # torch.cuda.device, recorded
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            current.append(self.index)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(torch.cuda, "device", Guard)
    monkeypatch.setattr(_doors, "current_device", lambda: current[-1])
    plan.device = 0  # on the current device: no guard
    want = op.call_planned(plan, *args)
    assert entered == []
    plan.device = 1  # as if the tensors lived on cuda:1
    got = op.call_planned(plan, *args)
    assert entered == [1] and current == [0]
    assert torch.equal(got, want)


PLANNED = rows("planned_calls")


def _planned_cases(device):
    r = lambda *s, **k: torch.randn(*s, device=device, **k)  # noqa: E731
    mask = torch.rand(2, 24, device=device) > 0.3
    return {case: build(r, mask) for case, build in PLANNED.items()}


@pytest.mark.parametrize("case", list(PLANNED))
def test_a_planned_call_gives_bitwise_what_planning_gave(case, device):
    """The call that makes a plan and the later calls that find it give bitwise the same
    outputs and gradients, for every op (the plan keeps the launches; the run only
    allocates and launches), with fresh inputs of the same signature in between."""
    from triton_layers.kernels import ops

    fn, inputs = _planned_cases(device)[case]
    _eager.clear_plans()

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y = fn(*leaves)
        return (y, *torch.autograd.grad(y, leaves, torch.ones_like(y)))

    first = run()  # plans
    fn(*[torch.randn_like(t).requires_grad_() for t in inputs])  # another call of the signature
    again = run()  # planned
    assert sum(len(eager.plans) for eager in _eager.OP_ROUTERS.values()) >= 1
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms_run_the_reference(transform, device):
    """Under torch.func's transforms (whose autograd.Function rules our eager door lacks)
    every op runs the pure-torch reference: the same values as the reference called
    directly, per sample under vmap, and its gradients under grad (the cards' under_func)."""
    w = 1 + torch.randn(24, device=device)
    x = torch.randn(3, 5, 24, device=device)
    ops = {card.name: card.under_func(w) for card in CARDS.values() if card.under_func}
    for name, (ours, ref) in ops.items():
        if transform == "grad":
            got = torch.func.grad(lambda t: ours(t).square().sum())(x)
            want = torch.func.grad(lambda t: ref(t).square().sum())(x)
        else:
            got, want = torch.func.vmap(ours)(x), torch.stack([ref(t) for t in x])
        torch.testing.assert_close(got, want, msg=name)


def test_record_launches_plans_without_launching():
    # Meta tensors (no data anywhere): the forward's and the backward's launches are recorded
    # with their arguments; without a gradient asked, the forward's alone.
    x = torch.empty(64, 300, device="meta", dtype=torch.bfloat16).requires_grad_()
    w = torch.empty(300, device="meta").requires_grad_()
    args = (x, w, None, 1e-6, True, False, False, False, torch.bfloat16)
    launches = kernel_ops.norm.record_launches(*args)
    # (and the sum of the weight's partials: 64 rows are more than one backward program's)
    assert [k.__name__ for k, _, _ in launches] == ["_norm_fwd_kernel", "_norm_bwd_kernel", "_partials_sum_kernel"]
    kernel, call_args, kwargs = launches[0]
    assert call_args[0] is x and kwargs["IS_RMS"] and "num_warps" in kwargs
    assert len(kernel_ops.norm.record_launches(x.detach(), w.detach(), *args[2:])) == 1


def test_uses_kernels_says_which_path_runs(device, monkeypatch):
    """triton_layers.uses_kernels answers as the ops decide: the kernels here (a GPU, or the
    interpreter in this suite), the reference when forced or under a subclass; use_triton=True
    where the kernels cannot run raises the ops' ValueError."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import triton_layers

    x = torch.randn(3, 8, device=device)
    assert triton_layers.uses_kernels(x) and triton_layers.uses_kernels(x, True)
    assert not triton_layers.uses_kernels(x, False)
    ran = []
    real = _doors.Op.call_planned
    monkeypatch.setattr(_doors.Op, "call_planned", lambda self, *a: (ran.append(1), real(self, *a))[1])
    F.layer_norm(x)
    assert ran  # the kernels did run, as it said
    with FakeTensorMode():
        fake = torch.randn(3, 8, device=device)
        assert not triton_layers.uses_kernels(fake)
        with pytest.raises(ValueError, match="FakeTensor"):
            triton_layers.uses_kernels(fake, True)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        triton_layers.uses_kernels([1.0])


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("norm", "residual_norm"))])
@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "no input needs a gradient"])
def test_norms_write_no_statistics_where_no_gradient_flows(case, context, device):
    """Serving: a norm call no gradient will flow from plans a forward that allocates and
    writes no statistics (the kernel's STORE_STATS off), with the same outputs as a call that
    keeps them; a call that may need its backward keeps them."""
    import contextlib

    op = getattr(kernel_ops, case.split("-")[0])
    args = CASES[case](device)
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    trained = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                    for a in args)
    keeping = op.plan(*trained)
    assert keeping.autograd and keeping.forward.stats_shape is not None
    assert keeping.forward.kernel.constexprs["STORE_STATS"] is True
    with {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(context, contextlib.nullcontext)():
        serving = op.plan(*(trained if context != "no input needs a gradient" else plain))
        assert not serving.autograd and serving.forward.stats_shape is None
        assert serving.forward.kernel.constexprs["STORE_STATS"] is False
        got = op.call_planned(serving, *plain)
    want = op.call_planned(keeping, *trained)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w.detach())


@pytest.mark.parametrize("case", list(CASES))
def test_custom_op_door_keeps_its_plans_by_signature(case, device):
    """The compiled door's body, launching directly (a DTensor's local shards take it), keeps
    its forward and backward plans by the arguments' signatures: a repeated call plans
    nothing, a misaligned copy of the main input plans anew, and every call (checked against a
    plan made anew) gives the eager door's outputs and gradients bit for bit."""
    op = getattr(kernel_ops, case.split("-")[0])
    n_out = len(op.desc.outputs)

    def door(*a):
        return op.forward_op(*a)[:n_out] if len(op.desc.residuals) else op.forward_op(*a)

    args = CASES[case](device)
    op._door_plans.clear()
    with _eager.checking_plans():
        first = _run(door, args)
        planned = len(op._door_plans)
        again = _run(door, args)
        assert len(op._door_plans) == planned >= 2  # (a forward and a backward plan, kept)
        shifted = (misaligned_copy(args[0]).requires_grad_(args[0].requires_grad), *args[1:])
        moved = _run(door, shifted)
        assert len(op._door_plans) > planned
    eager = _run(op, args)
    for got in (first, again, moved):
        for a, b in zip(got, eager):
            assert a.dtype == b.dtype and torch.equal(a, b)
