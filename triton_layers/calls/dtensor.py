"""The eager door for DTensors whose placements an op's sharding rule takes as they are.

A DTensor reaching an op takes the custom op, whose sharding rule (``calls/sharding``) DTensor's
dispatch runs: it picks the rule's strategy that moves the fewest bytes, redistributes the
inputs to it, runs the op on each rank's local tensors and wraps the results. That dispatch
is Python, run on every call, twice (forward and backward): on torch 2.11 it cost our
sequence-parallel RMSNorm about three times the host time of torch's own ``nn.RMSNorm``
under the same plan, which made an eager tensor-parallel training step host-bound and
slower than torch's.

Where the inputs already sit as one of the rule's strategies asks, nothing is to be moved,
and this door runs the same strategy itself, outside tracing, as one autograd node
(``Op.call_on_shards``), by a :class:`Door` kept per call signature (:func:`door_for` makes it;
a functional op's :class:`_eager.OpRouter` keeps it among its plans, under the one key that
also keeps its route's decision, :func:`_eager.dtensor_call_key`; a kernel op called directly
keeps it here, :func:`call`):

- the strategy is the rule's own (:func:`_sharding.forward_rule`, asked once per placements:
  one source of truth for which placements an op takes, here and in DTensor's dispatch);
- the kernels run on the DTensors' local tensors (a collective still in flight waited
  first, as torch's ops do), by the eager door's plan for their signature;
- each output is wrapped, as ``from_local`` does, with the strategy's placement and its
  global shape (from the main input's: exact for uneven shards, with no communication);
- the backward moves a gradient given in other placements to its output's, runs on the
  local gradients, and wraps each input's gradient: a row-sharded input's sharded as the
  input, a replicated parameter's as ``Partial`` (each rank's rows' part of the sum, as the
  rule's backward says: DTensor or FSDP2 sums it).

Any other call (placements no strategy takes as they are, a mesh of several dims, tensors
and DTensors mixed, a local tensor of another subclass, a traced call) takes the custom op
and DTensor's dispatch, unchanged.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from . import eager as _eager
from .sharding import forward_rule

__all__ = ["NOT_LOCAL", "Door", "call", "door_for", "run", "local_tensors", "wrap"]

NOT_LOCAL = object()
""":func:`call`'s answer for a call this door does not take."""


_API: list = []


def _dtensor_api() -> tuple:
    """(DTensor, Partial, Replicate), imported once; () where torch has no distributed."""
    if not _API:
        try:
            from torch.distributed.tensor import DTensor, Partial, Replicate
        except ImportError:
            _API.append(())
        else:
            _API.append((DTensor, Partial, Replicate))
    return _API[0]


class _Strategy:
    """A call's placements, decided once per key: each output's placement and how to make its
    global shape, each DTensor input's gradient placements (None: as the input)."""

    __slots__ = ("outputs", "grad_placements")

    def __init__(self, outputs: tuple, grad_placements: tuple):
        self.outputs = outputs  # per output: (placement, sharded dim or None, main input's dim)
        self.grad_placements = grad_placements


def _strategy(op, args: tuple, DTensor) -> Optional[_Strategy]:
    """The rule's strategy that takes ``args``' placements as they are, or None."""
    _, Partial, Replicate = _dtensor_api()
    desc = op.desc
    rule = forward_rule(desc)
    rows = dict(desc.row_sharded)
    specs = [a._spec if isinstance(a, DTensor) else a for a in args]
    given = [a._spec.placements[0] if isinstance(a, DTensor) else None for a in args]
    names = [n for n, _ in desc.inputs]
    main = names[0]
    for outputs, inputs in rule(*specs):
        if list(inputs) != given:
            continue
        sharded = any(not isinstance(p, Replicate) for p in inputs if p is not None)
        made = []
        for name, placement in zip(desc.outputs, outputs):
            if isinstance(placement, Replicate):
                made.append((placement, None, None))
            else:  # Shard(dim) of an output holding the main input's rows from its offset
                made.append((placement, placement.dim, placement.dim - rows[name][0] + rows[main][0]))
        grad_placements = tuple(
            None if not isinstance(a, DTensor) or name in rows else ((Partial(),) if sharded else None)
            for name, a in zip(names, args))
        return _Strategy(tuple(made), grad_placements)
    return None


def call(op, args: tuple) -> Any:
    """``op`` on ``args`` through this door, or :data:`NOT_LOCAL` (the custom op's then): a
    kernel op called directly (the functional ops' calls keep their doors in
    :class:`_eager.OpRouter`'s plans, by :func:`_eager.dtensor_call_key`, and call :func:`run`)."""
    api = _dtensor_api()
    if not api or op.desc.row_sharded is None:
        return NOT_LOCAL
    DTensor = api[0]
    key = [op.desc.name, *_eager.call_state(args[0])]
    shards = list(args)
    for i, a in enumerate(args):
        if isinstance(a, DTensor):
            found = _eager.dtensor_signature(a)
            if found is None:  # (a local tensor of another subclass: its dispatch)
                return NOT_LOCAL
            key.append(found[0])
            shards[i] = found[1]
        elif isinstance(a, Tensor):
            return NOT_LOCAL  # (DTensor's dispatch says what it says of mixed tensors)
        else:
            key.append((a, type(a)) if not isinstance(a, list) else (tuple(a), list))
    key = tuple(key)
    shards = tuple(shards)
    try:
        door = _DOORS.get(key, _MISSING)
    except TypeError:  # an unhashable value
        return NOT_LOCAL
    if door is _MISSING:  # (keys hold meshes' ids, each kept alive by its door while kept)
        door = door_for(op, args, shards)
        _DOORS.put(key, door)
    elif door is not None and _eager.plans_checked():
        if not door.same(door_for(op, args, shards)):
            raise _eager.PlanMismatch(f"triton_layers.{op.desc.name}: the DTensor door's cached decisions differ from "
                                      f"new ones for this call: a key misses something they bake in")
    if door is None:
        return NOT_LOCAL
    return run(op, door, shards, args)


def run(op, door: "Door", shards: tuple, args: tuple) -> Any:
    """``op`` on DTensor ``args`` by ``door``, on their local ``shards`` (made readable first
    where the door says so), as one autograd node."""
    if door.readable:
        shards = op._readable(shards, op._input_strided)
    return op.call_on_shards(door, shards, args)


_MISSING = object()

# The doors of kernel ops called directly, by key: the op, the call state, and per argument
# its _eager.dtensor_signature (a DTensor) or its value and type.
# None where no strategy takes the call as it is. A PlanCache: emptied with the eager door's
# plans when the launch config changes (a door holds a plan), and when it holds MAX_KEYS.
_DOORS = _eager.PlanCache()


class Door:
    """One DTensor call signature's decisions: the eager plan of the local tensors, each
    output's spec (made from the first call's results: the key fixes their local shapes and
    dtypes), each input's gradient spec (None: not a DTensor), whether the local tensors must
    first be made readable (:meth:`Op._readable`)."""

    __slots__ = ("plan", "mesh", "strategy", "main_shape", "output_specs", "grad_specs", "readable")

    def __init__(self, plan, mesh, strategy: _Strategy, main_shape, grad_specs: tuple, readable: bool):
        self.plan, self.mesh, self.strategy, self.main_shape = plan, mesh, strategy, main_shape
        self.output_specs = None
        self.grad_specs, self.readable = grad_specs, readable

    def outputs(self, results: tuple) -> tuple:
        """The local ``results`` as DTensors (``from_local``'s, without its checks or its node)."""
        specs = self.output_specs
        if specs is None:
            specs = self.output_specs = tuple(
                _spec(self.mesh, (placement,), r.shape if dim is None else
                      (*r.shape[:dim], self.main_shape[main_dim], *r.shape[dim + 1:]), r.dtype)
                for r, (placement, dim, main_dim) in zip(results, self.strategy.outputs))
        DTensor = _API[0][0]
        return tuple([_new(DTensor, r.contiguous(), _copy(spec), requires_grad=False) for r, spec in zip(results, specs)])

    def local_grads(self, grads: tuple) -> tuple[tuple, tuple]:
        """The outputs' gradients (DTensors, or None), each moved to its output's placements
        where a consumer gave others, and their local tensors."""
        moved, local = [], []
        for g, spec in zip(grads, self.output_specs):
            if g is not None and g.placements != spec.placements:
                g = g.redistribute(spec.mesh, spec.placements)
            moved.append(g)
            local.append(None if g is None else g._local_tensor)
        return tuple(moved), tuple(local)

    def input_grads(self, grads: tuple) -> tuple:
        """The inputs' local gradients as DTensors of their gradient specs."""
        DTensor = _API[0][0]
        return tuple([g if g is None or spec is None else
                      _new(DTensor, g.contiguous(), _copy(spec), requires_grad=g.requires_grad)
                      for g, spec in zip(grads, self.grad_specs)])

    def same(self, other: Optional["Door"]) -> bool:
        """Whether ``other`` (made anew for the same call) decided what this one did."""
        return (other is not None and self.plan.same_decisions(other.plan) and self.mesh is other.mesh
                and self.strategy.outputs == other.strategy.outputs and self.main_shape == other.main_shape
                and self.grad_specs == other.grad_specs and self.readable == other.readable)


def local_tensors(saved: tuple) -> tuple:
    """Saved tensors as the backward on the local tensors reads them: a DTensor's local tensor."""
    DTensor = _API[0][0]
    return tuple([t._local_tensor if isinstance(t, DTensor) else t for t in saved])


def door_for(op, args: tuple, shards: tuple) -> Optional[Door]:
    """The door of a call on DTensor ``args``, whose local tensors are ``shards`` (plain, to be
    read now): None where a plain tensor sits beside them (DTensor's dispatch says what it
    says of mixed tensors), where they are not on one mesh of one dim, or where their
    placements are no strategy's as they are."""
    api = _dtensor_api()
    if not api or op.desc.row_sharded is None:
        return None
    DTensor = api[0]
    mesh = None
    for a in args:
        if isinstance(a, Tensor) and not isinstance(a, DTensor):
            return None
        if isinstance(a, DTensor):
            if mesh is None:
                mesh = a.device_mesh
                if mesh.ndim != 1:
                    return None
            elif a.device_mesh is not mesh and a.device_mesh != mesh:  # (equal meshes can be two objects)
                return None
    strategy = _strategy(op, args, DTensor)
    if strategy is None:
        return None
    readable = op._readable(shards, op._input_strided)
    # (planned as for local tensors that need the gradients their DTensors need)
    plan = op.plan(*[s.detach().requires_grad_() if isinstance(a, DTensor) and a.requires_grad else s
                     for a, s in zip(args, readable)])
    grad_specs = tuple(None if not isinstance(a, DTensor) else
                       _spec(mesh, strategy.grad_placements[i] or a.placements, a.shape, a.dtype)
                       for i, a in enumerate(args))
    return Door(plan, mesh, strategy, tuple(args[0].shape), grad_specs, readable is not shards)


# --- the specs of the DTensors made here ---------------------------------------------
# (DTensor.from_local builds one each call: here they are kept by what they hold, and every
# tensor wrapped is contiguous, as the specs' strides say)

_SPECS: dict = {}


def _spec(mesh, placements: tuple, shape, dtype):
    """The spec of a contiguous DTensor of global ``shape`` and ``dtype`` on ``mesh``, kept."""
    key = (id(mesh), placements, tuple(shape), dtype)
    spec = _SPECS.get(key)
    if spec is None or spec.mesh is not mesh:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        if len(_SPECS) >= 4096:
            _SPECS.clear()
        spec = _SPECS[key] = DTensorSpec(mesh, tuple(placements),
                                         tensor_meta=TensorMeta(shape, _contiguous_strides(shape), dtype))
    return spec


def _copy(spec):
    """A shallow copy of a kept spec, for a DTensor of its own (torch's code may set a DTensor's
    spec's fields): ``copy.copy``'s result, without its ``__reduce_ex__`` round trip."""
    new = _object_new(type(spec))
    new.__dict__.update(spec.__dict__)
    return new


_object_new = object.__new__


def _new(DTensor, local: Tensor, spec, requires_grad: bool):
    """``DTensor(local, spec, requires_grad=...)``, by its ``__new__`` alone (torch's C++
    constructor): its ``__init__`` does nothing but Tensor's, behind a torch.compile guard that
    costs microseconds a call, and this door never runs under tracing."""
    return DTensor.__new__(DTensor, local, spec, requires_grad=requires_grad)


def wrap(local: Tensor, mesh, placements: tuple, shape: tuple) -> Tensor:
    """The DTensor of global ``shape`` (contiguous) whose local tensor on this rank is
    ``local``, placed by ``placements``, with no autograd node and no check (as
    ``from_local(run_check=False)`` builds it, less its autograd Function: for results that
    carry no gradient, or inside an autograd Function of the caller's). A replicated one takes
    ``local``'s own shape and strides (a column-major layout kept); a sharded one is row-major
    (``local`` copied contiguous where it is not)."""
    DTensor = _dtensor_api()[0]
    if all(p.is_replicate() for p in placements):
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        spec = DTensorSpec(mesh, tuple(placements), tensor_meta=TensorMeta(local.shape, local.stride(), local.dtype))
    else:  # (sharded: the global layout row-major, as the local one is made to be)
        local = local.contiguous()
        spec = _copy(_spec(mesh, tuple(placements), torch.Size(shape), local.dtype))
    return _new(DTensor, local, spec, requires_grad=False)


def _contiguous_strides(shape) -> tuple:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
