"""Functional ops: check inputs, flatten to 2-D, pick the path (kernels or reference), reshape back.

Every op takes ``use_triton``: ``None`` picks the Triton kernels for CUDA tensors (and
for CPU tensors under TRITON_INTERPRET=1), the pure-torch reference otherwise;
``True``/``False`` force one path. float64 (as torch's layers take it) always takes the
reference, which computes in float64; ``use_triton=True`` on it is a ValueError.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor

from . import reference
from ._checks import (
    INPUT_DTYPES, KERNELS as _kernels, as_rows, check_flag, check_int, check_int_sequence, check_number,
    check_same_device, check_shape, check_tensor, float64_among, kernel_heads, kernel_rows, use_kernels,
)
from .calls.tracing import tracing
from ._values import check_k_within_row
from .fp8 import GROUP_SIZE, FP8Recipe, FP8Rows, reference_activation
from .calls.eager import OpRouter, KernelRoute, is_dtensor, subclass_of
from ._fp8_shards import on_shards

__all__ = ["layer_norm", "rms_norm", "layer_norm_fp8", "rms_norm_fp8", "softmax", "weighted_sum", "coor_descent", "uses_kernels"]


# The eps of torch's RMSNorm when none is given: its implementations (CPU and CUDA) take
# the epsilon of the fp32 computation for fp16/bf16/fp32 inputs alike, and float64's for
# float64 inputs (computed in float64).
RMS_NORM_DEFAULT_EPS = torch.finfo(torch.float32).eps
RMS_NORM_DEFAULT_EPS_FLOAT64 = torch.finfo(torch.float64).eps


def uses_kernels(x: Tensor, use_triton: Optional[bool] = None) -> bool:
    """Whether the ops, called on ``x`` with ``use_triton``, run the Triton kernels (True) or the
    pure-torch reference (False): the kernels for CUDA tensors, and for CPU tensors when
    ``TRITON_INTERPRET=1`` was set before triton_layers was imported; the reference elsewhere,
    under torch.func transforms, for tensor subclasses (DTensor, ...) and for float64. ``use_triton=True``
    where the kernels cannot run raises the ``ValueError`` an op would. (An empty input takes
    the reference whatever this says: there is nothing to launch.)"""
    check_tensor(x, "x", INPUT_DTYPES)
    return use_kernels(x, use_triton)


def layer_norm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    stable: bool = False,
    use_triton: Optional[bool] = None,
    normalized_shape: Optional[Union[int, Sequence[int]]] = None,
    *,
    residual: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    residual_dtype: Optional[torch.dtype] = None,
    residual_in_place: bool = False,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Layer normalization over the trailing dims of ``x``.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance, as
    ``torch.nn.functional.layer_norm``. The normalized dims are ``normalized_shape`` if
    given, else ``weight.shape`` if a weight is given, else the last dim.

    ``stable=True`` first divides each row by its largest absolute value (treated as a
    constant: no gradient flows through it), which keeps fp16 rows with large values
    finite. All-zero rows are left as zeros.

    Statistics are computed in fp32; ``weight`` and ``bias`` may be fp32 with fp16/bf16
    ``x`` (mixed precision). ``y`` has ``x``'s shape and ``out_dtype``: by default x's
    dtype, or autocast's where autocast is on (see the README; autocast leaves float64 alone).

    float64 anywhere (x, weight, bias, residual, out_dtype, residual_dtype) takes the
    reference: statistics in float64 for a float64 x (or h), a float64 weight or bias
    multiplied and added in float64, y still of ``out_dtype``.

    ``residual`` (x's shape and device): returns ``(y, h)`` with ``h = x + residual``
    computed in ``residual_dtype`` (default the residual's dtype) and ``y = norm(h)``,
    in one pass over the data; gradients reach x, residual and the parameters through both.

    ``residual_in_place=True`` (serving: where no gradient flows, under ``torch.no_grad()`` or
    ``torch.inference_mode()``) writes ``h`` into ``residual`` itself and returns
    ``(y, residual)``: the residual buffer of a serving engine, updated with no tensor
    allocated for h (vLLM's ``fused_add_rms_norm``). ``residual`` must be contiguous and keep
    its dtype (``residual_dtype`` None or the residual's).
    """
    return _norm(x, weight, bias, residual, NormOptions(eps, out_dtype, residual_dtype, use_triton, normalized_shape,
                                                        False, stable, False, False, True, residual_in_place))


def rms_norm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    eps: Optional[float] = None,
    *,
    residual: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    residual_dtype: Optional[torch.dtype] = None,
    unit_offset: bool = False,
    use_triton: Optional[bool] = None,
    normalized_shape: Optional[Union[int, Sequence[int]]] = None,
    residual_in_place: bool = False,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """RMS normalization over the trailing dims of ``x``: ``y = x / sqrt(mean(x^2) + eps) * weight``.

    As ``torch.nn.functional.rms_norm``: computed in fp32 and rounded once; ``eps=None``
    takes the fp32 epsilon (``torch.finfo(torch.float32).eps``, what torch's implementations
    use for fp16/bf16/fp32 inputs; float64's for a float64 input, computed in float64 by the
    reference, as torch does). ``unit_offset=True`` multiplies by ``1 + weight``
    instead (Gemma's form). The normalized dims, mixed precision, ``out_dtype``,
    ``residual``, ``residual_dtype`` and ``residual_in_place`` work as in :func:`layer_norm`.
    """
    return _norm(x, weight, None, residual, NormOptions(eps, out_dtype, residual_dtype, use_triton, normalized_shape,
                                                        True, False, unit_offset, False, True, residual_in_place))


def rms_norm_fp8(
    x: Tensor,
    weight: Optional[Tensor] = None,
    eps: Optional[float] = None,
    *,
    recipe: Optional[FP8Recipe] = None,
    scale: Optional[Tensor] = None,
    residual: Optional[Tensor] = None,
    residual_dtype: Optional[torch.dtype] = None,
    unit_offset: bool = False,
    use_triton: Optional[bool] = None,
) -> FP8Rows:
    """:func:`rms_norm` over the last dim, written as FP8 in the same pass:
    :class:`~triton_layers.fp8.FP8Rows` ``(data, scale, h, activation, data_t, scale_t)``.

    ``recipe`` (:class:`~triton_layers.fp8.FP8Recipe`; default dynamic per-token e4m3) says
    how scales are taken; ``scale`` (a one-element fp32 tensor > 0, ``"per_tensor"`` only)
    is a static scale. ``residual``: the fused add, ``h`` returned. Where a gradient will
    flow, ``activation`` is the output as autograd sees it, and its gradient reaches x, the
    residual and the weight as the bf16 norm's backward gives them on that gradient
    (straight through the quantization). ``FP8Recipe("per_group", transposed=True)`` also
    writes the transposed copy the weight-gradient GEMM reads (``data_t``, ``scale_t``: 128x1
    blocks, no gradient). The conventions: ``triton_layers/fp8.py``.
    """
    return _norm_fp8(x, weight, None, eps, residual, residual_dtype, recipe, scale, use_triton, rms=True,
                     unit_offset=unit_offset)


def layer_norm_fp8(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    *,
    recipe: Optional[FP8Recipe] = None,
    scale: Optional[Tensor] = None,
    residual: Optional[Tensor] = None,
    residual_dtype: Optional[torch.dtype] = None,
    use_triton: Optional[bool] = None,
) -> FP8Rows:
    """:func:`layer_norm` over the last dim, written as FP8 in the same pass (the arguments and
    the result as :func:`rms_norm_fp8`'s)."""
    return _norm_fp8(x, weight, bias, eps, residual, residual_dtype, recipe, scale, use_triton, rms=False)


def _norm_fp8(x, weight, bias, eps, residual, residual_dtype, recipe, scale, use_triton, *, rms: bool,
              unit_offset: bool = False, cast_before_weight: bool = False) -> FP8Rows:
    """The FP8 norms (``cast_before_weight``: Llama's numerics, as :func:`_norm`) through their eager door."""
    return _NORM_FP8.call((x, weight, bias, residual, scale), (
        eps, residual_dtype, DEFAULT_FP8_RECIPE if recipe is None else recipe, use_triton, rms, unit_offset,
        cast_before_weight))


DEFAULT_FP8_RECIPE = FP8Recipe()


def _norm_fp8_route(x, weight, bias, residual, scale, eps, residual_dtype, recipe, use_triton, rms, unit_offset,
                    cast_before_weight):
    """An FP8 norm call not planned yet: the checks, the path, the reshapes (see :class:`OpRouter`)."""
    check_tensor(x, "x", INPUT_DTYPES)
    if not isinstance(recipe, FP8Recipe):
        raise TypeError(f"recipe must be a triton_layers.FP8Recipe; got {type(recipe).__name__}")
    check_flag(unit_offset, "unit_offset")
    if x.dim() == 0:
        raise ValueError("x must have at least one dim (the normalized one); got a 0-dim tensor")
    n_cols = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(t, name, INPUT_DTYPES)
            if tuple(t.shape) != (n_cols,):
                raise ValueError(f"{name} must have shape ({n_cols},) (x's last dim); got {tuple(t.shape)}")
    check_same_device(("x", "weight", "bias"), x, weight, bias)
    residual_dtype = _residual_dtype(x, residual, residual_dtype)
    if scale is not None:
        if recipe.granularity != "per_tensor":
            raise ValueError(f"a static scale is per tensor; the recipe's granularity is {recipe.granularity!r}")
        check_tensor(scale, "scale", (torch.float32,))
        if scale.numel() != 1 or scale.device != x.device:
            raise ValueError(f"scale must be one fp32 element on x's device ({x.device}); got shape "
                             f"{tuple(scale.shape)} on {scale.device}")
        if not tracing() and not bool(scale.detach().reshape(()) > 0):  # (checked once per call signature)
            raise ValueError(f"scale must be > 0 (a dequantization scale); got {scale.item()!r}")
    if recipe.granularity == "per_group" and n_cols % GROUP_SIZE:
        raise ValueError(f"the per_group recipe takes scales per {GROUP_SIZE} columns: x's last dim must be a "
                         f"multiple of {GROUP_SIZE}; got {n_cols}")
    if x.is_cuda and torch.cuda.get_device_capability(x.device) < (8, 9):
        raise ValueError(f"FP8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); {x.device} "
                         f"is {torch.cuda.get_device_name(x.device)}, "
                         f"capability {torch.cuda.get_device_capability(x.device)}")
    normalized_dtype = x.dtype if residual is None else residual_dtype
    eps = _checked_eps(eps, rms, normalized_dtype)
    out_dtype = (torch.promote_types(normalized_dtype, weight.dtype) if cast_before_weight and weight is not None
                 else normalized_dtype)  # (the activation's nominal dtype: what the norm would write)
    if use_triton is not False and is_dtensor(type(x)) and not tracing():  # (rows sharded: each rank's own)
        rows = on_shards(lambda x, weight, bias, residual, scale, recipe: _norm_fp8(
            x, weight, bias, eps, residual, residual_dtype, recipe, scale, use_triton, rms=rms,
            unit_offset=unit_offset, cast_before_weight=cast_before_weight), x, weight, bias, residual, scale, recipe)
        if rows is not None:
            return rows
    float64 = float64_among(("x", "weight", "bias", "residual", "residual_dtype"), x, weight, bias, residual,
                            residual_dtype)
    autograd = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, residual))
    kernels = (use_kernels(x, use_triton, (weight, bias, residual, scale), float64=float64) and x.numel() > 0
               and not (autograd and tracing()))
    eps = float(eps)
    if kernels:
        x2 = kernel_rows(x, n_cols)
        r2 = None if residual is None else kernel_rows(residual, n_cols)
        if x2 is x and r2 is residual:
            return KernelRoute(_kernels.norm_fp8_door, (x, weight, bias, residual, scale),
                          (eps, rms, bool(unit_offset), bool(cast_before_weight), residual_dtype, out_dtype, recipe))
        if not autograd:  # (rows copied: the result reshaped to x's; the transposed copy's rows are flat)
            out = _kernels.norm_fp8_door(x2, r2, weight, bias, scale, eps, rms, bool(unit_offset),
                                         bool(cast_before_weight), residual_dtype, out_dtype, recipe)
            scales = out.scale.reshape(recipe.scale_shape(tuple(x.shape[:-1]), n_cols))  # (column-major: as it is)
            return FP8Rows(out.data.reshape(x.shape), scales, None if out.h is None else out.h.reshape(x.shape),
                           None, out.data_t, out.scale_t)
    data, scales, h, y = reference.norm_fp8(x, weight, bias, eps, recipe, scale, rms=rms, unit_offset=bool(unit_offset),
                                            cast_before_weight=bool(cast_before_weight), residual=residual,
                                            residual_dtype=residual_dtype)
    activation = reference_activation(y, data, scales, recipe.granularity, out_dtype) if autograd else None
    data_t, scale_t = reference.quantize_fp8_transposed(y.detach(), recipe) if recipe.transposed else (None, None)
    return FP8Rows(data, scales, h, activation, data_t, scale_t)


def _norm_fp8_kernel_tensors(x, weight, bias, residual, scale) -> tuple:
    """The FP8 norm door's tensors from the functional's (:class:`OpRouter`'s argument builder)."""
    return (x, residual, weight, bias, scale)


_NORM_FP8 = OpRouter("norm_fp8", _norm_fp8_route, _norm_fp8_kernel_tensors)


def _sharded_along(t: Tensor, dim: int) -> bool:
    """Whether ``t`` is a DTensor sharded along ``dim``."""
    placements = getattr(t, "placements", ())
    return any(getattr(p, "dim", None) in (dim, dim - t.dim()) and p.is_shard() for p in placements)


def _out_dtype(value: object, name: str) -> torch.dtype:
    if not isinstance(value, torch.dtype) or value not in INPUT_DTYPES:
        names = ", ".join(str(d) for d in INPUT_DTYPES)
        raise TypeError(f"{name} must be one of {names}; got {value!r}")
    return value


class NormOptions(NamedTuple):
    """Every value of a norm call besides its tensors (x, weight, bias, residual), named once:
    what the public norms, both modules and ``hub`` build (:func:`_norm`), the eager door keys a
    call by (a tuple: hashed as one) and the route takes in this order. A norm argument added
    here has a default, so that only its callers that set it change.

    ``eps=None`` (RMSNorm): torch's default for the normalized dtype. ``cast_before_weight``
    (Llama's numerics, used by the modules ``convert`` makes): the normalized value is rounded
    to the input's dtype before the product with the weight, and ``y``'s default dtype is that
    of the product, as torch types ``weight * x``. ``autocast=False``: ``y``'s default dtype is
    the one it has without autocast, also under autocast (a Hugging Face norm's, which casts by
    its own code). The others: as :func:`layer_norm` and :func:`rms_norm` say."""

    eps: Optional[float] = None
    out_dtype: Optional[torch.dtype] = None
    residual_dtype: Optional[torch.dtype] = None
    use_triton: Optional[bool] = None
    normalized_shape: Optional[Union[int, Sequence[int]]] = None
    rms: bool = False
    stable: bool = False
    unit_offset: bool = False
    cast_before_weight: bool = False
    autocast: bool = True
    residual_in_place: bool = False


def _norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], residual: Optional[Tensor],
          options: NormOptions) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """LayerNorm or RMSNorm (``options.rms``), with or without the residual: through their eager door."""
    return _NORM.call((x, weight, bias, residual), options)


def _norm_route(x, weight, bias, residual, eps, out_dtype, residual_dtype, use_triton, normalized_shape, rms, stable,
                unit_offset, cast_before_weight, autocast, residual_in_place):
    """A norm call not planned yet: the checks, the path, the reshapes (see :class:`OpRouter`).
    ``eps=None`` (RMSNorm only) is torch's default for the normalized dtype."""
    check_tensor(x, "x", INPUT_DTYPES)
    check_flag(stable, "stable")
    check_flag(unit_offset, "unit_offset")
    check_flag(residual_in_place, "residual_in_place")
    if weight is not None:
        check_tensor(weight, "weight", INPUT_DTYPES)
    if bias is not None:
        check_tensor(bias, "bias", INPUT_DTYPES)
    check_same_device(("x", "weight", "bias"), x, weight, bias)
    residual_dtype = _residual_dtype(x, residual, residual_dtype)
    if residual_in_place:
        _check_in_place(x, weight, bias, residual, residual_dtype, stable)
    last = x.shape[-1] if x.dim() else -1
    if ((normalized_shape is None or normalized_shape == (last,)) and last >= 0
            and (weight is None or (weight.dim() == 1 and weight.shape[0] == last))
            and (bias is None or (bias.dim() == 1 and bias.shape[0] == last))):
        n_cols, n_dims = last, 1  # the common case (the modules'): the last dim, checked without building shapes
    else:
        n_cols, n_dims = _normalized_cols(x, weight, bias, normalized_shape)
    normalized_dtype = x.dtype if residual is None else residual_dtype  # (h's, with a residual)
    eps = _checked_eps(eps, rms, normalized_dtype)
    device_type = "cuda" if x.is_cuda else x.device.type
    if out_dtype is not None:
        out_dtype = _out_dtype(out_dtype, "out_dtype")
    elif (autocast and normalized_dtype is not torch.float64  # (torch's autocast casts no float64 tensor)
          and (device_type == "cuda" or device_type == "cpu") and torch.is_autocast_enabled(device_type)):
        # What the next matmul reads under autocast: written directly, no cast kernel.
        out_dtype = torch.get_autocast_dtype(device_type)
    elif cast_before_weight and weight is not None:
        out_dtype = torch.promote_types(x.dtype if residual is None else residual_dtype, weight.dtype)
    else:
        out_dtype = x.dtype

    # Empty inputs take the reference: no launch, and autograd still gives (empty or zero) grads.
    float64 = float64_among(("x", "weight", "bias", "residual", "out_dtype", "residual_dtype"),
                            x, weight, bias, residual, out_dtype, residual_dtype)
    kernels = use_kernels(x, use_triton, (weight, bias, residual), dtensors=True, float64=float64) and x.numel() > 0
    # (reshapes only where needed: each costs host time, which sets the pace at small shapes)
    w = weight if weight is None or weight.dim() == 1 else weight.reshape(-1)
    b = bias if bias is None or bias.dim() == 1 else bias.reshape(-1)
    if not kernels and n_dims == 1:
        # The reference normalizes the last dim of any shape: no reshape. Under torch.compile
        # (the path convert's modules take there) a (rows, n_cols) view around the norm kept
        # Inductor from fusing its backward's row sums with the dx that reads them.
        x2, r2 = x, residual
    elif n_cols:
        rows = kernel_rows if kernels else as_rows
        x2 = kernel_heads(x, n_cols) if kernels and residual is None and n_dims == 1 else rows(x, n_cols)
        r2 = None if residual is None else rows(residual, n_cols)
    else:  # as_rows needs n_cols > 0 (reshape(-1, 0) is ambiguous): count the rows
        x2 = x.reshape(math.prod(x.shape[: x.dim() - n_dims]), 0)
        r2 = None if residual is None else residual.reshape(x2.shape)
    eps, stable = float(eps), bool(stable)
    if kernels:
        if w is not None and w.stride(-1) != 1:
            w = w.contiguous()
        if b is not None and b.stride(-1) != 1:
            b = b.contiguous()
        tail = (eps, rms, stable, bool(unit_offset), bool(cast_before_weight), out_dtype)
        op = _kernels.norm if r2 is None else _kernels.residual_norm
        if r2 is not None:
            tail = (*tail, residual_dtype)
        if residual_in_place:
            if r2 is residual and subclass_of((x, w, b, residual)) is None and not tracing():
                op = _kernels.residual_norm_in_place  # (h written into the residual by the kernel)
            else:  # a DTensor, a reshaped residual, a traced call: the op, then the copy
                y, h = op(*_norm_kernel_tensors(x2, w, b, r2), *tail)
                residual.copy_(h.reshape(residual.shape))
                return y.reshape(x.shape), residual
        finish = None  # (the launchers return x's shape for x as it is)
        if x2 is not x:
            shape = x.shape
            finish = ((lambda y: y.reshape(shape)) if r2 is None
                      else (lambda yh: (yh[0].reshape(shape), yh[1].reshape(shape))))
        return KernelRoute(op, (x2, w, b, r2), tail, finish)
    y = reference.norm(x2, w, b, eps, rms=rms, stable=stable, unit_offset=bool(unit_offset),
                       cast_before_weight=bool(cast_before_weight), residual=r2,
                       residual_dtype=residual_dtype, out_dtype=out_dtype)
    if r2 is not None:
        y, h = y
        if residual_in_place:
            residual.copy_(h.reshape(residual.shape))
            return y.reshape(x.shape), residual
    if x2 is not x:
        y = y.reshape(x.shape)
        h = None if residual is None else h.reshape(x.shape)
    return y if residual is None else (y, h)


def _checked_eps(eps: Optional[float], rms: bool, normalized_dtype: torch.dtype) -> float:
    """``eps`` checked; None (RMSNorm) is torch's default for the normalized dtype."""
    if eps is None and rms:
        eps = RMS_NORM_DEFAULT_EPS_FLOAT64 if normalized_dtype is torch.float64 else RMS_NORM_DEFAULT_EPS
    check_number(eps, "eps", minimum=0)
    return eps


def _residual_dtype(x: Tensor, residual: Optional[Tensor], residual_dtype: Optional[torch.dtype]):
    """The dtype h is computed in (the residual's unless given), the residual checked against x;
    None without a residual (where a residual_dtype is a mistake)."""
    if residual is None:
        if residual_dtype is not None:
            raise ValueError(f"residual_dtype={residual_dtype} is given without a residual")
        return None
    check_tensor(residual, "residual", INPUT_DTYPES)
    if residual.shape != x.shape or residual.device != x.device:
        raise ValueError(
            f"residual must have x's shape and device; got x of shape {tuple(x.shape)} on {x.device}, "
            f"residual of shape {tuple(residual.shape)} on {residual.device}")
    return residual.dtype if residual_dtype is None else _out_dtype(residual_dtype, "residual_dtype")


def _check_in_place(x, weight, bias, residual, residual_dtype, stable) -> None:
    """residual_in_place=True's conditions (see :func:`layer_norm`), each a clear ValueError."""
    if residual is None:
        raise ValueError("residual_in_place=True writes h into the residual: pass a residual")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, residual)):
        raise ValueError("residual_in_place=True overwrites the residual, which autograd may need: use it where "
                         "no gradient flows (torch.no_grad(), torch.inference_mode(), inputs that need none)")
    if residual_dtype != residual.dtype:
        raise ValueError(f"residual_in_place=True keeps the residual's dtype ({residual.dtype}); "
                         f"got residual_dtype={residual_dtype}")
    if not residual.is_contiguous():
        raise ValueError(f"residual_in_place=True needs a contiguous residual; got strides {residual.stride()} "
                         f"for shape {tuple(residual.shape)}")
    if stable:
        raise ValueError("residual_in_place=True is not offered with stable=True")


def _norm_kernel_tensors(x, weight, bias, residual) -> tuple:
    """The norm kernel ops' tensors from the functional's (:class:`OpRouter`'s argument builder)."""
    return (x, weight, bias) if residual is None else (x, residual, weight, bias)


_NORM = OpRouter("norm", _norm_route, _norm_kernel_tensors)


def _normalized_cols(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                     normalized_shape: Optional[Union[int, Sequence[int]]]) -> tuple[int, int]:
    """The number of normalized columns and of normalized dims, checking ``normalized_shape`` (or the weight's
    shape, else x's last dim) against x, the weight and the bias."""
    if normalized_shape is None:
        normalized_shape = tuple(weight.shape) if weight is not None else tuple(x.shape[-1:])
    else:
        normalized_shape = check_int_sequence(normalized_shape, "normalized_shape")
    if not normalized_shape:
        # As torch: normalizing over no dims (a 0-dim x or weight) is a mistake, not a no-op.
        raise ValueError(
            f"normalized_shape must have at least one dim; got () for x of shape {tuple(x.shape)}"
            + ("" if weight is None else f" and weight of shape {tuple(weight.shape)}")
        )
    if x.dim() < len(normalized_shape) or tuple(x.shape[x.dim() - len(normalized_shape):]) != normalized_shape:
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end with normalized_shape {normalized_shape}"
        )
    check_shape(weight, "weight", normalized_shape)
    check_shape(bias, "bias", normalized_shape)
    return math.prod(normalized_shape), len(normalized_shape)


def weighted_sum(
    x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, use_triton: Optional[bool] = None
) -> Tensor:
    """Learnable weighted reduction over the last dim: ``y = (x * weight).sum(-1) + bias``.

    ``x`` has shape (..., D), ``weight`` (D,), ``bias`` (optional) is a scalar: a 0-dim
    tensor, or shape (1,) as ``nn.Linear(D, 1).bias``. The output has shape ``x.shape[:-1]``
    and ``x``'s dtype; the products are summed in fp32, so ``weight`` and ``bias`` may be
    fp32 with fp16/bf16 ``x``. The same as ``nn.functional.linear(x, weight[None], bias)``
    without its trailing dim of size 1. float64 anywhere takes the reference, which sums in
    float64.
    """
    return _WEIGHTED_SUM.call((x, weight, bias), (use_triton,))


def _weighted_sum_route(x, weight, bias, use_triton):
    """A weighted_sum call not planned yet: the checks, the path, the reshapes."""
    check_tensor(x, "x", INPUT_DTYPES)
    check_tensor(weight, "weight", INPUT_DTYPES)
    if bias is not None:
        check_tensor(bias, "bias", INPUT_DTYPES)
    check_same_device(("x", "weight", "bias"), x, weight, bias)
    if x.dim() < 1:
        raise ValueError("x must have at least one dim (the one summed over), got a 0-dim tensor")
    n_cols = x.shape[-1]
    check_shape(weight, "weight", (n_cols,))
    if bias is not None and (bias.dim() > 1 or bias.numel() != 1):
        raise ValueError(f"bias must be a scalar: shape () or (1,), got {tuple(bias.shape)}")

    float64 = float64_among(("x", "weight", "bias"), x, weight, bias)
    kernels = use_kernels(x, use_triton, (weight, bias), dtensors=True, float64=float64)
    # Empty inputs take the reference: no launch, and autograd still gives (zero) grads.
    if x.numel() == 0 or not kernels:
        return reference.weighted_sum(x, weight, None if bias is None else bias.reshape(()))
    x2 = kernel_rows(x, n_cols)
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    lead = x.shape[:-1]
    return KernelRoute(_kernels.weighted_sum, (x2, w, bias), (), None if x2 is x else (lambda y: y.reshape(lead)))


def _weighted_sum_kernel_tensors(x, weight, bias) -> tuple:
    """The kernel op's tensors: the bias as a 0-dim tensor (nn.Linear(D, 1)'s is (1,))."""
    return x, weight, bias if bias is None or not bias.dim() else bias.reshape(())


_WEIGHTED_SUM = OpRouter("weighted_sum", _weighted_sum_route, _weighted_sum_kernel_tensors)


def coor_descent(
    s: Tensor,
    *,
    n_iters: int,
    k: Union[float, Tensor],
    eps: float = 0.1,
    eps_init: Optional[float] = None,
    eps_decay: float = 1.0,
    mask: Optional[Tensor] = None,
    use_triton: Optional[bool] = None,
) -> Tensor:
    """Soft top-k of ``s`` over its last dim by coordinate descent with eps-scaling (CoLT5).

    Rows are all leading dims. Per row, with ``e = max(eps_init or eps, eps)``::

        a = 0; b = -s
        repeat n_iters times:
            a = e * (log k - logsumexp over valid j of (s_j + b_j) / e)
            b = -relu(s + a);  e = max(e * eps_decay, eps)
        return exp((s + a + b) / e)

    Scores lie in [0, 1] and sum to about ``k`` per row. ``k`` is a positive number at most
    ``s.shape[-1]`` (a row of n entries cannot sum to more than n: ``k > n`` is a
    ValueError; pass ``min(k, n)``, as the router does) or a tensor broadcastable to
    ``s.shape[:-1]`` (one value per row; its values are clamped to >= 1e-20 inside log k,
    and it gets a gradient when it requires one). A tensor ``k`` is not compared with n,
    which would read it on the host (a sync on every call): a row whose k exceeds n gets
    scores summing to less than n, not k. ``mask`` (bool,
    ``s``'s shape, True = valid) excludes entries: they score 0, and fully masked rows are
    all zeros with zero gradients. fp16/bf16 ``s`` is computed in fp32 and returned in
    its dtype; float64 ``s`` is computed by the torch reference in float64 (``use_triton=True``
    on it is a ValueError). Gradients are
    those of the unrolled iterations (exact, not a fixed-point approximation), as
    colt5-attention's ``coor_descent``.
    """
    k_tensor = isinstance(k, Tensor)
    return _COOR_DESCENT.call((s, mask, k if k_tensor else None),
                              (n_iters, None if k_tensor else k, eps, eps_init, eps_decay, use_triton))


def _coor_descent_route(s, mask, k_tensor, n_iters, k_value, eps, eps_init, eps_decay, use_triton):
    """A coor_descent call not planned yet: the checks, the path, the reshapes. ``k`` is
    ``k_tensor`` when given, else the number ``k_value``."""
    k = k_value if k_tensor is None else k_tensor
    check_tensor(s, "s", INPUT_DTYPES)
    if s.dim() < 1:
        raise ValueError(f"s must have at least one dim (rows x sequence), got shape {tuple(s.shape)}")
    check_int(n_iters, "n_iters", minimum=1)
    check_number(eps, "eps", positive=True)
    check_number(eps_init, "eps_init", positive=True, allow_none=True)
    check_number(eps_decay, "eps_decay", positive=True)
    lead = s.shape[:-1]
    if isinstance(k, Tensor):
        check_tensor(k, "k", INPUT_DTYPES)
        if k.dim() > len(lead) or any(a not in (1, b) for a, b in zip(reversed(k.shape), reversed(lead))):
            raise ValueError(f"k of shape {tuple(k.shape)} must broadcast to s's leading dims {tuple(lead)}")
        k_rows = k.expand(lead)
    else:
        check_number(k, "k", positive=True)
        check_k_within_row(k, s.shape)
        k_rows = None
    if mask is not None:
        check_tensor(mask, "mask", (torch.bool,))
        check_shape(mask, "mask", s.shape)
    check_same_device(("s", "k", "mask"), s, k_rows, mask)

    # float64 s takes the reference in float64; a float64 k tensor (one value a row, read as
    # fp32 by the kernels) does not decide the path.
    kernels = use_kernels(s, use_triton, (mask, k_rows), dtensors=True, float64=float64_among(("s",), s))
    n_cols = s.shape[-1]
    if s.numel() == 0:
        return s * 0  # empty, and still in the autograd graph of s
    if not kernels:
        return reference.coor_descent(s, n_iters, k if k_rows is None else k_rows, float(eps),
                                      eps_init, float(eps_decay), mask)
    s2 = kernel_rows(s, n_cols)
    m2 = None if mask is None else kernel_rows(mask, n_cols)
    # (k as given while s is; else one value a row of s2)
    k2 = k_tensor if s2 is s or k_rows is None else k_rows.reshape(-1)
    tail = (None if k_rows is not None else float(k), n_iters, float(eps),
            float(eps if eps_init is None else eps_init), float(eps_decay))
    shape = s.shape
    return KernelRoute(_kernels.coor_descent, (s2, m2, k2), tail, None if s2 is s else (lambda y: y.reshape(shape)))


def _coor_descent_kernel_tensors(s, mask, k) -> tuple:
    """The kernel op's tensors: ``k`` (when a tensor) as one value a row, of s's leading shape
    (a shard of s along a row dim is then the same shard of k): 1-D as it is, else contiguous."""
    if k is not None:
        k = k.expand(s.shape[:-1])
        if k.dim() > 1 and not k.is_contiguous():
            k = k.contiguous()
    return s, mask, k


_COOR_DESCENT = OpRouter("coor_descent", _coor_descent_route, _coor_descent_kernel_tensors)


def softmax(
    x: Tensor,
    causal: bool = False,
    scale: Optional[float] = None,
    key_padding_mask: Optional[Tensor] = None,
    use_triton: Optional[bool] = None,
) -> Tensor:
    """Softmax of ``scale * x`` over the last dim, with optional causal and key padding masks.

    ``x`` holds attention scores (..., Nq, Nk); without masks it may have any shape.
    ``scale`` (default 1) multiplies ``x`` inside the kernel (no extra pass).

    ``causal=True`` lets query i (0-based) see keys j <= i + (Nk - Nq): the mask is
    aligned to the bottom-right corner, as in flash-attn >= 2.1 and
    ``torch.nn.attention.bias.causal_lower_right``. Square scores give the usual lower
    triangle; a single query (Nq = 1, decoding) sees every key.

    ``key_padding_mask`` is a bool (B, Nk) tensor, True marking padding keys to ignore
    (``nn.MultiheadAttention``'s meaning), for ``x`` of shape (B, Nq, Nk) or (B, H, Nq, Nk).
    That is the opposite of a Hugging Face ``attention_mask`` (1 = attend, 0 = padding):
    pass ``key_padding_mask=attention_mask == 0``. An extended mask (B, 1, 1, Nk) is refused
    with its conversion in the error: its bool form (True = attend, as torch's
    ``scaled_dot_product_attention``) gives ``~mask[:, 0, 0, :]``, its additive float form
    (0 = attend, large negative = padding) ``mask[:, 0, 0, :] < 0``.

    A row whose keys are all masked (the top rows when Nq > Nk with ``causal``, or a batch
    entry that is all padding) gives zeros and a zero gradient, never NaN. Statistics are
    fp32; the output has ``x``'s shape and dtype (fp32, fp16 or bf16; float64 takes the
    reference, in float64).
    """
    return _SOFTMAX.call((x, key_padding_mask), (causal, scale, use_triton))


def _check_key_padding_mask(mask: Any, x: Tensor) -> None:
    """Refuse the attention masks of other conventions with the exact conversion to ours
    ((B, Nk) bool, True = padding), rather than a bare dtype or shape error.

    An extended mask (B, 1, 1, Nk) is not squeezed and taken: its bool form means True =
    attend (torch's scaled_dot_product_attention, Hugging Face's 4-D masks), the opposite of
    ours, so taken as it is it would silently mask every real key and keep the padding."""
    if not isinstance(mask, Tensor):
        return  # (check_tensor names what it is)
    shape = f"({x.shape[0]}, {x.shape[-1]})" if x.dim() >= 2 else "(B, Nk)"
    ours = f"key_padding_mask is bool of shape {shape}, True marking padding keys"
    if mask.dim() == 4 and mask.shape[1] == mask.shape[2] == 1:
        if mask.dtype == torch.bool:
            raise ValueError(
                f"key_padding_mask of shape {tuple(mask.shape)} ({mask.dtype}) looks like an extended attention "
                f"mask; {ours}. If True marks keys to attend (as in torch's scaled_dot_product_attention and "
                f"Hugging Face's 4-D masks), pass key_padding_mask=~mask[:, 0, 0, :]; if True marks padding, "
                f"key_padding_mask=mask[:, 0, 0, :] (a view, no copy)")
        raise TypeError(
            f"key_padding_mask of shape {tuple(mask.shape)} ({mask.dtype}) looks like an extended attention mask; "
            f"{ours}. For an additive mask (0 = attend, a large negative value or -inf = padding, as Hugging "
            f"Face's), pass key_padding_mask=mask[:, 0, 0, :] < 0")
    if mask.dtype.is_floating_point:
        try:
            check_tensor(mask, "key_padding_mask", (torch.bool,))
        except TypeError as err:
            raise TypeError(f"{err}. For an additive mask (0 = attend, a large negative value or -inf = padding) "
                            f"pass mask < 0; for a Hugging Face attention_mask (1 = attend) attention_mask == 0") from None


def _softmax_route(x, key_padding_mask, causal, scale, use_triton):
    """A softmax call not planned yet: the checks, the path, the reshapes."""
    check_tensor(x, "x", INPUT_DTYPES)
    if key_padding_mask is not None:
        _check_key_padding_mask(key_padding_mask, x)
        check_tensor(key_padding_mask, "key_padding_mask", (torch.bool,))
        check_same_device(("x", "key_padding_mask"), x, key_padding_mask)
    check_number(scale, "scale", allow_none=True)
    check_flag(causal, "causal")
    if causal and x.dim() < 2:
        raise ValueError(f"causal=True needs scores of shape (..., Nq, Nk); got x of shape {tuple(x.shape)}")
    if key_padding_mask is not None:
        if x.dim() not in (3, 4):
            raise ValueError(
                f"key_padding_mask needs scores of shape (B, Nq, Nk) or (B, H, Nq, Nk); "
                f"got x of shape {tuple(x.shape)}"
            )
        check_shape(key_padding_mask, "key_padding_mask", (x.shape[0], x.shape[-1]))
    scale = 1.0 if scale is None else float(scale)

    kernels = use_kernels(x, use_triton, (key_padding_mask,), dtensors=True)
    if kernels and causal and _sharded_along(x, x.dim() - 2):
        raise ValueError(
            "softmax(causal=True) of scores sharded along the query dim (Shard(-2)): each shard's causal "
            "offset is not its own; shard the scores by batch or heads (attention's ColwiseParallel) instead")
    # Empty inputs take the reference: no launch, and autograd still gives (empty) grads.
    if not kernels or x.numel() == 0:
        return reference.softmax(x, causal, scale, key_padding_mask)
    n_cols = x.shape[-1] if x.dim() else 1
    x2 = kernel_rows(x, n_cols)
    # (0, 0): the kernel op takes both from x as given, which is what a DTensor's local shard holds
    rows_per_batch, n_q = ((x.numel() // n_cols // x.shape[0] if key_padding_mask is not None else 1,
                            x.shape[-2] if causal else 1) if x2 is not x else (0, 0))
    shape = x.shape
    return KernelRoute(_kernels.softmax, (x2, key_padding_mask), (n_q, rows_per_batch, causal, scale),
                  None if x2 is x else (lambda y: y.reshape(shape)))


_SOFTMAX = OpRouter("softmax", _softmax_route, lambda x, key_padding_mask: (x, key_padding_mask))
