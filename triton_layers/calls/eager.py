"""Each functional op's router (:class:`OpRouter`) and the eager door's plans, from the call's
key to the launch.

An eager call of a functional op (``functional.layer_norm``, ...) goes through its
:class:`OpRouter`, which alone keys, looks up, makes, stores, checks and calls plans:

1. :meth:`OpRouter.call` builds the call's key (:func:`signature` of every tensor, each
   other value with its type, the grad mode and autocast: :func:`call_key`).
2. A key met before (a hit) skips the op's checks and geometry: its kernel tensors come from
   the op's one argument builder (``kernel_tensors``) and the stored plan launches on them.
3. A new key (a miss) runs the op's route (its checks and its path choice, written in
   ``functional``): the reference's result, or a :class:`KernelRoute` of a kernel op. A launch on
   the tensors as given is planned (``Op.plan``), stored and called; one on reshaped or
   copied tensors runs unplanned (its key would not describe them).

The invariant (docs/ARCHITECTURE.md, "The invariant: a plan never launches on tensors it
was not made for"): a plan is used only for tensors whose :func:`signature` equals the one
it was made for. Forward plans are keyed here; backward plans by ``_doors.OpPlan.backward`` on the
output gradients and the saved tensors as autograd hands them back (saved-tensor hooks may
return a copy in another layout), through :func:`backward_key`. ``TRITON_LAYERS_CHECK_PLANS=1``
(or :func:`checking_plans`) re-plans every planned call, forward and backward, and raises
:class:`PlanMismatch` where the cached plan differs from the new one.

No Triton here: without it the routes take the reference and nothing is planned.
"""
from __future__ import annotations

import contextlib
import operator
import os
from typing import Any, Callable, Iterator, NamedTuple, Optional

import torch
from torch import Tensor

from .tracing import tracing
from .. import launch_config
from .fast_launch import MAX_KEYS

__all__ = ["OpRouter", "KernelRoute", "PlanCache", "PlanMismatch", "OP_ROUTERS", "clear_plans", "checking_plans",
           "plans_checked", "signature", "backward_key", "arguments_key", "call_key", "PLAIN_TENSORS", "subclass_of",
           "is_async_collective", "is_dtensor", "ready", "dtensor_signature", "dtensor_call_key", "functorch_active"]

# The tensor classes a kernel may launch on: a plain tensor and a Parameter (its data is one).
# Any other subclass (DTensor, FakeTensor, FunctionalTensor, a wrapper) has no plain data
# pointer to launch on, or one that does not mean what the class means.
PLAIN_TENSORS = (Tensor, torch.nn.Parameter)

def subclass_of(values) -> Optional[type]:
    """The class of the first of ``values`` that is a tensor but not of :data:`PLAIN_TENSORS`
    (DTensor, FakeTensor, a wrapper), or None. (The one test of plainness: the checks' path
    choice and the doors' safety net ask it; :func:`signature` inlines it on the hot path.)"""
    for v in values:
        if isinstance(v, Tensor) and type(v) not in PLAIN_TENSORS:
            return type(v)
    return None


def is_async_collective(kind: type) -> bool:
    """Whether ``kind`` is torch's ``AsyncCollectiveTensor``: the result of a functional
    collective (an all-gather's, a reduce-scatter's: DTensor's redistributions and their
    backwards) that may still be in flight. Told by its name and module, so that nothing of
    torch.distributed is imported to ask."""
    return kind.__name__ == "AsyncCollectiveTensor" and kind.__module__.startswith("torch.distributed")


def is_dtensor(kind: type) -> bool:
    """Whether ``kind`` is torch's DTensor (told by its module: nothing of torch.distributed is
    imported to ask)."""
    return kind.__name__ == "DTensor" and kind.__module__.startswith("torch.distributed.tensor")


def ready(values: tuple) -> Optional[tuple]:
    """The launch boundary's one rule: ``values`` as a kernel may read them now, or None.

    A kernel launch receives only plain tensors (:data:`PLAIN_TENSORS`) whose memory may be read
    now. So an ``AsyncCollectiveTensor`` is waited first, as torch's own ops do (its
    ``trigger_wait``: the collective's wait on the current stream, once), and its plain tensor
    takes its place, keeping its autograd history (:class:`_Waited`). Any other tensor subclass
    (DTensor, FakeTensor, a wrapper of the user's) gives None: the door then hands the call to
    the subclass's own protocol (the custom op, which its dispatch unwraps) or to the reference.
    ``values`` itself comes back where every tensor is plain (one type test each: the doors ask
    on every unplanned call and every backward)."""
    if subclass_of(values) is None:
        return values
    out = []
    for v in values:
        if isinstance(v, Tensor) and type(v) not in PLAIN_TENSORS:
            if not is_async_collective(type(v)):
                return None
            v = _Waited.apply(v) if v.requires_grad and torch.is_grad_enabled() else v.trigger_wait()
            if type(v) not in PLAIN_TENSORS:  # (a collective of a subclass's local tensors)
                return None
        out.append(v)
    return tuple(out)


class _Waited(torch.autograd.Function):
    """An ``AsyncCollectiveTensor`` waited, as a plain tensor (a new view of its data) that
    autograd ties to it: the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, t):
        data = t.trigger_wait()
        return data.view_as(data)  # (a fresh tensor object: autograd writes its history into it)

    @staticmethod
    def backward(ctx, grad):
        return grad


functorch_active = torch._C._are_functorch_transforms_active
"""Whether a torch.func transform (vmap, grad, ...) is running: no plans there (the reference runs)."""


# Every functional op's owner by name (for tests and tools that clear or count plans).
OP_ROUTERS: dict = {}


def clear_plans() -> None:
    """Forget every plan kept, the eager door's and the compiled door's (the next call of each
    signature plans anew): what a change of the launch config does."""
    launch_config.changed()


class PlanMismatch(RuntimeError):
    """A cached plan differs from the plan made anew for the same call: a key that misses
    something the plan bakes in (raised only while plans are checked)."""


_CHECK = [os.environ.get("TRITON_LAYERS_CHECK_PLANS", "0") == "1"]


def plans_checked() -> bool:
    """Whether every planned call is re-planned and compared (``TRITON_LAYERS_CHECK_PLANS=1``)."""
    return _CHECK[0]


@contextlib.contextmanager
def checking_plans(enabled: bool = True) -> Iterator[None]:
    """Re-plan every planned call inside the block and raise :class:`PlanMismatch` where a
    cached plan (forward or backward) differs from the new one; what
    ``TRITON_LAYERS_CHECK_PLANS=1`` does for a whole process."""
    saved = _CHECK[0]
    _CHECK[0] = bool(enabled)
    try:
        yield
    finally:
        _CHECK[0] = saved


def signature(t: Optional[Tensor]) -> Optional[tuple]:
    """A tensor's part of a plan's key: everything a plan can bake in of it. Its class, shape,
    strides, dtype, device, 16-byte alignment (kernels are compiled for it) and whether it
    requires a gradient. Raises on what is not a plain tensor or Parameter (subclasses are not
    planned: :data:`PLAIN_TENSORS`)."""
    if t is None:
        return None
    if type(t) not in PLAIN_TENSORS:
        raise TypeError(type(t).__name__)
    return (type(t), t.shape, t.stride(), t.dtype, t.get_device() if t.is_cuda else t.device,
            t.data_ptr() & 15, t.requires_grad)


def backward_key(grads: tuple, saved: tuple) -> tuple:
    """A backward plan's key: what a backward plan bakes in of the output gradients and of the
    saved tensors as autograd hands them back. For each: shape, strides, dtype, device,
    16-byte alignment. Their class and autograd state, and a saved tensor's shape, dtype and
    device, are fixed by the forward's key, unless a saved-tensor hook changed them: so they
    are keyed too (at the cost of :func:`signature` less the class and flag)."""
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)
                  for t in (*grads, *saved)])


def dtensor_signature(t: Tensor) -> Optional[tuple[tuple, Tensor]]:
    """A DTensor's part of a plan's key, and the local tensor a kernel reads for it: its class,
    global shape and strides, ``requires_grad``, placements, mesh (by id: a door's key holds
    the mesh alive) and its local tensor's :func:`signature`. A local tensor still in flight
    is waited first (:func:`ready`); None where it is another subclass (the custom op's
    dispatch takes the call). The one definition of what a DTensor contributes to a key, for
    :func:`dtensor_call_key` and the DTensor door's own calls."""
    local = t._local_tensor
    if type(local) not in PLAIN_TENSORS:
        waited = ready((local,))
        if waited is None:
            return None
        local = waited[0]
    spec = t._spec
    return (type(t), t.shape, t.stride(), t.requires_grad, spec.placements, id(spec.mesh), signature(local)), local


def dtensor_call_key(tensors: tuple, values: tuple) -> Optional[tuple[tuple, tuple]]:
    """The key of an eager call with DTensors among its tensors, and the tensors its kernels
    read (a DTensor's local tensor in its place): per tensor its :func:`signature` (a plain
    one) or its :func:`dtensor_signature`; the values and their types; the call state. The key
    holds everything both decisions bake in: the route's (checks read global metadata) and the
    DTensor door's (the strategy by the placements and mesh, the plan of the local tensors).
    None where a DTensor's local tensor is another subclass; raises on any other subclass, as
    :func:`signature` does."""
    parts = ["dtensor"]
    local = []
    for t in tensors:
        if t is None or type(t) in PLAIN_TENSORS:
            parts.append(signature(t))
            local.append(t)
        elif is_dtensor(type(t)):
            found = dtensor_signature(t)
            if found is None:
                return None
            parts.append(found[0])
            local.append(found[1])
        else:
            raise TypeError(type(t).__name__)
    return (*parts, *values, *map(type, values), *call_state(tensors[0])), tuple(local)


def call_state(x: Tensor) -> tuple:
    """The global state an eager call's plan depends on: the grad mode, and autocast's dtype on
    ``x``'s device type (None when off)."""
    if not _any_autocast():  # (one C call where autocast is off everywhere: most calls)
        return _is_grad_enabled(), None
    device_type = "cuda" if x.is_cuda else "cpu"
    return _is_grad_enabled(), _get_autocast_dtype(device_type) if _is_autocast_enabled(device_type) else None


# (module-level names: a global lookup each, not torch's attribute lookups, on every eager call)
_is_grad_enabled, _is_autocast_enabled, _get_autocast_dtype = (
    torch.is_grad_enabled, torch.is_autocast_enabled, torch.get_autocast_dtype)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def arguments_key(args) -> tuple:
    """A kernel op's arguments as a plan key: each tensor's :func:`signature`, each other value
    with its type (``True == 1 == 1.0`` in a dict)."""
    return tuple([signature(a) if isinstance(a, Tensor) else (a, type(a)) for a in args])


def call_key(tensors: tuple, values: tuple) -> tuple:
    """The key of an eager call: each tensor's :func:`signature`, the values and their types
    (``True == 1 == 1.0`` in a dict, and a check may accept one and refuse another), the call
    state."""
    return (*map(signature, tensors), *values, *map(type, values), *call_state(tensors[0]))


class KernelRoute(NamedTuple):
    """A route's decision to run a kernel op: ``op`` on the kernel tensors built from
    ``tensors`` (the functional op's tensors, reshaped or copied where the kernels need it)
    and ``tail`` (the op's other inputs), its result passed through ``finish`` (None: as it
    is). Planned when every tensor is the one the caller gave."""

    op: Any
    tensors: tuple
    tail: tuple
    finish: Optional[Callable[[Any], Any]] = None


class OpRouter:
    """Every call of one functional op, eager or traced: it routes each (the reference, the
    eager door, the DTensor door, or under torch.compile and torch.func the custom op), and is
    the only code that keys, makes, stores and calls the op's eager plans (see the module's
    docstring).

    - ``route(*tensors, *values)``: the op's checks and path for a call not planned yet: the
      reference's result, or a :class:`KernelRoute`.
    - ``kernel_tensors(*tensors)``: the kernel op's tensors from the functional op's (after
      the route's reshapes), for hits and misses alike.
    """

    def __init__(self, name: str, route: Callable[..., Any], kernel_tensors: Callable[..., tuple]):
        self.name = name
        self.route = route
        self.kernel_tensors = kernel_tensors
        self.plans = PlanCache()
        """``key -> (kernel op, plan, tail)``."""
        OP_ROUTERS[name] = self

    def call(self, tensors: tuple, values: tuple):
        """The op on its ``tensors`` (the first is the main input) and other ``values``."""
        # (every line here runs on every call: at small shapes the host sets the pace)
        key = hit = local = None
        if not (tracing() or functorch_active()):  # (no plans under torch.compile or torch.func)
            try:
                key = call_key(tensors, values)
                hit = self.plans.get(key)
            except Exception:  # a subclass, a non-tensor, an unhashable value: the route decides
                key = hit = None
                waited = ready(tensors)
                if waited is not None and waited is not tensors:  # (collectives in flight, waited)
                    return self.call(waited, values)
                try:  # DTensors: the route's decision and the DTensor door's, by one key
                    key, local = dtensor_call_key(tensors, values)
                    hit = self.plans.get(key)
                except Exception:  # (None: a local tensor of another subclass; unhashable values)
                    key = hit = local = None
            if hit is not None:  # a signature met before: its checks passed, its launches are planned
                op, plan, tail = hit
                if _CHECK[0]:
                    self._check(hit, tensors, values, local)
                if local is not None:  # DTensors: ``plan`` is the DTensor door's (None: the custom op's)
                    args = (*self.kernel_tensors(*tensors), *tail)
                    if plan is None:
                        return op.through_custom_op(*args)
                    return op.through_door(plan, (*self.kernel_tensors(*local), *tail), args)
                return op.call_planned(plan, *self.kernel_tensors(*tensors), *tail)
        route = self.route(*tensors, *values)
        if type(route) is not KernelRoute:
            return route  # the reference's result
        op, given, tail, finish = route
        args = (*self.kernel_tensors(*given), *tail)
        if key is None or any(a is not b for a, b in zip(given, tensors)):
            result = op(*args)  # reshaped or copied tensors: this call's alone
        elif local is not None:
            shards = (*self.kernel_tensors(*local), *tail)
            door = op.door_for(args, shards)
            self.plans.put(key, (op, door, tail))
            result = op.through_custom_op(*args) if door is None else op.through_door(door, shards, args)
        else:
            plan = op.plan(*args)
            self.plans.put(key, (op, plan, tail))
            result = op.call_planned(plan, *args)
        return result if finish is None else finish(result)

    def _check(self, hit: tuple, tensors: tuple, values: tuple, local: Optional[tuple]) -> None:
        """Re-plan a hit (the route's checks included) and compare with the cached plan (the
        DTensor door's decisions where ``local`` holds the DTensors' local tensors)."""
        op, plan, tail = hit
        route = self.route(*tensors, *values)
        fresh = None
        if type(route) is KernelRoute and all(a is b for a, b in zip(route.tensors, tensors)):
            args = (*self.kernel_tensors(*route.tensors), *route.tail)
            if local is None:
                fresh = (route.op, route.op.plan(*args), route.tail)
            else:
                fresh = (route.op, route.op.door_for(args, (*self.kernel_tensors(*local), *route.tail)), route.tail)
        if local is None:
            same = fresh is not None and plan.same_decisions(fresh[1])
        else:
            same = fresh is not None and (plan is fresh[1] is None or plan is not None and plan.same(fresh[1]))
        if (not same or fresh[0] is not op or fresh[2] != tail
                or list(map(type, fresh[2])) != list(map(type, tail))):
            raise PlanMismatch(
                f"triton_layers.{self.name}: the cached plan for this call differs from a new one "
                f"(cached {op.name} {tail} {plan!r}; new {fresh!r}): a plan key misses something it bakes in")


_MISSING = object()


class PlanCache(dict):
    """Plans by key, for one op. Emptied when the launch config changes (the plans hold its
    decisions) and when it holds :data:`MAX_KEYS`. Its ``get`` is the dict's own (no Python frame
    a call)."""

    def __init__(self):
        super().__init__()
        launch_config.on_change(self)

    # (members of a WeakSet: caches are told apart by identity, not by their contents)
    __hash__, __eq__ = object.__hash__, object.__eq__

    def put(self, key, plan) -> None:
        if len(self) >= MAX_KEYS:
            self.clear()
        self[key] = plan

    def planned(self, key, make: Callable[[], Any], same: Callable[[Any, Any], bool] = operator.eq):
        """The plan kept under ``key``, else ``make()``'s, kept. A hit is made anew and compared
        (``same(kept, new)``) while plans are checked (:func:`checking_plans`): a key that misses
        what the plan bakes in raises :class:`PlanMismatch`."""
        plan = self.get(key, _MISSING)
        if plan is _MISSING:
            plan = make()
            self.put(key, plan)
        elif _CHECK[0] and not same(plan, make()):
            raise PlanMismatch(f"a cached plan differs from a new one for key {key!r}: the key misses something "
                               f"the plan bakes in")
        return plan
