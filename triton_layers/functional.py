"""Functional ops: check inputs, flatten to 2-D, pick the path (kernels or reference), reshape back.

Every op takes ``use_triton``: ``None`` picks the Triton kernels for CUDA tensors (and
for CPU tensors under TRITON_INTERPRET=1), the pure-torch reference otherwise;
``True``/``False`` force one path.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

from torch import Tensor

from . import reference
from ._checks import as_rows, check_same_device, check_shape, check_tensor, use_kernels
from .kernels import layer_norm as _layer_norm_kernels
from .kernels import weighted_sum as _weighted_sum_kernels

__all__ = ["layer_norm", "weighted_sum"]


def layer_norm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    stable: bool = False,
    use_triton: Optional[bool] = None,
    normalized_shape: Optional[Union[int, Sequence[int]]] = None,
) -> Tensor:
    """Layer normalization over the trailing dims of ``x``.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance, as
    ``torch.nn.functional.layer_norm``. The normalized dims are ``normalized_shape`` if
    given, else ``weight.shape`` if a weight is given, else the last dim.

    ``stable=True`` first divides each row by its largest absolute value (treated as a
    constant: no gradient flows through it), which keeps fp16 rows with large values
    finite. All-zero rows are left as zeros.

    Statistics are computed in fp32. The output has ``x``'s shape and dtype; ``weight``
    and ``bias`` may be fp32 with fp16/bf16 ``x`` (mixed precision).
    """
    check_tensor(x, "x")
    if weight is not None:
        check_tensor(weight, "weight")
    if bias is not None:
        check_tensor(bias, "bias")
    check_same_device(x=x, weight=weight, bias=bias)
    if normalized_shape is None:
        normalized_shape = tuple(weight.shape) if weight is not None else tuple(x.shape[-1:])
    elif isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    if x.dim() < len(normalized_shape) or tuple(x.shape[x.dim() - len(normalized_shape):]) != normalized_shape:
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end with normalized_shape {normalized_shape}"
        )
    check_shape(weight, "weight", normalized_shape)
    check_shape(bias, "bias", normalized_shape)
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")

    n_cols = math.prod(normalized_shape)
    kernels = use_kernels(x, use_triton)
    if n_cols == 0:
        return x.new_empty(x.shape)
    x2 = as_rows(x, n_cols)
    # Empty batches take the reference: no launch, and autograd still gives zero grads.
    kernels = kernels and x2.shape[0] > 0
    w = weight.reshape(-1) if weight is not None else None
    b = bias.reshape(-1) if bias is not None else None
    if kernels:
        if w is not None and w.stride(-1) != 1:
            w = w.contiguous()
        if b is not None and b.stride(-1) != 1:
            b = b.contiguous()
        y = _layer_norm_kernels.layer_norm(x2, w, b, float(eps), bool(stable))
    else:
        y = reference.layer_norm(x2, w, b, float(eps), bool(stable))
    return y.reshape(x.shape)


def weighted_sum(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, use_triton: Optional[bool] = None
) -> Tensor:
    """Learnable weighted reduction over the last dim: ``y = (x * weight).sum(-1) + bias``.

    ``x`` has shape (..., D), ``weight`` (D,), ``bias`` (optional) is a scalar: a 0-dim
    tensor, or shape (1,) as ``nn.Linear(D, 1).bias``. The output has shape ``x.shape[:-1]``
    and ``x``'s dtype; the products are summed in fp32, so ``weight`` and ``bias`` may be
    fp32 with fp16/bf16 ``x``. The same as ``nn.functional.linear(x, weight[None], bias)``
    without its trailing dim of size 1.
    """
    check_tensor(x, "x")
    check_tensor(weight, "weight")
    if bias is not None:
        check_tensor(bias, "bias")
    check_same_device(x=x, weight=weight, bias=bias)
    if x.dim() < 1:
        raise ValueError("x must have at least one dim (the one summed over), got a 0-dim tensor")
    n_cols = x.shape[-1]
    check_shape(weight, "weight", (n_cols,))
    if bias is not None and (bias.dim() > 1 or bias.numel() != 1):
        raise ValueError(f"bias must be a scalar: shape () or (1,), got {tuple(bias.shape)}")

    kernels = use_kernels(x, use_triton)
    b = bias.reshape(()) if bias is not None else None
    # Empty inputs take the reference: no launch, and autograd still gives (zero) grads.
    if x.numel() == 0 or not kernels:
        return reference.weighted_sum(x, weight, b)
    x2 = as_rows(x, n_cols)
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    y = _weighted_sum_kernels.weighted_sum(x2, w, b)
    return y.reshape(x.shape[:-1])
