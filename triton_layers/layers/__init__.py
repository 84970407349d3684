"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm
from .rms_norm import TritonRMSNorm
from .router import CoordinateDescentRouter, RouterReturn
from .softmax import CausalSoftmax
from .weighted_sum import WeightedSum

__all__ = [
    "TritonLayerNorm", "TritonRMSNorm", "CausalSoftmax", "WeightedSum", "CoordinateDescentRouter", "RouterReturn",
]
