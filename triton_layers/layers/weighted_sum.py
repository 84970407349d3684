"""WeightedSum: a learnable weighted reduction over the last dim (``nn.Linear(dim, 1)``
without the trailing output dim), running the Triton kernels."""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .. import functional as F
from ._config import check_flag, check_int, check_use_triton


class WeightedSum(nn.Module):
    """``y = (x * weight).sum(-1) + bias``: input (..., dim), output (...).

    Computes what ``nn.Linear(dim, 1)`` computes, squeezed: ``linear(x)[..., 0]``. Sums
    are fp32 whatever the input dtype; the output has the input's dtype, so an fp32
    module can take fp16/bf16 inputs (mixed precision).

    Parameters: ``weight`` of shape (dim,) and, with ``bias=True``, ``bias`` of shape
    (1,) as ``nn.Linear(dim, 1).bias`` (1-D, not 0-dim: FSDP2's ``fully_shard`` refuses
    scalar parameters); both initialised as ``nn.Linear(dim, 1)`` initialises its own
    (same random draws: under the same seed the two layers start equal). An
    ``nn.Linear(dim, 1)`` state_dict maps as ``weight`` <- ``linear.weight.reshape(-1)``
    (shape (1, dim) to (dim,)) and ``bias`` <- ``linear.bias``; such a state_dict also
    loads directly, reshaped on the way in, and so do older checkpoints of this layer
    with a 0-dim bias. See :meth:`from_linear`; :meth:`to_linear` goes back to an
    ``nn.Linear(dim, 1)``.

    Args:
        dim: size of the last input dim, the one summed over.
        bias: learn an additive scalar bias; no parameter at all when False.
        use_triton: ``None`` auto, ``True``/``False`` force the kernels / the reference.
        device, dtype: of the parameters.
    """

    def __init__(
        self,
        dim: int,
        bias: bool = False,
        use_triton: Optional[bool] = None,
        device: Optional[Union[torch.device, str]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim", minimum=0)
        bias = check_flag(bias, "bias")
        self.use_triton = check_use_triton(use_triton)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self.dim, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(1, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As ``nn.Linear(dim, 1)``: both uniform in (-1/sqrt(dim), 1/sqrt(dim))."""
        if self.dim == 0:
            return
        # kaiming_uniform_(a=sqrt(5)) on the (1, dim) view: Linear's own call, same draws.
        nn.init.kaiming_uniform_(self.weight.view(1, self.dim), a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.dim)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """Weighted sum of ``x`` (..., dim) over its last dim; shape (...), x's dtype."""
        # Name x's last dim, not the weight's shape, when they disagree; the other checks
        # (not a tensor, 0-dim, dtype, device) are the functional op's.
        if isinstance(x, Tensor) and x.dim() and x.shape[-1] != self.dim:
            raise ValueError(
                f"x of shape {tuple(x.shape)} must end with dim={self.dim} (the last dim summed over)"
            )
        return F.weighted_sum(x, self.weight, self.bias, self.use_triton)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, bias={self.bias is not None}"

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # An nn.Linear(dim, 1) checkpoint: weight (1, dim) is reshaped. Older checkpoints
        # of this layer hold a 0-dim bias: reshaped to (1,).
        weight, bias = state_dict.get(prefix + "weight"), state_dict.get(prefix + "bias")
        if isinstance(weight, Tensor) and tuple(weight.shape) == (1, self.dim):
            state_dict[prefix + "weight"] = weight.reshape(self.dim)
        if isinstance(bias, Tensor) and bias.dim() == 0:
            state_dict[prefix + "bias"] = bias.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def to_linear(self) -> nn.Linear:
        """The ``nn.Linear(dim, 1)`` computing what this layer computes, unsqueezed
        (``linear(x)[..., 0] == self(x)``): the way back of :meth:`from_linear`, for a model
        or a checkpoint that wants torch's layer again.

        Its ``weight`` (shape (1, dim)) and ``bias`` (shape (1,), or None without a bias)
        are copies of this layer's, on their device, in their dtype, each with its
        ``requires_grad``; ``linear.state_dict()`` loads strictly into a plain
        ``nn.Linear(dim, 1)``. No random initialisation is drawn on the way (the global
        RNG is left as it was).
        """
        # skip_init: built on meta and materialized empty, so the copy is the only write and
        # torch's random initialisation neither runs nor advances the RNG.
        # (dim=0: torch warns that initialising its empty weight on meta is a no-op.)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            linear = nn.utils.skip_init(nn.Linear, self.dim, 1, bias=self.bias is not None,
                                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight.reshape(1, self.dim))
            if self.bias is not None:
                linear.bias.copy_(self.bias.reshape(1))
        linear.weight.requires_grad_(self.weight.requires_grad)
        if self.bias is not None:
            linear.bias.requires_grad_(self.bias.requires_grad)
        return linear

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs: Any) -> "WeightedSum":
        """A WeightedSum computing ``linear(x)[..., 0]``, with copies of its parameters.

        ``linear`` must be an ``nn.Linear(dim, 1)``; ``kwargs`` (e.g. ``use_triton``) go
        to the new layer, which has the linear's device and dtype.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}")
        if linear.out_features != 1:
            raise ValueError(
                f"from_linear expects an nn.Linear with out_features=1, got out_features={linear.out_features}"
            )
        module = cls(
            linear.in_features,
            bias=linear.bias is not None,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
            **kwargs,
        )
        with torch.no_grad():
            module.weight.copy_(linear.weight.reshape(-1))
            if module.bias is not None:
                module.bias.copy_(linear.bias)
        return module
