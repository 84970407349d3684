"""Private: the call engine, no Triton kernel in it. How a call of an op reaches its kernels:

- ``eager``: each public op's router (:class:`~triton_layers.calls.eager.OpRouter`: checks,
  route, the eager plan cache), which every call of the op goes through, eager or traced;
- ``description``: an op described once (``OpDescription``);
- ``doors``: ``Op``, both doors of an op from its description, the eager autograd Functions;
- ``compiled``: the compiled door (a ``triton_op`` pair Inductor traces);
- ``fast_launch``: the eager launches of compiled Triton kernels (``KernelCall``, ``direct``),
  through the Triton runtime the kernels bind to it (kernels/_launcher.py);
- ``dtensor`` and ``sharding``: DTensor calls on local shards, and the sharding rules;
- ``tracing``: whether a call is being traced.

The kernels (:mod:`triton_layers.kernels`) import from here, never the other way.
"""
