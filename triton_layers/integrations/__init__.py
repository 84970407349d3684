"""Integrations of triton_layers with training frameworks, one module each.

Nothing here is imported by ``import triton_layers``: each module imports its framework
and registers what that framework's own extension mechanism needs when it is imported
itself, e.g. ``import triton_layers.integrations.torchtitan`` (torchtitan 0.3.0: an
``@override`` of its RMSNorm and a ``ModelConfigConverter``; docs/INTEGRATIONS.md,
"torchtitan"); ``triton_layers.integrations.torchao`` (torchao 0.18: our FP8 norms' output as
the input its ``Float8Linear`` takes as cast; docs/INTEGRATIONS.md, "torchao float8 training").
"""
