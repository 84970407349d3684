"""The FP8 norms on DTensors whose rows are sharded: the kernels on each rank's local rows.

Every FP8 recipe but the dynamic per-tensor one is row-local: a row's FP8 data and its scales
(per token, per 1x128 group, or a static per-tensor scale) depend on that row alone, so each
rank computes its rows as a single process would, and the results are placed as the input
(the scales' rows with the input's rows; a static scale replicated).

The dynamic per-tensor scale is a reduction over every row of every rank. It is taken in two
passes: each rank's local amax scale (a first pass with no gradient and its data thrown away),
their maximum over the mesh dims the rows are sharded on (one fp32 all-reduce per dim), then
the norm again with that scale given, as a static one. That equals the single-process result
bit for bit: ``scale = max(amax, floor) / fp8_max`` (rounded up to a power of two with
``pow2_scales``) is monotone in ``amax``, so the ranks' largest scale is the global amax's, and
the static path quantizes with a given scale as the dynamic one does with its own. The cost:
the input read twice and a collective on the critical path, where the row-local recipes read
it once and communicate nothing.

Where the placements are not row-local (a shard of the normalized dim, a ``Partial`` input,
a residual placed otherwise than ``x``, a parameter not replicated) or the scales' layout
flattens the rows (column-major per-group scales, the transposed copy), every tensor is
replicated first (DTensor's own fallback for placements no rule takes: the rows gathered) and
the kernels run on the whole on every rank, with every result replicated. A call that mixes
plain tensors with DTensors is the reference's, which DTensor refuses or takes.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .calls.dtensor import wrap
from .fp8 import GROUP_SIZE, FP8Activation, FP8Recipe, FP8Rows


def _on_mesh(x, residual, params) -> bool:
    """Whether every tensor of the call is a DTensor on ``x``'s mesh (or None)."""
    from torch.distributed.tensor import DTensor

    return all(t is None or (isinstance(t, DTensor) and t.device_mesh == x.device_mesh)
               for t in (residual, *params))


def _row_local(x, residual, params, recipe: FP8Recipe) -> bool:
    """Whether the call can run on each rank's rows as they are placed."""
    if recipe.column_major_scales or recipe.transposed:
        return False  # (their layouts flatten the rows: not a shard of the global result's)
    places, last = tuple(x.placements), x.ndim - 1
    if not all(p.is_replicate() or (p.is_shard() and p.dim < last) for p in places):
        return False
    if residual is not None and tuple(residual.placements) != places:
        return False
    return all(t is None or all(p.is_replicate() for p in t.placements) for t in params)


class _Locals(torch.autograd.Function):
    """The local tensors of the call's DTensors (one autograd node, where ``to_local`` makes
    one per tensor and its backward a ``from_local`` per gradient); their gradients come back
    as DTensors placed by ``grad_places`` (x's and the residual's as x, a parameter's
    ``Partial`` over the mesh dims that shard the rows)."""

    @staticmethod
    def forward(ctx, grad_places: tuple, *dtensors):
        ctx.set_materialize_grads(False)
        ctx.meta = tuple(None if t is None else (t.device_mesh, places, tuple(t.shape))
                         for t, places in zip(dtensors, grad_places))
        # (fresh tensor objects, as to_local returns: autograd writes its metadata into them)
        return tuple(None if t is None else t._local_tensor.view_as(t._local_tensor) for t in dtensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *(None if g is None or meta is None else wrap(g, *meta) for g, meta in zip(grads, ctx.meta)))


class _OnShards(torch.autograd.Function):
    """This rank's FP8 activation and h as the global ones (one autograd node): the activation
    an :class:`FP8Activation` of the global data and scales, h a DTensor placed as x; their
    gradients (DTensors) reach the local ones as this rank's rows, placed as x's."""

    @staticmethod
    def forward(ctx, local_activation: Optional[Tensor], local_h: Optional[Tensor], data: Tensor, scale: Tensor,
                granularity: str, places: tuple, shape: tuple):
        ctx.mesh, ctx.places = data.device_mesh, places
        activation = None if local_activation is None else FP8Activation(data, scale, granularity,
                                                                         local_activation.dtype)
        h = None if local_h is None else wrap(local_h, ctx.mesh, places, shape)
        return activation, h

    @staticmethod
    def backward(ctx, d_activation, d_h):
        return (_local(ctx, d_activation, "an FP8 activation"), _local(ctx, d_h, "h"),
                None, None, None, None, None)


def _local(ctx, grad: Optional[Tensor], of: str) -> Optional[Tensor]:
    """This rank's rows of a gradient placed as x's (moved there first if placed otherwise)."""
    from torch.distributed.tensor import DTensor

    if grad is None:
        return None
    if not isinstance(grad, DTensor):
        raise TypeError(f"the gradient of {of} of DTensors must be a DTensor; got a {type(grad).__name__}")
    if tuple(grad.placements) != ctx.places:
        grad = grad.redistribute(ctx.mesh, ctx.places)
    return grad.to_local()


def on_shards(norm: Callable[..., FP8Rows], x, weight, bias, residual, scale, recipe: FP8Recipe) -> Optional[FP8Rows]:
    """``norm(x, weight, bias, residual, scale, recipe)`` (the functional FP8 norm on plain
    tensors) on each rank's local rows of the DTensor ``x``, with the results as DTensors
    placed as ``x``, or on the whole, replicated (the module docstring); None where a tensor of
    the call is not a DTensor on ``x``'s mesh."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.tensor import Partial, Replicate

    if not _on_mesh(x, residual, (weight, bias, scale)):
        return None  # (plain tensors beside DTensors: the reference, which DTensor refuses or takes)
    mesh = x.device_mesh
    if not _row_local(x, residual, (weight, bias, scale), recipe):
        # Replicated first (an all-gather of the rows, an all-reduce of a Partial input), then
        # the kernels on the whole tensor on every rank, every result replicated.
        whole = [Replicate()] * mesh.ndim
        x, residual, weight, bias, scale = (None if t is None else t.redistribute(mesh, whole)
                                            for t in (x, residual, weight, bias, scale))
    places = tuple(x.placements)
    sharded = [i for i, p in enumerate(places) if p.is_shard()]
    # A replicated parameter's gradient from this rank's rows is its part of the sum over the
    # mesh dims that shard the rows (DTensor, or FSDP2, sums it), the whole gradient on the others.
    param_grad = tuple(Partial() if p.is_shard() else Replicate() for p in places)
    xl, rl, wl, bl, sl = _Locals.apply((places, places, param_grad, param_grad, places),
                                       x, residual, weight, bias, scale)
    if recipe.granularity == "per_tensor" and scale is None and sharded:
        with torch.no_grad():  # (the local amax's scale; its data thrown away)
            local_scale = norm(xl, wl, bl, rl, None, recipe).scale
        global_scale = local_scale.reshape(1)
        for dim in sharded:
            global_scale = funcol.wait_tensor(funcol.all_reduce(global_scale, "max", (mesh, dim)))
        sl = global_scale.reshape(local_scale.shape)
        recipe = FP8Recipe("per_tensor", recipe.dtype)  # (the global scale, given: static)
    out = norm(xl, wl, bl, rl, sl, recipe)

    def placed(t: Optional[Tensor], shape: tuple, as_x: bool = True) -> Optional[Tensor]:
        if t is None:
            return None
        return wrap(t, mesh, places if as_x and sharded else [Replicate()] * mesh.ndim, shape)

    lead, n_cols = tuple(x.shape[:-1]), x.shape[-1]
    data = placed(out.data, tuple(x.shape))
    if recipe.granularity == "per_tensor":
        scales = placed(out.scale, tuple(out.scale.shape), as_x=False)
    else:
        scales = placed(out.scale, (*lead, 1 if recipe.granularity == "per_token" else n_cols // GROUP_SIZE))
    activation, h = out.activation, out.h
    if activation is not None or h is not None:
        activation, h = _OnShards.apply(activation, h, data, scales, recipe.granularity, places, tuple(x.shape))
    return FP8Rows(data, scales, h, activation, placed(out.data_t, (), as_x=False),
                   placed(out.scale_t, (), as_x=False))
