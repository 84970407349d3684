"""Private: the Triton kernels, a file per op (``<op>.py``: kernels, plans, runs and the op's
description; ``_<op>_launch.py``: its shape heuristics), and the call engine both doors share
(``_eager``, ``_doors``, ``_fast_launch``, ``_dtensor_eager``, ``_sharding``).

Nothing here is public API; use :mod:`triton_layers.functional` or the layers.
``kernels.ops`` gathers the differentiable ops.
"""
