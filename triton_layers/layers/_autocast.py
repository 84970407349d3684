"""What dtype a norm module writes under autocast: one attribute, ``output_under_autocast``.

- ``"autocast"`` (the modules' default, flash-attn's contract too): autocast's dtype, what
  the next matmul reads, written directly (no cast kernel). Exact before a matmul; where the
  norm's output is added into the residual stream (post-norm models) it moves the stream to
  autocast's dtype.
- ``"torch"``: what torch's ``nn.LayerNorm`` and ``nn.RMSNorm`` write under autocast: float32
  under CUDA autocast where it lists the op (``layer_norm``; ``rms_norm`` in torch 2.13 and,
  as the dispatcher is asked at import, any torch that registers it), else the dtype without
  autocast (the CPU's autocast leaves both alone, and autocast casts no float64 tensor).
- ``"unchanged"``: the dtype it has without autocast, as a Hugging Face RMSNorm writes (its
  own code casts; autocast changes none of its ops).

``convert`` sets the faithful value for each module it makes, unless asked for autocast's.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

MODES = ("autocast", "torch", "unchanged")

# Whether CUDA autocast runs torch's op in float32 (it registers a kernel for the op: the norms
# are on its float32 list when they are on any).
_FP32_UNDER_CUDA_AUTOCAST = {
    rms: torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{'rms_norm' if rms else 'layer_norm'}", "AutocastCUDA")
    for rms in (False, True)}


def autocast_dtype(mode: str, x: Tensor, rms: bool) -> tuple[Optional[torch.dtype], bool]:
    """``(out_dtype, autocast)`` for ``functional._norm``: what ``mode`` makes of ``x``'s call
    of a LayerNorm (an RMSNorm: ``rms``)."""
    if mode == "autocast":
        return None, True
    if mode == "torch":
        cuda_fp32 = (x.is_cuda and _FP32_UNDER_CUDA_AUTOCAST[rms] and x.dtype is not torch.float64
                     and torch.is_autocast_enabled("cuda"))
        return (torch.float32 if cuda_fp32 else None), False
    if mode == "unchanged":
        return None, False
    raise ValueError(f"output_under_autocast must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
