"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm
from .router import CoordinateDescentRouter, RouterReturn
from .weighted_sum import WeightedSum

__all__ = ["TritonLayerNorm", "WeightedSum", "CoordinateDescentRouter", "RouterReturn"]
