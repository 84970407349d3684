"""The nn.Modules. They own their parameters and call :mod:`triton_layers.functional`."""
from .layer_norm import TritonLayerNorm
from .weighted_sum import WeightedSum

__all__ = ["TritonLayerNorm", "WeightedSum"]
