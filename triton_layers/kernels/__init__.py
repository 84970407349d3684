"""Private: Triton kernels, their launchers and autograd glue, one file per op.

Nothing here is public API; use :mod:`triton_layers.functional` or the layers.
"""
