"""FP8 out of the norms: the recipe (how scales are taken), the result, and the activation
autograd sees.

Conventions (those of vLLM, SGLang, FlashInfer and DeepSeek-V3's 1x128 recipe):

- ``scale`` is the **dequantization** scale: ``y ~= data * scale`` (what ``torch._scaled_mm``
  takes as ``scale_a``). A dynamic scale is ``max(amax, AMAX_FLOOR) / fp8_max`` of the
  values it covers (``amax`` clamped to ``scale_ub`` first where one is given), rounded up
  to a power of two with ``pow2_scales`` (UE8M0: ``2 ** ceil(log2(s))``, taken exactly from
  the bits, not through ``log2``).
- ``data = saturate(y * (1 / scale)).to(fp8)``: the reciprocal rounded once in fp32, the
  product in fp32, clamped to ``[-fp8_max, fp8_max]`` (NaN stays NaN) and cast round to
  nearest even. ``y`` is the norm's output in fp32, before any rounding to x's dtype (with
  ``cast_before_weight`` the normalized value is rounded before the weight, as the norm does).

The transposed copy (``FP8Recipe(transposed=True)``, the 1x128 recipe only), what the
weight-gradient GEMM reads (DeepSeek-V3's and TransformerEngine's blockwise recipes): the
output's ``M`` rows (its leading dims flattened) and ``H`` columns seen as ``y.T`` (``H x M``)
and quantized in 1x128 blocks along ``M``, i.e. one scale per column of ``y`` and block of
128 rows, the last block holding the ``M % 128`` rows left (ragged). ``data_t`` is ``(H, M)``
and ``scale_t`` ``(H, ceil(M / 128))``, both contiguous (row-major); the same conventions
(scale from the block's amax, ``pow2_scales``, saturating cast).

``triton_layers.reference.norm_fp8`` (and ``quantize_fp8_transposed``) compute exactly that in
torch ops; the kernels compute the same, and differ only where their fp32 statistics round
differently (tests count those).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

__all__ = ["FP8Recipe", "FP8Rows", "FP8Activation", "GROUP_SIZE", "AMAX_FLOOR", "GRANULARITIES", "FP8_DTYPES"]

GROUP_SIZE = 128
"""Columns per scale in the ``"per_group"`` recipe (DeepSeek-V3's 1x128 blocks)."""

AMAX_FLOOR = 1e-12
"""The smallest amax a dynamic scale is taken from: an all-zero row gets a tiny scale and zeros, not NaN."""

GRANULARITIES = ("per_tensor", "per_token", "per_group")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class FP8Recipe:
    """How a norm's output is quantized to FP8.

    Args:
        granularity: ``"per_tensor"`` (one scale: given by the call's ``scale`` tensor, static,
            or the whole output's amax, dynamic), ``"per_token"`` (a scale per row) or
            ``"per_group"`` (a scale per 1x128 block of a row; the hidden size must be a
            multiple of 128).
        dtype: ``torch.float8_e4m3fn`` (the forward's usual choice) or ``torch.float8_e5m2``.
        pow2_scales: round each dynamic scale up to a power of two (UE8M0, as DeepSeek-V3 and
            the MX formats use).
        scale_ub: per-token only: the amax a scale is taken from is clamped to this first
            (vLLM's ``scale_ub``), so one outlier row cannot flatten the others' GEMM. None: no bound.
        column_major_scales: per-group only: the scales in the column-major, TMA-aligned layout
            DeepGEMM-style GEMMs read (shape ``(rows, hidden / 128)``, strides ``(1, rows
            rounded up to 4)``) instead of row-major.
        transposed: per-group only: also write, in the same call, the transposed copy the
            weight-gradient GEMM reads (:class:`FP8Rows` ``data_t`` ``(hidden, rows)`` and
            ``scale_t`` ``(hidden, ceil(rows / 128))``: a scale per column and 128-row block,
            the last block ragged; both row-major, the rows flattened; the module docstring
            has the conventions). ``column_major_scales`` lays out ``scale`` only.
    """

    granularity: str = "per_token"
    dtype: torch.dtype = torch.float8_e4m3fn
    pow2_scales: bool = False
    scale_ub: Optional[float] = None
    column_major_scales: bool = False
    transposed: bool = False

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(map(repr, GRANULARITIES))}; "
                             f"got {self.granularity!r}")
        if self.dtype not in FP8_DTYPES:
            raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2; got {self.dtype!r}")
        for name in ("pow2_scales", "column_major_scales", "transposed"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool; got {getattr(self, name)!r}")
        if self.scale_ub is not None:
            if self.granularity != "per_token":
                raise ValueError(f"scale_ub bounds per-token scales; got it with granularity {self.granularity!r}")
            if isinstance(self.scale_ub, bool) or not isinstance(self.scale_ub, (int, float)) \
                    or not self.scale_ub > 0 or self.scale_ub == float("inf"):
                raise ValueError(f"scale_ub must be a finite number > 0; got {self.scale_ub!r}")
        if self.column_major_scales and self.granularity != "per_group":
            raise ValueError("column_major_scales is a layout of per-group scales; "
                             f"got it with granularity {self.granularity!r}")
        if self.transposed and self.granularity != "per_group":
            raise ValueError("transposed=True writes the 128x1-block copy of the 1x128 recipe "
                             f"(granularity 'per_group'); got it with granularity {self.granularity!r}")

    @property
    def fp8_max(self) -> float:
        """The largest finite value of ``dtype`` (448 for e4m3fn, 57344 for e5m2)."""
        return float(torch.finfo(self.dtype).max)

    def scale_shape(self, rows_shape: tuple[int, ...], n_cols: int) -> tuple[int, ...]:
        """The scales' shape for an output of ``(*rows_shape, n_cols)``: ``()`` per tensor,
        ``(*rows_shape, 1)`` per token, ``(*rows_shape, n_cols // 128)`` per group
        (column-major: ``(rows, n_cols // 128)``, the rows flattened)."""
        if self.granularity == "per_tensor":
            return ()
        if self.granularity == "per_token":
            return (*rows_shape, 1)
        if self.column_major_scales:
            rows = 1
            for d in rows_shape:
                rows *= d
            return (rows, n_cols // GROUP_SIZE)
        return (*rows_shape, n_cols // GROUP_SIZE)


    def transposed_shapes(self, n_rows: int, n_cols: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(data_t's shape, scale_t's shape)`` for ``n_rows`` rows (the leading dims
        flattened) of ``n_cols``: ``(n_cols, n_rows)`` and ``(n_cols, ceil(n_rows / 128))``."""
        return (n_cols, n_rows), (n_cols, -(-n_rows // GROUP_SIZE))


def tma_aligned_rows(rows: int) -> int:
    """The column stride of column-major per-group scales: ``rows`` rounded up to 4 fp32
    (16 bytes, TMA's alignment)."""
    return (rows + 3) // 4 * 4


def new_scales(recipe: FP8Recipe, rows_shape: tuple[int, ...], n_cols: int, like: Tensor) -> Tensor:
    """An uninitialized fp32 scales tensor in the recipe's shape and layout (column-major
    per-group scales: a ``(groups, tma_aligned_rows(rows))`` buffer seen transposed)."""
    shape = recipe.scale_shape(rows_shape, n_cols)
    if recipe.column_major_scales:
        rows, groups = shape
        return like.new_empty((groups, tma_aligned_rows(rows)), dtype=torch.float32).t()[:rows]
    return like.new_empty(shape, dtype=torch.float32)


def dequantize(data: Tensor, scale: Tensor, granularity: str, dtype: torch.dtype) -> Tensor:
    """``data * scale`` in fp32, cast to ``dtype``: the value the FP8 data stands for."""
    values = data.to(torch.float32)
    if granularity == "per_group":
        groups = scale.shape[-1]
        lead = values.shape[:-1]
        values = (values.reshape(*lead, groups, -1) * scale.reshape(*lead, groups, 1)).reshape(data.shape)
    else:
        values = values * scale
    return values.to(dtype)


class FP8Rows(NamedTuple):
    """What a norm returns with an FP8 recipe.

    - ``data``: the FP8 output, x's shape, contiguous.
    - ``scale``: fp32 dequantization scales (:class:`FP8Recipe` says their shape).
    - ``h``: the residual sum ``x + residual`` with a residual, else None.
    - ``activation``: the same output as autograd sees it (:class:`FP8Activation`, nominally of
      the norm's output dtype) where a gradient will flow, else None: hand it to a module
      that differentiates through the quantized activation; its gradient reaches x, the
      residual and the parameters straight through the quantization (as the unquantized
      norm's backward, on that gradient).
    - ``data_t``, ``scale_t``: with ``FP8Recipe(transposed=True)``, the transposed copy for the
      weight-gradient GEMM: FP8 ``(hidden, rows)`` and fp32 scales ``(hidden, ceil(rows / 128))``,
      one per column and 128-row block (the rows: x's leading dims flattened); else None. They
      carry no gradient.
    """

    data: Tensor
    scale: Tensor
    h: Optional[Tensor] = None
    activation: Optional["FP8Activation"] = None
    data_t: Optional[Tensor] = None
    scale_t: Optional[Tensor] = None


class FP8Activation(torch.Tensor):
    """An FP8 activation that autograd sees as a tensor of its nominal (high-precision) dtype.

    ``qdata`` (FP8) and ``scale`` are what a scaled GEMM reads (``torch._scaled_mm``);
    :meth:`dequantize` gives ``qdata * scale`` in the nominal dtype, and every torch op
    applied to it sees that dequantized value. A gradient flowing into it is in the nominal
    dtype (never cast to FP8), and the norm that made it passes it straight through the
    quantization."""

    qdata: Tensor
    scale: Tensor
    granularity: str

    @staticmethod
    def __new__(cls, qdata: Tensor, scale: Tensor, granularity: str, dtype: torch.dtype,
                requires_grad: bool = False) -> "FP8Activation":
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=dtype, device=qdata.device,
                                                   requires_grad=requires_grad)

    def __init__(self, qdata: Tensor, scale: Tensor, granularity: str, dtype: torch.dtype,
                 requires_grad: bool = False) -> None:
        self.qdata, self.scale, self.granularity = qdata, scale, granularity

    def __tensor_flatten__(self):  # (torch.compile traces a wrapper subclass by its inner tensors)
        return ["qdata", "scale"], (self.granularity, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: tuple, outer_size, outer_stride) -> "FP8Activation":
        return FP8Activation(inner["qdata"], inner["scale"], *meta)

    def dequantize(self) -> Tensor:
        """``qdata * scale`` as a plain tensor of the nominal dtype."""
        return dequantize(self.qdata, self.scale, self.granularity, self.dtype)

    def __repr__(self) -> str:  # (a wrapper subclass has no storage of its own to print)
        return (f"FP8Activation(shape={tuple(self.shape)}, dtype={self.dtype}, fp8={self.qdata.dtype}, "
                f"granularity={self.granularity!r})")

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # detach and alias (what autograd applies to a saved or returned tensor) keep the FP8
        # form; every other op computes on the dequantized value.
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            (a,) = args
            return cls(a.qdata, a.scale, a.granularity, a.dtype)

        def plain(t):
            return t.dequantize() if isinstance(t, cls) else t

        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))


class _ReferenceStraightThrough(torch.autograd.Function):
    """The reference path's straight-through: the activation's gradient is the fp32 y's."""

    @staticmethod
    def forward(ctx, y, data, scale, granularity, dtype):
        ctx.y_dtype = y.dtype
        return FP8Activation(data, scale, granularity, dtype)

    @staticmethod
    def backward(ctx, d_activation):
        return d_activation.to(ctx.y_dtype), None, None, None, None


def reference_activation(y: Tensor, data: Tensor, scale: Tensor, granularity: str,
                         dtype: torch.dtype) -> FP8Activation:
    """The :class:`FP8Activation` of ``data`` and ``scale`` whose gradient reaches the
    differentiable ``y`` they were quantized from (the reference path's straight-through)."""
    return _ReferenceStraightThrough.apply(y, data, scale, granularity, dtype)
