"""Private: Triton kernels, their launchers and both doors (eager, compiled), one file per op.

Nothing here is public API; use :mod:`triton_layers.functional` or the layers.
``kernels.ops`` gathers the differentiable ops.
"""
