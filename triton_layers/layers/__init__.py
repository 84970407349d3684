"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm
from .softmax import CausalSoftmax

__all__ = ["TritonLayerNorm", "CausalSoftmax"]
