"""CausalSoftmax: attention-score softmax with a fused scale, causal and key padding masks."""
from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from .. import functional as F
from ._config import check_flag, check_number, check_use_triton


class CausalSoftmax(nn.Module):
    """Softmax of ``scale * scores`` over the last dim, with a causal mask by default.

    ``scores`` are (..., Nq, Nk). With ``causal=True`` query i (0-based) sees keys
    j <= i + (Nk - Nq): the mask is aligned to the bottom-right corner (flash-attn >= 2.1,
    ``torch.nn.attention.bias.causal_lower_right``), so square scores give the usual lower
    triangle and a single decoding query sees every key. ``forward``'s optional
    ``key_padding_mask`` marks padding keys with True (not a Hugging Face
    ``attention_mask``, where 1 marks the tokens to attend to). A row with no visible key
    gives zeros and a zero gradient, never NaN. The layer has no parameters.

    Args:
        causal: apply the bottom-right aligned causal mask.
        scale: multiplies the scores before the softmax, fused in the kernel (default 1;
            pass ``head_dim ** -0.5`` for attention on unscaled ``q @ k^T``).
        use_triton: ``None`` auto, ``True``/``False`` force the kernels / the reference.
    """

    def __init__(self, causal: bool = True, scale: Optional[float] = None, use_triton: Optional[bool] = None) -> None:
        super().__init__()
        self.causal = check_flag(causal, "causal")
        self.scale = check_number(scale, "scale", allow_none=True)
        self.use_triton = check_use_triton(use_triton)

    def forward(self, scores: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """Probabilities over the last dim, same shape and dtype as ``scores``.

        ``key_padding_mask``: optional bool (B, Nk), True = padding key (ignored), as in
        ``nn.MultiheadAttention``, for ``scores`` of shape (B, Nq, Nk) or (B, H, Nq, Nk).
        That is the opposite of a Hugging Face ``attention_mask`` (1 = attend, 0 =
        padding): pass ``key_padding_mask=attention_mask == 0``. An extended mask
        (B, 1, 1, Nk) is refused with its conversion in the error (bool, True = attend:
        ``~mask[:, 0, 0, :]``; additive float: ``mask[:, 0, 0, :] < 0``).
        """
        return F.softmax(scores, self.causal, self.scale, key_padding_mask, self.use_triton)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, scale={self.scale}"
