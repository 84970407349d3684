"""torchao's float8 training fed by our FP8 norms: the norm quantizes, torchao's ``Float8Linear``
uses that input as it is instead of casting the activation again.

torchao (0.18) takes an input that is already a ``Float8TrainingTensor`` as cast, for its
forward GEMM and for the weight-gradient GEMM alike (it keeps that one tensor for both). A
per-tensor scale is valid for both; a per-token scale lies along the weight-gradient GEMM's
contraction dim, where torch's scaled matmul refuses it, so only the ``"per_tensor"`` recipe
(static or dynamic) is offered here. (Our ``FP8Activation`` itself also runs through a
``Float8Linear``, which then dequantizes and casts it again: correct, and no fusion.)

Conventions: torchao's ``_scale`` multiplies to quantize (``fp8_max / amax``), ours divides
(``amax / fp8_max``): the tensor gets our scale's reciprocal. Gradients reach the norm in the
linear's dtype, straight through the quantization as for ``FP8Rows.activation``.

    from torchao.float8 import convert_to_float8_training
    from triton_layers.integrations.torchao import float8_training_input
    convert_to_float8_training(model)                     # model.proj is a Float8Linear now
    rows = F.rms_norm_fp8(x, norm.weight, recipe=FP8Recipe("per_tensor"))
    y = model.proj(float8_training_input(rows, model.proj))
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torchao.float8.float8_training_tensor import Float8TrainingTensor, GemmInputRole

from ..fp8 import FP8Rows

__all__ = ["float8_training_input"]


class _AsTorchaoInput(torch.autograd.Function):
    """The activation as torchao's input tensor; its gradient passes straight to the activation's."""

    @staticmethod
    def forward(ctx, activation, data, inverse_scale, linear_mm_config):
        return Float8TrainingTensor(data, inverse_scale, activation.dtype, linear_mm_config, GemmInputRole.INPUT)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


def float8_training_input(rows: FP8Rows, linear: torch.nn.Module, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``rows`` (a per-tensor recipe's :class:`~triton_layers.FP8Rows`) as the input of torchao's
    ``Float8Linear`` ``linear``: a ``Float8TrainingTensor`` made with the linear's own GEMM
    config, which the linear uses without casting again. Differentiable where ``rows`` carries
    an activation; ``dtype`` (without one): the nominal dtype, default the linear's weight's."""
    if not isinstance(rows, FP8Rows):
        raise TypeError(f"rows must be an FP8Rows (from rms_norm_fp8 or layer_norm_fp8); got {type(rows).__name__}")
    if rows.scale.dim() != 0:
        raise ValueError(f"torchao reuses its input for the weight-gradient GEMM, where only a per-tensor scale "
                         f"is valid: use FP8Recipe('per_tensor'); got scales of shape {tuple(rows.scale.shape)}")
    config = getattr(linear, "linear_mm_config", None)
    if config is None:
        raise TypeError(f"linear must be a torchao Float8Linear (convert_to_float8_training); got "
                        f"{type(linear).__name__}")
    inverse = rows.scale.reciprocal()
    if rows.activation is None:
        return Float8TrainingTensor(rows.data, inverse, dtype or linear.weight.dtype, config, GemmInputRole.INPUT)
    return _AsTorchaoInput.apply(rows.activation, rows.data, inverse, config)
