"""An op described once (:class:`OpDescription`): its arguments, its forward and backward
(each a plan and a run), what the backward needs, and each gradient by argument name. Both
doors are made from it (``calls/doors.py`` the eager one, ``calls/compiled.py`` the compiled
one); the kernel files (``kernels/<op>.py``) write one each. :func:`recomputed_grads` is what
their ``backward_graph`` (the differentiable backward in torch ops) build on."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

__all__ = ["OpDescription", "recomputed_grads"]


@dataclass(frozen=True)
class OpDescription:
    """One op, described once; :class:`~triton_layers.calls.doors.Op` makes both doors from it.

    - ``inputs``: ``(name, type)`` of the forward's arguments, in call order (the types
      make the custom op's schema: ``Tensor``, ``Optional[Tensor]``, ``float``, ``int``,
      ``bool``, ``torch.dtype``).
    - ``outputs``: names of the op's outputs; ``residuals``: names of the tensors the
      forward also returns, for the backward only (statistics; no gradient flows to them).
    - The forward in two halves: ``plan_forward(*inputs)`` decides everything a call's
      tensors' metadata fixes (geometry, kernel choices, :class:`KernelCall` objects)
      without launching, and ``run_forward(launcher, plan, *inputs)`` allocates and launches,
      returning a tuple of tensors: ``outputs`` then ``residuals``. Eager calls keep the
      plan per call signature (:meth:`Op.plan`), so that a repeated signature pays only the run.
    - ``saved``: ``(name, type)`` of what the backward needs, tensors (``Tensor``,
      ``Optional[Tensor]``) first; ``save(inputs, results, needs)`` returns those values
      in that order, from the inputs and the forward's results (named tuples:
      ``inputs.x``, ``results.stats``) and ``needs`` (argument name -> whether it needs a
      gradient).
    - The backward likewise: ``plan_backward(grads, needs, *saved)`` and ``run_backward(launcher,
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
