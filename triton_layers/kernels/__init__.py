"""Private: the Triton kernels, one file per op (``<op>.py``: its kernels, plans, runs and the
op's description), its shape heuristics beside it (``_<op>_rules.py``), and the helpers the
kernels share (``_common``: host arithmetic and layouts; ``_norm_helpers``; ``_pdl``). The call
engine that runs them, eager and compiled, is :mod:`triton_layers.calls`; importing this package
gives its fast launch Triton's runtime (``_launcher``), so that only this package imports Triton.

Nothing here is public API; use :mod:`triton_layers.functional` or the layers.
``kernels.ops`` gathers the differentiable ops.
"""
from ._launcher import bind as _bind_fast_launch

_bind_fast_launch()  # (the eager door's fast launch reads Triton's runtime through it)
