"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm
from .router import CoordinateDescentRouter, RouterReturn
from .softmax import CausalSoftmax
from .weighted_sum import WeightedSum

__all__ = ["TritonLayerNorm", "CausalSoftmax", "WeightedSum", "CoordinateDescentRouter", "RouterReturn"]
