"""TritonRMSNorm: a drop-in for ``torch.nn.RMSNorm`` (and, through ``convert``, for the
RMSNorm classes of Hugging Face's Llama, Mistral, Qwen2 and Gemma) running the Triton kernels."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .. import functional as F
from ._autocast import autocast_dtype
from ._compiled import use_triton_for
from ..fp8 import FP8Recipe, FP8Rows
from ._config import check_flag, check_fp8, check_fp8_call, check_normalized_shape, check_number, check_use_triton


class TritonRMSNorm(nn.Module):
    """RMS normalization over the trailing ``normalized_shape`` dims:
    ``y = x / sqrt(mean(x^2) + eps) * weight``, computed in fp32 and rounded once.

    The parameter is named as in ``nn.RMSNorm`` (``weight``, ones at init), so state_dicts
    load both ways.

    Args:
        normalized_shape: int or tuple, the trailing dims normalized together.
        eps: added to the mean square; ``None`` takes torch's default (the fp32 epsilon,
            ``torch.finfo(torch.float32).eps``, as ``nn.RMSNorm`` does for fp16/bf16/fp32;
            float64's for float64 inputs, which take the reference in float64).
        elementwise_affine: learn ``weight``.
        unit_offset: Gemma's form ``norm(x) * (1 + weight)`` (in fp32, then cast);
            ``weight`` is zeros at init.
        use_triton: ``None`` auto, ``True``/``False`` force the kernels / the reference.
        fp8: an :class:`~triton_layers.FP8Recipe`: ``forward`` returns the output as FP8
            (:class:`~triton_layers.FP8Rows`, :func:`triton_layers.functional.rms_norm_fp8`),
            normalizing the last dim. Also an attribute, as is ``fp8_scale`` (None, or the
            static per-tensor scale: a one-element fp32 tensor).

    ``forward(x, residual=None)``: ``y``, or ``(y, h)`` with ``h = x + residual`` (see
    :func:`triton_layers.functional.rms_norm`).

    ``cast_before_weight`` (an attribute, False here; True on the modules ``convert`` makes
    of Llama, Mistral and Qwen2 norms): round the normalized value to x's dtype before the
    product with the weight, whose result has the dtype torch gives ``weight * x``, as
    those models compute.

    ``torch_ops_when_compiled`` (an attribute, False here; True on the modules ``convert``
    makes): under torch.compile, a call without a residual runs as torch ops, so that Inductor
    fuses it with the ops around it (see ``layers/_compiled.py``).
    """

    cast_before_weight: bool = False
    torch_ops_when_compiled: bool = False
    output_under_autocast: str = "autocast"  # (layers/_autocast.py: "autocast", "torch" or "unchanged")
    fp8: Optional[FP8Recipe] = None  # (class defaults: a module pickled before these existed still runs)
    fp8_scale: Optional[Tensor] = None

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int]],
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        *,
        unit_offset: bool = False,
        use_triton: Optional[bool] = None,
        device: Optional[Union[torch.device, str]] = None,
        dtype: Optional[torch.dtype] = None,
        fp8: Optional[FP8Recipe] = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.fp8 = check_fp8(fp8, self.normalized_shape)
        self.eps = check_number(eps, "eps", minimum=0, allow_none=True)
        self.elementwise_affine = check_flag(elementwise_affine, "elementwise_affine")
        self.unit_offset = check_flag(unit_offset, "unit_offset")
        self.use_triton = check_use_triton(use_triton)
        if unit_offset and not elementwise_affine:
            raise ValueError("unit_offset=True multiplies by 1 + weight: it needs elementwise_affine=True")
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to ones (zeros with ``unit_offset``: a factor of 1 either way)."""
        if self.weight is not None:
            (nn.init.zeros_ if self.unit_offset else nn.init.ones_)(self.weight)

    @property
    def variance_epsilon(self) -> Optional[float]:
        """``eps`` under the name Hugging Face's Llama-family norms give it."""
        return self.eps

    @variance_epsilon.setter
    def variance_epsilon(self, value: Optional[float]) -> None:
        self.eps = value

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, *,
                residual_in_place: bool = False) -> Union[Tensor, tuple[Tensor, Tensor], FP8Rows]:
        """Normalize ``x`` (any leading dims): ``y`` of x's shape and dtype (autocast's dtype
        under autocast). With a ``residual``: ``(y, h)``, ``h = x + residual`` in the
        residual's dtype and ``y`` its normalization, in one pass. ``residual_in_place=True``
        (serving, where no gradient flows): h is written into ``residual``, returned as
        ``(y, residual)`` (``functional.layer_norm`` says more). With an ``fp8`` recipe: the
        :class:`~triton_layers.FP8Rows` of ``functional.rms_norm_fp8``."""
        if self.fp8 is not None:
            check_fp8_call(self.fp8, self.normalized_shape, residual_in_place)
            return F._norm_fp8(x, self.weight, None, self.eps, residual, None, self.fp8, self.fp8_scale,
                               use_triton_for(self, residual), rms=True, unit_offset=self.unit_offset,
                               cast_before_weight=self.cast_before_weight)
        out_dtype, autocast = autocast_dtype(self.output_under_autocast, x, True)
        # (NormOptions built positionally, in its field order: a third of the keyword form's host
        # time; eps None: torch's default for x's dtype)
        return F._norm(x, self.weight, None, residual, F.NormOptions(
            self.eps, out_dtype, None, use_triton_for(self, residual), self.normalized_shape, True, False,
            self.unit_offset, self.cast_before_weight, autocast, residual_in_place))

    def extra_repr(self) -> str:
        extra = ", unit_offset=True" if self.unit_offset else ""
        extra += ", cast_before_weight=True" if self.cast_before_weight else ""
        extra += ", torch_ops_when_compiled=True" if self.torch_ops_when_compiled else ""
        extra += f", fp8={self.fp8}" if self.fp8 is not None else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}{extra}"

    @classmethod
    def _like(cls, weight: Optional[Tensor], normalized_shape, eps, **kwargs: Any) -> "TritonRMSNorm":
        module = cls(normalized_shape, eps=eps, elementwise_affine=weight is not None,
                     device=None if weight is None else weight.device,
                     dtype=None if weight is None else weight.dtype, **kwargs)
        if weight is not None:
            with torch.no_grad():
                module.weight.copy_(weight)
        return module

    @classmethod
    def from_torch(cls, rms_norm: nn.RMSNorm, **kwargs: Any) -> "TritonRMSNorm":
        """A TritonRMSNorm computing what ``rms_norm`` does, with a copy of its weight."""
        if not isinstance(rms_norm, nn.RMSNorm):
            raise TypeError(f"from_torch expects an nn.RMSNorm, got {type(rms_norm).__name__}")
        return cls._like(rms_norm.weight, rms_norm.normalized_shape, rms_norm.eps, **kwargs)

    @classmethod
    def from_hf(cls, norm: nn.Module, *, family: str, **kwargs: Any) -> "TritonRMSNorm":
        """A TritonRMSNorm computing what a Hugging Face RMSNorm of ``family`` does (``"llama"``,
        ``"olmo2"`` or ``"gemma"``: ``triton_layers/_families.py`` has their formulas), with a
        copy of its weight and its epsilon (``variance_epsilon``, ``eps`` or ``epsilon``)."""
        from .._families import LAYER_FLAGS, eps_of

        if family not in LAYER_FLAGS:
            raise ValueError(f"family must be one of {', '.join(map(repr, LAYER_FLAGS))}, got {family!r}")
        eps = eps_of(norm)
        if eps is None:
            raise ValueError(f"{type(norm).__name__} has no epsilon under the names variance_epsilon, eps, epsilon")
        cast_before_weight, unit_offset = LAYER_FLAGS[family]
        module = cls._like(norm.weight, tuple(norm.weight.shape), eps, unit_offset=unit_offset, **kwargs)
        module.cast_before_weight = cast_before_weight
        return module
