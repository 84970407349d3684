"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm
from .router import CoordinateDescentRouter, RouterReturn

__all__ = ["TritonLayerNorm", "CoordinateDescentRouter", "RouterReturn"]
