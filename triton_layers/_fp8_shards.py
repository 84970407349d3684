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


class _OnShards(torch.autograd.Function):
    """The global FP8 activation, made of the local one: its gradient (a DTensor) reaches the
    local activation as this rank's rows, placed as x's."""

    @staticmethod
    def forward(ctx, local: FP8Activation, data: Tensor, scale: Tensor, granularity: str, dtype: torch.dtype,
                places: tuple):
        ctx.mesh, ctx.places = data.device_mesh, places
        return FP8Activation(data, scale, granularity, dtype)

    @staticmethod
    def backward(ctx, d_activation):
        from torch.distributed.tensor import DTensor

        if not isinstance(d_activation, DTensor):
            raise TypeError("the gradient of an FP8 activation of DTensors must be a DTensor; got a "
                            f"{type(d_activation).__name__}")
        local = d_activation.redistribute(ctx.mesh, ctx.places).to_local()
        return local, None, None, None, None, None


def on_shards(norm: Callable[..., FP8Rows], x, weight, bias, residual, scale, recipe: FP8Recipe) -> Optional[FP8Rows]:
    """``norm(x, weight, bias, residual, scale, recipe)`` (the functional FP8 norm on plain
    tensors) on each rank's local rows of the DTensor ``x``, with the results as DTensors
    placed as ``x``, or on the whole, replicated (the module docstring); None where a tensor of
    the call is not a DTensor on ``x``'s mesh."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.tensor import DTensor, Partial, Replicate

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
    param_grad = [Partial() if p.is_shard() else Replicate() for p in places]
    xl = x.to_local()
    rl = None if residual is None else residual.to_local()
    wl, bl = (None if t is None else t.to_local(grad_placements=param_grad) for t in (weight, bias))
    sl = None if scale is None else scale.to_local()
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
        if not as_x or not sharded:  # (replicated: the local tensor is the whole, its layout too)
            return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)
        strides = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(t, mesh, places, run_check=False, shape=torch.Size(shape), stride=strides)

    lead, n_cols = tuple(x.shape[:-1]), x.shape[-1]
    data = placed(out.data, tuple(x.shape))
    if recipe.granularity == "per_tensor":
        scales = placed(out.scale, tuple(out.scale.shape), as_x=False)
    else:
        scales = placed(out.scale, (*lead, 1 if recipe.granularity == "per_token" else n_cols // GROUP_SIZE))
    h = placed(out.h, tuple(x.shape))
    activation = None
    if out.activation is not None:
        activation = _OnShards.apply(out.activation, data, scales, recipe.granularity, out.activation.dtype, places)
    return FP8Rows(data, scales, h, activation, placed(out.data_t, (), as_x=False),
                   placed(out.scale_t, (), as_x=False))
