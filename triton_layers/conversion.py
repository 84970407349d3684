"""Swap torch layers in an existing model for their triton_layers equivalents."""
from __future__ import annotations

from typing import Any

from torch import nn

from .layers import TritonLayerNorm


def convert(model: nn.Module, **layer_kwargs: Any) -> nn.Module:
    """Replace every ``nn.LayerNorm`` inside ``model`` (in place) by a TritonLayerNorm.

    Parameters are copied, so outputs match before and after; ``layer_kwargs`` (e.g.
    ``use_triton``) go to each new layer. A bare ``nn.LayerNorm`` passed as ``model`` is
    returned converted. Returns the model.
    """
    if isinstance(model, nn.LayerNorm):
        return TritonLayerNorm.from_torch(model, **layer_kwargs)
    for name, child in model.named_children():
        if isinstance(child, nn.LayerNorm):
            setattr(model, name, TritonLayerNorm.from_torch(child, **layer_kwargs))
        else:
            convert(child, **layer_kwargs)
    return model
