"""Two doors to every op, built from one description of it (``calls/description.py``).

Eager calls go through an ``autograd.Function`` that launches the kernels directly (made here:
:class:`Op`'s planned door, and its door for DTensor shards). ``torch.compile`` sees a
``torch.library.triton_op`` pair made by ``calls/compiled.py``; :class:`Op` holds both.

Both doors are built from one :class:`OpDescription` per op: its arguments, its
forward and backward (each a plan and a run), what the backward needs, and each gradient
by argument name. A new argument is added in one place, and a gradient cannot land on the
wrong input. Eager calls' plans (:class:`OpPlan`) are kept by their one owner,
``_eager.OpRouter``; how the eager door launches a kernel is in ``_fast_launch``. Whether
we are being traced is decided in one place (``triton_layers.calls.tracing``).

Where the door may not launch: a tensor subclass (DTensor, FakeTensor, ...) never reaches
a launcher (:meth:`Op.__call__` sends it to the custom op, :meth:`Op.plan` refuses it); a
backward that must itself be differentiated (``create_graph=True``) runs the description's
``backward_graph`` (torch ops) instead of the kernels.
"""
from __future__ import annotations

import collections
import operator
from typing import Callable, Optional

import torch
from torch import Tensor

from .tracing import tracing
from . import dtensor as _dtensor_eager, eager as _eager
from .compiled import _builds_graph, compiled_door
from .description import OpDescription
from .fast_launch import current_device, direct

__all__ = ["Op", "OpPlan"]


class Op:
    """Both doors of one op. Call it with the description's inputs, positionally."""

    def __init__(self, desc: OpDescription):
        self.desc = desc
        self.name = desc.name  # (what OpRouter's messages call it, as every door it plans for)
        self._names = tuple(n for n, _ in desc.inputs)
        self._result_names = desc.outputs + desc.residuals
        self._n_out = len(desc.outputs)
        self._Inputs = collections.namedtuple(f"{desc.name}_inputs", self._names)
        self._Results = collections.namedtuple(f"{desc.name}_results", self._result_names)
        # Positions of the differentiable arguments; the saved tensors come first (one slice
        # apart from the other saved values, on every call).
        self._grad_pos = tuple(self._names.index(n) for n in desc.differentiable)
        self._grad_items = tuple(zip(desc.differentiable, self._grad_pos))
        # The differentiable arguments' entries of a tuple in call order, as a tuple (one C call).
        self._pick_grads = _picker(self._grad_pos)
        is_tensor = [t in (Tensor, Optional[Tensor]) for _, t in desc.saved]
        if is_tensor != sorted(is_tensor, reverse=True):
            raise ValueError(f"{desc.name}: the saved tensors must come before the other saved values, got "
                             f"{[n for n, _ in desc.saved]}")
        self._n_saved_tensors = sum(is_tensor)
        saved_names = [n for n, _ in desc.saved]
        self._row_strided = tuple(n in desc.row_strided for n in saved_names[: self._n_saved_tensors])
        self._input_strided = tuple(n in desc.row_strided for n in self._names)
        # Function.apply less its Python prologue (binding default args, unwrapping dead
        # functorch wrappers): ~4 us per call on a CPU; used while no functorch transform runs.
        self._planned_apply = super(torch.autograd.Function, self._planned_door()).apply
        self._sharded_apply = self._sharded_door().apply
        # Plans by the arguments' signatures, as the eager door keeps its own (cleared with them):
        # the compiled door's where its body launches directly.
        self._door_plans = _eager.PlanCache()
        self.forward_op, self.backward_op = compiled_door(self)

    # -- the description's forward and backward, planned for this call alone ------------
    def forward(self, launcher: Callable, *args) -> tuple:
        """The op's forward on ``args`` (outputs, then residuals)."""
        d = self.desc
        return d.run_forward(launcher, d.plan_forward(*args), *args)

    def backward(self, launcher: Callable, grads: tuple, needs: dict, *saved) -> dict:
        """The op's backward: ``{argument name: gradient}``."""
        d = self.desc
        return d.run_backward(launcher, d.plan_backward(grads, needs, *saved), grads, needs, *saved)

    def _door_forward(self, launcher: Callable, args: tuple) -> tuple:
        """:meth:`forward` for the compiled door's body: where it launches directly (real plain
        tensors, nothing tracing: a DTensor's local shards), by a plan kept per signature of the
        arguments (:func:`_eager.signature` of each tensor; each value and its type)."""
        if launcher is not direct:
            return self.forward(launcher, *args)
        d = self.desc
        plan = self._door_plans.planned(("forward", *_eager.arguments_key(args)), lambda: d.plan_forward(*args))
        return d.run_forward(direct, plan, *args)

    def _door_backward(self, launcher: Callable, grads: tuple, needs: dict, saved: tuple) -> dict:
        """:meth:`backward` for the compiled door's body, planned as :meth:`_door_forward` is,
        by the gradients' and saved tensors' layouts (:func:`_eager.backward_key`), the
        gradients asked for and the saved values."""
        if launcher is not direct:
            return self.backward(launcher, grads, needs, *saved)
        d = self.desc
        n = self._n_saved_tensors
        values = saved[n:]
        key = ("backward", _eager.backward_key(grads, saved[:n]), *needs.values(), *values, *map(type, values))
        plan = self._door_plans.planned(key, lambda: d.plan_backward(grads, needs, *saved))
        return d.run_backward(direct, plan, grads, needs, *saved)

    def planned_backward(self, grads: tuple, needs: dict, saved: tuple) -> dict:
        """:meth:`backward`, launched directly, by a plan kept as the compiled door's body keeps
        its own (:meth:`_door_backward`): for a backward run outside this op's doors, on plain
        tensors a kernel may read now (the FP8 norms' straight-through runs the norms' own)."""
        return self._door_backward(direct, grads, needs, saved)

    def call_on_shards(self, door, shards: tuple, args: tuple):
        """The op on DTensor ``args`` (the DTensor door's: ``_dtensor_eager.call``), run on
        their local ``shards`` (plain tensors a kernel may read now, of ``door.plan``'s
        signature) as one autograd node, whose outputs and input gradients ``door`` wraps."""
        plan = door.plan
        if plan.device is not None and plan.device != current_device():
            with torch.cuda.device(plan.device):
                return self.call_on_shards(door, shards, args)
        if plan.autograd:
            outputs = self._sharded_apply(door, shards, *args)
        else:
            outputs = door.outputs(plan.run_forward(direct, plan.forward, *shards)[: self._n_out])
        return outputs[0] if self._n_out == 1 else outputs

    def backward_graph(self, grads: tuple, needs: dict, saved: tuple) -> dict:
        """The op's backward in differentiable torch ops (``create_graph=True``)."""
        if self.desc.backward_graph is None:
            raise RuntimeError(f"triton_layers.{self.desc.name}: its backward is not differentiable "
                               f"(create_graph=True, double backward); use_triton=False takes torch's ops")
        return self.desc.backward_graph(grads, needs, *saved)

    # -- shared by both doors ------------------------------------------------------------
    def _grads_in_order(self, grads: dict, needs: dict, dtypes: tuple) -> tuple:
        """The gradients as autograd wants them: one per input, in its dtype, None where
        none is asked (whatever else the backward computed)."""
        out = [None] * len(self._names)
        for (name, pos), dtype in zip(self._grad_items, dtypes):
            if needs[name]:
                g = grads[name]
                out[pos] = g if g.dtype == dtype else g.to(dtype)
        return tuple(out)

    def _shared(self, needs: dict, dtypes: tuple) -> list[tuple[str, str]]:
        """The ``shared_grads`` pairs whose gradients are one tensor in this call."""
        dtype = dict(zip(self.desc.differentiable, dtypes))
        return [(a, b) for a, b in self.desc.shared_grads if needs[a] and needs[b] and dtype[a] == dtype[b]]

    def _custom_op_backward(self, grads: tuple, needs: dict, dtypes: tuple, saved: tuple) -> tuple:
        """The backward through the custom op (``<op>_bwd``), as autograd wants its gradients:
        the compiled door's, and the eager door's for gradients of a tensor subclass, whose own
        dispatch then decides what runs (a wrapper unwraps and our body launches on its data)."""
        d = self.desc
        needs_list = [needs[n] for n in d.differentiable]
        out = self.backward_op(*grads, *saved, needs_list)
        out = (out,) if isinstance(out, Tensor) else out
        grads_by_name = {n: g for n, g, need in zip(d.differentiable, out, needs_list) if need}
        for a, b in self._shared(needs, dtypes):
            grads_by_name[a] = grads_by_name[b]
        return self._grads_in_order(grads_by_name, needs, dtypes)

    def _stash(self, ctx, args: tuple, results: tuple) -> None:
        """The compiled door's ``setup_context``: what the backward needs, from the call.
        (The named tuples are made by tuple.__new__, without _make's length check: the door
        built both lists.)"""
        ctx.set_materialize_grads(False)  # no zero tensors for outputs without consumers
        ctx.needs = needs = dict(zip(self.desc.differentiable, self._pick_grads(ctx.needs_input_grad)))
        saved = self.desc.save(_new_tuple(self._Inputs, args), _new_tuple(self._Results, results), needs)
        n = self._n_saved_tensors
        ctx.save_for_backward(*saved[:n])
        ctx.others = saved[n:]
        ctx.dtypes = tuple([None if a is None else a.dtype for a in self._pick_grads(args)])

    def _saved(self, ctx) -> tuple:
        return (*self._as_saved(ctx.saved_tensors), *ctx.others)

    def _readable(self, args: tuple, strided: tuple) -> tuple:
        """``args`` with each tensor in a layout its plan reads: as it is when contiguous (or,
        where ``strided`` says so, rows with a row stride), else a contiguous copy."""
        if all(not isinstance(a, Tensor) or a.is_contiguous() for a in args):
            return args
        return tuple(a if not isinstance(a, Tensor) or a.is_contiguous() or (ok and _rows_with_stride(a))
                     else a.contiguous() for a, ok in zip(args, strided))

    def _as_saved(self, tensors: tuple) -> tuple:
        """The saved ``tensors`` as autograd hands them back, in a layout the backward reads:
        as they are when contiguous (or rows with a row stride, for ``row_strided`` ones), else
        a contiguous copy. The forward saves them so; only a saved-tensor hook that returns
        another layout (a padded or transposed copy) costs the copy. (Every backward: one
        ``is_contiguous`` a tensor.)"""
        for t in tensors:
            if t is not None and not t.is_contiguous():
                break
        else:
            return tensors
        return tuple(t if t is None or t.is_contiguous() or (strided and _rows_with_stride(t)) else t.contiguous()
                     for t, strided in zip(tensors, self._row_strided))

    # -- eager door ----------------------------------------------------------------------
    def _planned_door(self) -> type:
        """The eager door of planned calls: the plan (first argument) holds what the call
        signature fixes: the forward's decisions, which inputs need a gradient and their
        dtypes, and the backward plans met so far."""
        op = self
        d = self.desc
        n_out, n_tensors = self._n_out, self._n_saved_tensors
        Inputs, Results = self._Inputs, self._Results

        class _PlannedFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, plan, *args):
                results = plan.run_forward(direct, plan.forward, *args)
                ctx.materialize_grads = False  # (what set_materialize_grads does, less a Python frame)
                ctx.plan = plan
                saved = d.save(_new_tuple(Inputs, args), _new_tuple(Results, results), plan.needs)
                ctx.save_for_backward(*saved[:n_tensors])
                ctx.others = saved[n_tensors:]
                return results[0] if n_out == 1 else results[:n_out]

            @staticmethod
            def backward(ctx, *grads):
                # (the saved tensors as hooks hand them back: maybe re-laid, see OpPlan.backward)
                return (None, *op._planned_backward(ctx.plan, grads[:n_out], ctx.saved_tensors, ctx.others))

        _PlannedFunction.__name__ = _PlannedFunction.__qualname__ = f"{self._camel()}PlannedFunction"
        return _PlannedFunction

    def _sharded_door(self) -> type:
        """The DTensor door's autograd node (:meth:`call_on_shards`): the forward runs the plan
        on the local tensors and wraps the outputs; it saves what the backward needs as the
        call holds it (the DTensor inputs and outputs themselves, the statistics local), so that
        a saved-tensor hook sees DTensors, as under torch's own ops. The backward runs on the
        local tensors of the gradients and saved tensors (waited where in flight), and wraps the
        inputs' gradients; where it must build its own graph (``create_graph=True``) it runs the
        op's differentiable backward on the DTensors, through DTensor's dispatch."""
        op = self
        d = self.desc
        n_out, n_tensors = self._n_out, self._n_saved_tensors
        Inputs, Results = self._Inputs, self._Results

        class _ShardedFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, door, shards, *args):
                plan = door.plan
                results = plan.run_forward(direct, plan.forward, *shards)
                outputs = door.outputs(results[:n_out])
                ctx.set_materialize_grads(False)
                ctx.door = door
                saved = d.save(_new_tuple(Inputs, args), _new_tuple(Results, (*outputs, *results[n_out:])), plan.needs)
                ctx.save_for_backward(*saved[:n_tensors])
                ctx.others = saved[n_tensors:]
                return outputs

            @staticmethod
            def backward(ctx, *grads):
                door = ctx.door
                plan = door.plan
                grads, local_grads = door.local_grads(grads[:n_out])
                saved = ctx.saved_tensors
                if _is_grad_enabled() and _builds_graph(grads, saved):
                    out = op.backward_graph(grads, plan.needs, (*saved, *ctx.others))
                    return (None, None, *op._grads_in_order(out, plan.needs, plan.dtypes))
                out = op._planned_backward(plan, local_grads, _dtensor_eager.local_tensors(saved), ctx.others)
                return (None, None, *door.input_grads(out))

        _ShardedFunction.__name__ = _ShardedFunction.__qualname__ = f"{self._camel()}ShardedFunction"
        return _ShardedFunction

    def _planned_backward(self, plan: "OpPlan", grads: tuple, tensors: tuple, others: tuple) -> tuple:
        """The backward of a planned eager call (both eager nodes': the plain door's and, on the
        local tensors, the DTensor door's), as autograd wants its gradients: by ``plan`` for the
        output ``grads`` and the saved ``tensors``, under the launch boundary's rule
        (:func:`_eager.ready`). A gradient may be a collective still in flight (the
        reduce-scatter of a sequence-parallel all-gather's backward), waited here; a gradient or
        saved tensor of another subclass takes the custom op, whose dispatch the subclass handles
        by its own protocol: never our launch. In grad mode with a tensor that requires a
        gradient (``create_graph=True``), the differentiable backward."""
        both = _eager.ready((*grads, *tensors))
        if both is None:
            return self._custom_op_backward(grads, plan.needs, plan.dtypes, (*self._as_saved(tensors), *others))
        n = len(grads)
        grads, tensors = both[:n], both[n:]
        if _is_grad_enabled() and _builds_graph(grads, tensors):
            out = self.backward_graph(grads, plan.needs, (*self._as_saved(tensors), *others))
        else:
            out = plan.backward(grads, tensors, others)
        return self._grads_in_order(out, plan.needs, plan.dtypes)

    def _camel(self) -> str:
        return "".join(part.title() for part in self.desc.name.split("_"))

    # -- the public callable -------------------------------------------------------------
    def __call__(self, *args):
        """The op on ``args`` (the description's inputs, in order; the first is a tensor).
        Tensors a kernel may read now (plain ones, and collectives in flight once waited:
        :func:`_eager.ready`) take the eager door; traced calls and other tensor subclasses take
        the custom op (the subclass's dispatch decides what runs: a DTensor its sharding rule,
        a FakeTensor no launch)."""
        if not tracing():
            plain = _eager.ready(args)
            if plain is not None:
                return self.call_planned(self.plan(*plain), *plain)
            # DTensors already placed as the rule asks: run its strategy here
            results = _dtensor_eager.call(self, args)
            if results is not _dtensor_eager.NOT_LOCAL:
                return results
        # (torch.func transforms never come here: functional runs the reference under them)
        return self.through_custom_op(*args)

    def through_custom_op(self, *args):
        """The op on ``args`` through its custom op: what traced calls and tensor subclasses
        take (the subclass's dispatch decides what runs: a DTensor its sharding rule)."""
        results = self.forward_op(*args)
        results = (results,) if isinstance(results, Tensor) else results
        return results[0] if self._n_out == 1 else tuple(results[: self._n_out])

    def door_for(self, args: tuple, shards: tuple) -> Optional["_dtensor_eager.Door"]:
        """The DTensor door's decisions for DTensor ``args`` whose local tensors (plain ones a
        kernel may read now) are ``shards``, or None where the custom op takes the call
        (``calls/dtensor.py``); :class:`_eager.OpRouter` keeps them by its key."""
        return _dtensor_eager.door_for(self, args, shards)

    def through_door(self, door: "_dtensor_eager.Door", shards: tuple, args: tuple):
        """The op on DTensor ``args`` by ``door`` (:meth:`door_for`'s for their signature), run
        on their local ``shards`` as one autograd node."""
        return _dtensor_eager.run(self, door, shards, args)

    def plan(self, *args) -> "OpPlan":
        """What an eager call on ``args`` decides before launching, for every later call
        with the same signature: the same shapes, strides, dtypes, devices, 16-byte
        alignments, ``requires_grad`` flags and non-tensor values, under the same grad mode
        and launch config. (Its one caller keys and keeps it: ``_eager.OpRouter``.)"""
        d = self.desc
        kind = _eager.subclass_of(args)
        if kind is not None:  # (the safety net: functional routes subclasses elsewhere)
            raise TypeError(f"triton_layers.{d.name}: cannot launch a kernel on a {kind.__name__}; "
                            f"only plain tensors and Parameters reach the eager door")
        grad_args = self._pick_grads(args)
        autograd = torch.is_grad_enabled() and any(a is not None and a.requires_grad for a in grad_args)
        needs = {n: autograd and a is not None and a.requires_grad for n, a in zip(d.differentiable, grad_args)}
        dtypes = tuple(None if a is None else a.dtype for a in grad_args)
        x = args[0]
        plan_forward = d.plan_forward if autograd or d.plan_forward_no_grad is None else d.plan_forward_no_grad
        return OpPlan(plan_forward(*args), d.run_forward, d.plan_backward, d.run_backward, self._as_saved, needs,
                      dtypes, autograd, x.get_device() if x.is_cuda else None)

    def record_launches(self, *args, grids: bool = False) -> list[tuple]:
        """The launches an eager forward and backward on ``args`` would make, recorded as
        ``(kernel, arguments, keyword arguments)`` (``grids=True``: ``(kernel, grid, arguments,
        keyword arguments)``) instead of launched: the backward for a random gradient of every
        output, with every input that requires a gradient needing one. Nothing is computed, and
        the tensors may be on any device, ``meta`` included: for building the kernels offline
        (``tests/test_compile_analysis.py``, ``benchmarks/dev/registers.py``; as on another GPU:
        ``launch_config.plan_as``) and for comparing decisions (``tests/test_launch_decisions.py``)."""
        launches: list[tuple] = []

        def record(kernel):
            class Grid:
                def __getitem__(self, grid):
                    if grids:
                        return lambda *a, **kw: launches.append((kernel, tuple(grid), a, kw))
                    return lambda *a, **kw: launches.append((kernel, a, kw))
            return Grid()

        d = self.desc
        results = self.forward(record, *args)
        needs = {n: a is not None and a.requires_grad for n, a in zip(d.differentiable, self._pick_grads(args))}
        if any(needs.values()):
            saved = d.save(_new_tuple(self._Inputs, args), _new_tuple(self._Results, results), needs)
            grads = tuple(torch.randn_like(results[i]) for i in range(self._n_out))
            self.backward(record, grads, needs, *saved)
        return launches

    def call_planned(self, plan: "OpPlan", *args):
        """The op on ``args`` by ``plan`` (:meth:`plan` of a call with ``args``' signature), eagerly."""
        if plan.device is not None and plan.device != current_device():
            # Triton launches on the current device: make that the tensors'. (The backward
            # needs no guard: autograd runs it on its device's thread, with the forward's stream.)
            with torch.cuda.device(plan.device):
                return self.call_planned(plan, *args)
        if plan.autograd:
            return self._planned_apply(plan, *args)
        # No gradient will flow (torch.no_grad, inference mode, inputs that need none): the
        # forward alone, no autograd node, nothing saved.
        results = plan.run_forward(direct, plan.forward, *args)
        return results[0] if self._n_out == 1 else tuple(results[: self._n_out])


_new_tuple = tuple.__new__
_is_grad_enabled = torch.is_grad_enabled


def _rows_with_stride(t: Tensor) -> bool:
    """Whether a kernel can read ``t`` by its pointer and one stride: 1-D, or 2-D with last stride 1."""
    return t.dim() == 1 or (t.dim() == 2 and t.stride(1) == 1)


def _picker(positions: tuple[int, ...]) -> Callable[[tuple], tuple]:
    """``lambda t: tuple(t[i] for i in positions)``, as one ``operator.itemgetter`` call."""
    if len(positions) == 1:
        (i,) = positions
        return lambda t: (t[i],)
    if not positions:  # (an op with nothing differentiable: the FP8 norms')
        return lambda t: ()
    return operator.itemgetter(*positions)


class OpPlan:
    """One call signature's decisions (:meth:`Op.plan`): the forward's plan and how to run
    it, which differentiable inputs need a gradient and their dtypes, whether autograd
    records the call, the CUDA device (None off CUDA), and the backward plans by the
    layouts of the gradients and saved tensors they were made for."""

    __slots__ = ("forward", "run_forward", "plan_backward", "run_backward", "as_saved", "needs", "dtypes", "autograd",
                 "device", "_backwards")

    def __init__(self, forward, run_forward, plan_backward, run_backward, as_saved: Callable[[tuple], tuple],
                 needs: dict, dtypes: tuple, autograd: bool, device: Optional[int]):
        self.forward, self.run_forward = forward, run_forward
        self.plan_backward, self.run_backward, self.as_saved = plan_backward, run_backward, as_saved
        self.needs, self.dtypes, self.autograd, self.device = needs, dtypes, autograd, device
        self._backwards: dict = {}

    def backward(self, grads: tuple, tensors: tuple, others: tuple) -> dict:
        """The backward (``{argument name: gradient}``) for the output ``grads``, the saved
        ``tensors`` as autograd hands them back and the other saved values, by the backward plan
        kept for their layouts.

        Neither layout is fixed by the forward's signature: a consumer may hand back a
        transposed or strided gradient, and a saved-tensor hook (``save_on_cpu``, activation
        offloading, a hook registered on one saved tensor after the forward) a copy of a saved
        tensor in another layout and alignment. So both are keyed, as autograd hands them back
        (:func:`_eager.backward_key`), and each key keeps whether its saved tensors must first be
        made readable (``as_saved``: a contiguous copy of one the kernels cannot read by its
        strides; a fact of the shapes and strides the key holds) beside the plan made for the
        tensors as they are then read."""
        key = _eager.backward_key(grads, tensors)
        kept = self._backwards.get(key)
        if kept is None:
            readable = self.as_saved(tensors)
            plan = self.plan_backward(grads, self.needs, *readable, *others)
            self._backwards[key] = (readable is not tensors, plan)
            tensors = readable
        else:
            relaid, plan = kept
            if relaid:
                tensors = self.as_saved(tensors)
            if _eager._CHECK[0]:  # (plans_checked(), less a call)
                fresh = self.plan_backward(grads, self.needs, *tensors, *others)
                if fresh != plan:
                    raise _eager.PlanMismatch(f"a cached backward plan differs from a new one: cached {plan!r}, "
                                              f"new {fresh!r}: a backward key misses something the plan bakes in")
        return self.run_backward(direct, plan, grads, self.needs, *tensors, *others)

    def same_decisions(self, other: "OpPlan") -> bool:
        """Whether ``other`` (a plan made anew for the same call) decided what this one did."""
        return (self.forward == other.forward and self.run_forward is other.run_forward
                and self.needs == other.needs and self.dtypes == other.dtypes
                and self.autograd == other.autograd and self.device == other.device)

    def __repr__(self) -> str:
        return f"OpPlan({self.forward!r}, needs={self.needs}, autograd={self.autograd}, device={self.device})"
