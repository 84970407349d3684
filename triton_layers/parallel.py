"""Tensor-parallel styles for our layers (``torch.distributed.tensor.parallel``).

Our ops run on DTensors through their sharding rules (see docs/ARCHITECTURE.md, "Tensor and
sequence parallelism"), so torch's own styles work with our modules where they would with
torch's: ``SequenceParallel()`` on a ``TritonRMSNorm``/``TritonLayerNorm`` called as
``norm(x)``, ``ColwiseParallel``/``RowwiseParallel`` around attention whose scores go
through ``CausalSoftmax`` sharded by heads. What torch's style cannot do is the fused
residual: its ``SequenceParallel`` converts the first input alone (a positional
``residual`` is dropped, a keyword one stays a plain tensor) and expects one output.
:class:`SequenceParallel` here shards ``residual`` too and hands back ``(y, h)``.

Import it from this module (``from triton_layers.parallel import SequenceParallel``): it
imports torch.distributed, which ``import triton_layers`` does not need.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_module
from torch.distributed.tensor.parallel import SequenceParallel as _TorchSequenceParallel

__all__ = ["SequenceParallel"]


class SequenceParallel(_TorchSequenceParallel):
    """torch's ``SequenceParallel`` for a norm called with a fused residual,
    ``norm(x, residual)`` or ``norm(x, residual=residual)``: x and the residual are both taken
    as (or redistributed to) shards of the sequence dim, the parameters are replicated, and
    the norm returns ``(y, h)``, each sharded on the sequence dim (their local shards with
    ``use_local_output=True``). A call without a residual behaves as torch's style. A frozen
    parameter (``requires_grad=False``) stays frozen (torch's style makes it trainable).

    Example (a torchtitan-style decoder block whose norms take the residual stream)::

        from triton_layers.parallel import SequenceParallel
        parallelize_module(block, tp_mesh, {"attention_norm": SequenceParallel(),
                                            "ffn_norm": SequenceParallel()})
    """

    def _replicate_module_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        # As torch's (each rank's parameter taken as the replica), keeping a frozen weight frozen:
        # torch's style makes every parameter trainable again.
        for p_name, param in module.named_parameters():
            replicated = DTensor.from_local(param, device_mesh, [Replicate()], run_check=False)
            module.register_parameter(p_name, nn.Parameter(replicated, requires_grad=param.requires_grad))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module = distribute_module(module, device_mesh, self._replicate_module_fn)
        module.register_forward_pre_hook(partial(_shard_inputs, self.sequence_sharding, device_mesh),
                                         with_kwargs=True)
        module.register_forward_hook(partial(_outputs, self.use_local_output))
        return module


def _as_sequence_shard(t, sharding, mesh: DeviceMesh, module: nn.Module, name: str):
    if isinstance(t, DTensor):
        return t if t.placements == sharding else t.redistribute(placements=sharding)
    if isinstance(t, torch.Tensor):  # taken as this rank's shard already, as torch's style does
        return DTensor.from_local(t, mesh, sharding, run_check=False)
    raise ValueError(f"expecting the {name} of {type(module).__name__} to be a torch.Tensor or DTensor, got "
                     f"{type(t).__name__}")


def _shard_inputs(sharding, mesh: DeviceMesh, module: nn.Module, args: tuple, kwargs: dict):
    args = list(args)
    args[0] = _as_sequence_shard(args[0], sharding, mesh, module, "input")
    if len(args) > 1 and args[1] is not None:
        args[1] = _as_sequence_shard(args[1], sharding, mesh, module, "residual")
    if kwargs.get("residual") is not None:
        kwargs = {**kwargs, "residual": _as_sequence_shard(kwargs["residual"], sharding, mesh, module, "residual")}
    return tuple(args), kwargs


def _outputs(use_local_output: bool, module: nn.Module, args: tuple, output):
    if not use_local_output:
        return output
    if isinstance(output, tuple):
        return tuple(o.to_local() if isinstance(o, DTensor) else o for o in output)
    return output.to_local() if isinstance(output, DTensor) else output
