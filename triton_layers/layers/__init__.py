"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm

__all__ = ["TritonLayerNorm"]
