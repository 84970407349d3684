"""Two doors to every op, built from one description of it.

Eager calls go through an ``autograd.Function`` that launches the kernels directly.
``torch.compile`` sees a ``torch.library.triton_op`` pair (forward, backward) tied by
``register_autograd``, whose kernels are launched through ``wrap_triton`` so that
Inductor can trace them. Why two: measured on an H200 (torch 2.11), calling the custom
op eagerly costs far more host time per forward + backward than the ``autograd.Function``
(BENCHMARKS.md, "What the H200 parts are"); the difference is the custom op's dispatch and
its registered autograd (eager calls of a ``triton_op`` already launch without ``wrap_triton``).

Both doors are built here from one :class:`OpDescription` per op: its arguments, its
forward and backward (each a plan and a run), what the backward needs, and each gradient
by argument name. A new argument is added in one place, and a gradient cannot land on the
wrong input. Eager calls' plans (:class:`OpPlan`) are kept by their one owner,
``_eager.EagerOp``; how the eager door launches a kernel is in ``_fast_launch``. Whether
we are being traced is decided in one place (``triton_layers.calls.tracing``).

Where the door may not launch: a tensor subclass (DTensor, FakeTensor, ...) never reaches
a launcher (:meth:`Op.__call__` sends it to the custom op, :meth:`Op.plan` refuses it); a
backward that must itself be differentiated (``create_graph=True``) runs the description's
``backward_graph`` (torch ops) instead of the kernels.
"""
from __future__ import annotations

import collections
import inspect
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch.library import triton_op, wrap_triton

from .tracing import tracing
from . import dtensor as _dtensor_eager, eager as _eager
from .fast_launch import KernelCall, current_device, direct

__all__ = ["OpDescription", "Op", "OpPlan", "traced", "recomputed_grads"]


def traced(launch: Callable) -> bool:
    """Whether a launcher was handed the compiled door's ``wrap_triton``."""
    return launch is not direct


@dataclass(frozen=True)
class OpDescription:
    """One op, described once; :func:`build` makes both doors from it.

    - ``inputs``: ``(name, type)`` of the forward's arguments, in call order (the types
      make the custom op's schema: ``Tensor``, ``Optional[Tensor]``, ``float``, ``int``,
      ``bool``, ``torch.dtype``).
    - ``outputs``: names of the op's outputs; ``residuals``: names of the tensors the
      forward also returns, for the backward only (statistics; no gradient flows to them).
    - The forward in two halves: ``plan_forward(*inputs)`` decides everything a call's
      tensors' metadata fixes (geometry, kernel choices, :class:`KernelCall` objects)
      without launching, and ``run_forward(launch, plan, *inputs)`` allocates and launches,
      returning a tuple of tensors: ``outputs`` then ``residuals``. Eager calls keep the
      plan per call signature (:meth:`Op.plan`), so that a repeated signature pays only the run.
    - ``saved``: ``(name, type)`` of what the backward needs, tensors (``Tensor``,
      ``Optional[Tensor]``) first; ``save(inputs, results, needs)`` returns those values
      in that order, from the inputs and the forward's results (named tuples:
      ``inputs.x``, ``results.stats``) and ``needs`` (argument name -> whether it needs a
      gradient).
    - The backward likewise: ``plan_backward(grads, needs, *saved)`` and ``run_backward(launch,
      plan, grads, needs, *saved)``, which gets the outputs' gradients (a tuple) and returns
      ``{argument name: gradient}`` for the arguments in ``needs`` that are True; gradients
      in fp32 are cast to their argument's dtype by the door. A planned call keeps its
      backward plans by the gradients' strides.
    - ``differentiable``: the arguments that can get a gradient.
    - ``shared_grads``: ``(a, b)`` pairs of arguments whose gradients are equal: when both
      need one and they have one dtype, the backward returns b's gradient tensor as a's
      too (no copy). The compiled door then returns it once (a custom op's outputs may not
      alias) and hands it to both.
    - ``row_strided``: the inputs and saved tensors the plans may take as rows with a row
      stride (2-D with last stride 1; a 1-D tensor by its stride). Every other one reaches
      them contiguous: a saved-tensor hook that hands one back in another layout, or a
      DTensor whose local shard has another, is answered with a contiguous copy
      (:meth:`Op._as_saved`, :meth:`Op._readable`).
    - ``row_sharded``, ``shared_when``, ``unshardable_rows``: how the op shards for DTensors
      (``calls/sharding``): the tensors that hold rows, by name (inputs, outputs, residuals, saved)
      ``{name: (offset, trailing)}``; when the ``shared_grads`` pairs are one tensor, from the
      backward's arguments by name (default: whenever both are asked); the row dims that may
      not be sharded, from the forward's or backward's arguments. None: no rule.
    - ``plan_forward_no_grad(*inputs)``: the forward's plan for a call no gradient will flow
      from (``torch.no_grad``, inference mode, inputs that need none), which may skip what only
      the backward reads (the norms' statistics: its ``run_forward`` then returns None in
      their place). None: ``plan_forward``'s.
    - ``backward_graph(grads, needs, *saved)``: the backward in differentiable torch ops
      (``{argument name: gradient}`` as ``run_backward``), run where autograd must build the
      backward's own graph (``create_graph=True`` with a tensor that requires a gradient:
      gradient penalties, higher-order derivatives). None: such a call raises, naming the op.

    The outputs' gradients are not materialized: one whose output has no consumer is None.
    """

    name: str
    inputs: tuple[tuple[str, Any], ...]
    outputs: tuple[str, ...]
    residuals: tuple[str, ...]
    plan_forward: Callable[..., Any]
    run_forward: Callable[..., tuple]
    saved: tuple[tuple[str, Any], ...]
    save: Callable[..., tuple]
    plan_backward: Callable[..., Any]
    run_backward: Callable[..., dict]
    differentiable: tuple[str, ...]
    shared_grads: tuple[tuple[str, str], ...] = ()
    row_strided: tuple[str, ...] = ()
    backward_graph: Optional[Callable[..., dict]] = None
    row_sharded: Optional[dict] = None
    plan_forward_no_grad: Optional[Callable[..., Any]] = None
    shared_when: Optional[Callable[[dict], bool]] = None
    unshardable_rows: Optional[Callable[[dict, int], tuple]] = None


def _signature(params: tuple[tuple[str, Any], ...], returns: Any) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(n, kind, annotation=t) for n, t in params], return_annotation=returns)


def _tensor_tuple(n: int) -> Any:
    """The return annotation of a custom op giving ``n`` tensors."""
    return Tensor if n == 1 else tuple[(Tensor,) * n]


class Op:
    """Both doors of one op. Call it with the description's inputs, positionally."""

    def __init__(self, desc: OpDescription):
        self.desc = desc
        self.name = desc.name  # (what EagerOp's messages call it, as every door it plans for)
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
        self.forward_op, self.backward_op = self._compiled_door()

    # -- the description's forward and backward, planned for this call alone ------------
    def forward(self, launch: Callable, *args) -> tuple:
        """The op's forward on ``args`` (outputs, then residuals)."""
        d = self.desc
        return d.run_forward(launch, d.plan_forward(*args), *args)

    def backward(self, launch: Callable, grads: tuple, needs: dict, *saved) -> dict:
        """The op's backward: ``{argument name: gradient}``."""
        d = self.desc
        return d.run_backward(launch, d.plan_backward(grads, needs, *saved), grads, needs, *saved)

    def _door_forward(self, launch: Callable, args: tuple) -> tuple:
        """:meth:`forward` for the compiled door's body: where it launches directly (real plain
        tensors, nothing tracing: a DTensor's local shards), by a plan kept per signature of the
        arguments (:func:`_eager.signature` of each tensor; each value and its type)."""
        if launch is not direct:
            return self.forward(launch, *args)
        d = self.desc
        plan = self._door_plans.planned(("forward", *_eager.arguments_key(args)), lambda: d.plan_forward(*args))
        return d.run_forward(direct, plan, *args)

    def _door_backward(self, launch: Callable, grads: tuple, needs: dict, saved: tuple) -> dict:
        """:meth:`backward` for the compiled door's body, planned as :meth:`_door_forward` is,
        by the gradients' and saved tensors' layouts (:func:`_eager.backward_key`), the
        gradients asked for and the saved values."""
        if launch is not direct:
            return self.backward(launch, grads, needs, *saved)
        d = self.desc
        n = self._n_saved_tensors
        values = saved[n:]
        key = ("backward", _eager.backward_key(grads, saved[:n]), *needs.values(), *values, *map(type, values))
        plan = self._door_plans.planned(key, lambda: d.plan_backward(grads, needs, *saved))
        return d.run_backward(direct, plan, grads, needs, *saved)

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

    # -- compiled door -------------------------------------------------------------------
    def _compiled_door(self):
        op = self
        d = self.desc
        n_out = self._n_out

        def forward_body(*args):
            # (the tensors as the plans read them: a DTensor's local shard, say, may come in
            # any layout; traced calls from functional are already so, and pass through)
            args = op._readable(args, op._input_strided)
            return _one_or_tuple(op._door_forward(_traced_launch(args), args))

        forward_body.__signature__ = _signature(d.inputs, _tensor_tuple(len(self._result_names)))
        forward_op = triton_op(f"triton_layers::{d.name}_fwd", mutates_args=())(forward_body)

        grad_params = tuple((f"grad_{name}", Optional[Tensor]) for name in d.outputs)
        backward_params = grad_params + d.saved + (("needs", list[bool]),)

        def backward_body(*args):
            grads = args[:n_out]
            first_value = n_out + op._n_saved_tensors
            saved = (*op._as_saved(args[n_out:first_value]), *args[first_value:-1])
            needs = dict(zip(d.differentiable, args[-1]))
            out = op._door_backward(_traced_launch(args), grads, needs, saved)
            # A custom op returns tensors only: an empty one stands for "no gradient", and
            # for the second of a shared pair (backward() below hands it the first's).
            shared = {a for a, b in d.shared_grads if needs[a] and needs[b] and out[a] is out[b]}
            return _one_or_tuple(_unaliased(
                out[n] if needs[n] and n not in shared else _empty(grads) for n in d.differentiable))

        backward_body.__signature__ = _signature(backward_params, _tensor_tuple(len(d.differentiable)))
        backward_op = triton_op(f"triton_layers::{d.name}_bwd", mutates_args=())(backward_body)

        def setup_context(ctx, inputs, output):
            op._stash(ctx, inputs, (output,) if isinstance(output, Tensor) else tuple(output))

        def backward(ctx, *grads):
            saved = op._saved(ctx)
            if torch.is_grad_enabled() and _builds_graph(grads, saved[:op._n_saved_tensors]):
                return op._grads_in_order(op.backward_graph(grads[:n_out], ctx.needs, saved), ctx.needs, ctx.dtypes)
            return op._custom_op_backward(grads[:n_out], ctx.needs, ctx.dtypes, saved)

        forward_op.register_autograd(backward, setup_context=setup_context)
        return forward_op, backward_op

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
        results = self.forward_op(*args)
        results = (results,) if isinstance(results, Tensor) else results
        return results[0] if self._n_out == 1 else tuple(results[: self._n_out])

    def plan(self, *args) -> "OpPlan":
        """What an eager call on ``args`` decides before launching, for every later call
        with the same signature: the same shapes, strides, dtypes, devices, 16-byte
        alignments, ``requires_grad`` flags and non-tensor values, under the same grad mode
        and launch config. (Its one caller keys and keeps it: ``_eager.EagerOp``.)"""
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


def _traced_launch(args: tuple) -> Callable:
    """How the compiled door's bodies launch.

    - Real plain tensors and nothing tracing (no dispatch mode: a DTensor's local shards, a call
      of the custom op outside torch.compile): the eager door's own launcher, ``direct`` (the
      kernel's compiled launcher on a GPU, the interpreter on the CPU). ``wrap_triton`` would
      launch there too, but through Triton's per-call binding and a higher-order op: tens of
      microseconds a kernel, paid on every norm of a tensor-parallel model.
    - Tensors without data off a GPU (meta tensors, CPU fakes: DTensor's sharding propagation,
      FakeTensorMode): a launch that does nothing, since the Triton interpreter (the only way
      our kernels run on a CPU) would read their data.
    - Anything else (CUDA fakes under torch.compile, functional tensors, a dispatch mode that
      records: make_fx, CommDebugMode): ``wrap_triton``, which traces the kernel (and on a
      GPU launches nothing for fakes)."""
    plain = True
    for a in args:
        if isinstance(a, Tensor):
            if not a.is_cuda and (a.is_meta or isinstance(a, _FakeTensor)):
                return _no_launch
            plain = plain and type(a) in _eager.PLAIN_TENSORS
    if plain and not _dispatch_modes():
        return direct
    return wrap_triton


_dispatch_modes = torch._C._len_torch_dispatch_stack


def _no_launch(kernel):
    return _NoGrid()


class _NoGrid:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def recomputed_grads(compute: Callable[[], Tensor], inputs: dict, grad: Tensor) -> dict:
    """``{name: gradient}`` of ``compute()`` (recomputed now, under grad mode) for each of
    ``inputs`` (``name -> tensor``, each carrying its autograd history), weighted by ``grad``, as
    a graph autograd can differentiate again: what the descriptions' ``backward_graph`` build on.
    An input the output does not depend on gets zeros."""
    if not inputs:
        return {}
    with torch.enable_grad():
        found = torch.autograd.grad(compute(), list(inputs.values()), grad, create_graph=True, allow_unused=True)
    return {n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(inputs.items(), found)}


def _rows_with_stride(t: Tensor) -> bool:
    """Whether a kernel can read ``t`` by its pointer and one stride: 1-D, or 2-D with last stride 1."""
    return t.dim() == 1 or (t.dim() == 2 and t.stride(1) == 1)


def _builds_graph(grads: tuple, saved_tensors: tuple) -> bool:
    """Whether a backward running in grad mode (``create_graph=True``) must record its own graph:
    a gradient or a saved tensor requires a gradient. (Asked only in grad mode.)"""
    return any(t is not None and t.requires_grad for t in (*grads, *saved_tensors))


def _picker(positions: tuple[int, ...]) -> Callable[[tuple], tuple]:
    """``lambda t: tuple(t[i] for i in positions)``, as one ``operator.itemgetter`` call."""
    if len(positions) == 1:
        (i,) = positions
        return lambda t: (t[i],)
    if not positions:  # (an op with nothing differentiable: the FP8 norms')
        return lambda t: ()
    return operator.itemgetter(*positions)


def _one_or_tuple(tensors):
    """A custom op whose schema returns one Tensor must return it bare."""
    tensors = tuple(tensors)
    return tensors[0] if len(tensors) == 1 else tensors


def _unaliased(tensors) -> tuple:
    """The tensors, each that shares memory with an earlier one cloned: a custom op's outputs
    may not alias each other (the launchers may return views of one reduction, e.g.
    LayerNorm's weight and bias gradients; the eager door keeps those views). Real tensors are
    told apart by their storage's address (a view made where autograd does not record it, as
    under DTensor's local dispatch, has no ``_base``), fakes by their ``_base``."""
    out, seen = [], set()
    for t in tensors:
        if t.numel() and not t.is_meta and not isinstance(t, _FakeTensor) and type(t) in _eager.PLAIN_TENSORS:
            key = t.untyped_storage().data_ptr()
        else:
            key = id(t._base if t._base is not None else t)
        out.append(t.clone() if key in seen else t)
        seen.add(key)
    return tuple(out)


def _empty(grads) -> Tensor:
    ref = next(g for g in grads if g is not None)
    return ref.new_empty(0)


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
