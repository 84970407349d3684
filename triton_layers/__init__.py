"""triton_layers: transformer building blocks as nn.Modules running Triton kernels.

Set TRITON_INTERPRET=1 before importing to run the kernels on CPU tensors (slowly)
through the Triton interpreter; otherwise CPU tensors use the pure-torch reference.
"""
from . import functional, launch_config, layers
from .conversion import convert, register_norm
from .fp8 import FP8Activation, FP8Recipe, FP8Rows
from .functional import uses_kernels
from .layers import *  # noqa: F401,F403 (the modules: layers.__all__ is their one list)

__version__ = "0.1.0"
__all__ = [
    *layers.__all__,
    "FP8Recipe", "FP8Rows", "FP8Activation", "convert", "register_norm", "uses_kernels", "functional", "launch_config",
]
