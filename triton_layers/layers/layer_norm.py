"""TritonLayerNorm: a drop-in for ``torch.nn.LayerNorm`` running the Triton kernels."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .. import functional as F


class TritonLayerNorm(nn.Module):
    """Layer normalization over the trailing ``normalized_shape`` dims.

    Parameters are named as in ``nn.LayerNorm`` (``weight``, the learnable gamma, ones at
    init; ``bias``, zeros, present only with ``bias=True``), so state_dicts load both
    ways; the legacy key ``gamma`` is accepted for ``weight``.

    Args:
        normalized_shape: int or tuple, the trailing dims normalized together.
        eps: added to the variance, as in ``nn.LayerNorm`` (default 1e-5).
        elementwise_affine: learn ``weight`` (and ``bias`` if ``bias=True``).
        bias: learn an additive bias; no parameter or buffer at all when False.
        stable: divide each row by its max |x| (a constant for autograd) first.
        use_triton: ``None`` auto, ``True``/``False`` force the kernels / the reference.
    """

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int]],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = False,
        stable: bool = False,
        use_triton: Optional[bool] = None,
        device: Optional[Union[torch.device, str]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        if any(d < 0 for d in self.normalized_shape):
            raise ValueError(f"normalized_shape must be non-negative, got {self.normalized_shape}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.stable = stable
        self.use_triton = use_triton
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

    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Union[Tensor, tuple[Tensor, Tensor]]:
        """Normalize ``x`` (any leading dims): ``y`` of x's shape and dtype (autocast's dtype
        under autocast). With a ``residual``: ``(y, h)``, ``h = x + residual`` in the residual's
        dtype and ``y`` its normalization, in one pass (``functional.layer_norm``)."""
        return F.layer_norm(
            x, self.weight, self.bias, self.eps, self.stable, self.use_triton, self.normalized_shape,
            residual=residual,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}, stable={self.stable}"
        )

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # Checkpoints of the seed layer call the gain `gamma`.
        legacy = prefix + "gamma"
        if legacy in state_dict and prefix + "weight" not in state_dict:
            state_dict[prefix + "weight"] = state_dict.pop(legacy)
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
