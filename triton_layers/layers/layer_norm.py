"""TritonLayerNorm: a drop-in for ``torch.nn.LayerNorm`` running the Triton kernels."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .. import functional as F
from ._autocast import autocast_dtype
from ._compiled import use_triton_for
from ..fp8 import FP8Recipe, FP8Rows
from ._config import check_flag, check_fp8, check_fp8_call, check_normalized_shape, check_number, check_use_triton


class TritonLayerNorm(nn.Module):
    """Layer normalization over the trailing ``normalized_shape`` dims.

    A drop-in for ``nn.LayerNorm``: same arguments and defaults (``bias=True``) and the
    same parameter names (``weight``, the learnable gamma, ones at init; ``bias``, zeros,
    present unless ``bias=False``), so state_dicts load both ways. Bias-free checkpoints
    also load strictly into a layer with a bias, which gets a zero bias (what they
    computed): ``nn.LayerNorm(d, bias=False)``'s, this layer's from before ``bias=True``
    became the default, and those of its first version, which called the gain ``gamma`` (read
    as ``weight``).

    Args:
        normalized_shape: int or tuple, the trailing dims normalized together.
        eps: added to the variance, as in ``nn.LayerNorm`` (default 1e-5).
        elementwise_affine: learn ``weight`` (and ``bias`` unless ``bias=False``).
        bias: learn an additive bias (default True, as ``nn.LayerNorm``); no parameter
            or buffer at all when False.
        stable: divide each row by its max |x| (a constant for autograd) first.
        use_triton: ``None`` auto, ``True``/``False`` force the kernels / the reference.
        fp8: an :class:`~triton_layers.FP8Recipe`: ``forward`` returns the output as FP8
            (:class:`~triton_layers.FP8Rows`, :func:`triton_layers.functional.layer_norm_fp8`),
            normalizing the last dim (not with ``stable``). Also an attribute, as is
            ``fp8_scale`` (None, or the static per-tensor scale: a one-element fp32 tensor).

    ``torch_ops_when_compiled`` (an attribute, False here; True on the modules ``convert``
    makes): under torch.compile, a call without a residual runs as torch ops, so that Inductor
    fuses it with the ops around it (see ``layers/_compiled.py``).
    """

    torch_ops_when_compiled: bool = False
    output_under_autocast: str = "autocast"  # (layers/_autocast.py: "autocast", "torch" or "unchanged")
    fp8: Optional[FP8Recipe] = None  # (class defaults: a module pickled before these existed still runs)
    fp8_scale: Optional[Tensor] = None

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int]],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        stable: bool = False,
        use_triton: Optional[bool] = None,
        device: Optional[Union[torch.device, str]] = None,
        dtype: Optional[torch.dtype] = None,
        fp8: Optional[FP8Recipe] = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.fp8 = check_fp8(fp8, self.normalized_shape)
        self.eps = check_number(eps, "eps", minimum=0)
        self.elementwise_affine = check_flag(elementwise_affine, "elementwise_affine")
        bias = check_flag(bias, "bias")
        self.stable = check_flag(stable, "stable")
        self.use_triton = check_use_triton(use_triton)
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.bias = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to ones, bias to zeros."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, *,
                residual_in_place: bool = False) -> Union[Tensor, tuple[Tensor, Tensor], FP8Rows]:
        """Normalize ``x`` (any leading dims): ``y`` of x's shape and dtype (autocast's dtype
        under autocast). With a ``residual``: ``(y, h)``, ``h = x + residual`` in the residual's
        dtype and ``y`` its normalization, in one pass (``functional.layer_norm``).
        ``residual_in_place=True`` (serving, where no gradient flows): h is written into
        ``residual``, returned as ``(y, residual)``. With an ``fp8`` recipe: the
        :class:`~triton_layers.FP8Rows` of ``functional.layer_norm_fp8``."""
        if self.fp8 is not None:
            check_fp8_call(self.fp8, self.normalized_shape, residual_in_place)
            if self.stable:
                raise ValueError("the FP8 norms have no stable mode: set fp8=None or stable=False")
            return F._norm_fp8(x, self.weight, self.bias, self.eps, residual, None, self.fp8, self.fp8_scale,
                               use_triton_for(self, residual), rms=False)
        out_dtype, autocast = autocast_dtype(self.output_under_autocast, x, False)
        # (NormOptions built positionally, in its field order: a third of the keyword form's host time)
        return F._norm(x, self.weight, self.bias, residual, F.NormOptions(
            self.eps, out_dtype, None, use_triton_for(self, residual), self.normalized_shape, False, self.stable,
            False, False, autocast, residual_in_place))

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}, stable={self.stable}"
            + (", torch_ops_when_compiled=True" if self.torch_ops_when_compiled else "")
            + (f", fp8={self.fp8}" if self.fp8 is not None else "")
        )

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # Checkpoints of this layer's first version call the gain `gamma`.
        legacy = prefix + "gamma"
        if legacy in state_dict and prefix + "weight" not in state_dict:
            state_dict[prefix + "weight"] = state_dict.pop(legacy)
        # A bias-free checkpoint (a weight, no bias) computed what a zero bias computes.
        weight = state_dict.get(prefix + "weight")
        if self.bias is not None and prefix + "bias" not in state_dict and isinstance(weight, Tensor):
            state_dict[prefix + "bias"] = weight.new_zeros(self.normalized_shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def from_torch(cls, layer_norm: nn.LayerNorm, **kwargs: Any) -> "TritonLayerNorm":
        """A TritonLayerNorm computing what ``layer_norm`` does, with copies of its parameters."""
        if not isinstance(layer_norm, nn.LayerNorm):
            raise TypeError(f"from_torch expects an nn.LayerNorm, got {type(layer_norm).__name__}")
        ref = layer_norm.weight if layer_norm.weight is not None else None
        module = cls(
            layer_norm.normalized_shape,
            eps=layer_norm.eps,
            elementwise_affine=layer_norm.elementwise_affine,
            bias=layer_norm.bias is not None,
            device=None if ref is None else ref.device,
            dtype=None if ref is None else ref.dtype,
            **kwargs,
        )
        with torch.no_grad():
            if module.weight is not None:
                module.weight.copy_(layer_norm.weight)
            if module.bias is not None:
                module.bias.copy_(layer_norm.bias)
        return module
