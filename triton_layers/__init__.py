"""triton_layers: transformer building blocks as nn.Modules running Triton kernels.

Set TRITON_INTERPRET=1 before importing to run the kernels on CPU tensors (slowly)
through the Triton interpreter; otherwise CPU tensors use the pure-torch reference.
"""
from . import functional, launch_config
from .conversion import convert, register_norm
from .fp8 import FP8Activation, FP8Recipe, FP8Rows
from .functional import uses_kernels
from .layers import CausalSoftmax, CoordinateDescentRouter, RouterReturn, TritonLayerNorm, TritonRMSNorm, WeightedSum

__version__ = "0.1.0"
__all__ = [
    "TritonLayerNorm", "TritonRMSNorm", "CausalSoftmax", "WeightedSum", "CoordinateDescentRouter", "RouterReturn",
    "FP8Recipe", "FP8Rows", "FP8Activation", "convert", "register_norm", "uses_kernels", "functional", "launch_config",
]
