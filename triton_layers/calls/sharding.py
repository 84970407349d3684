"""Sharding rules of the custom ops, for DTensors (tensor and sequence parallelism).

A DTensor reaching an op takes the compiled door's custom op (``triton_layers::<op>_fwd``
and ``_bwd``, tied by their registered autograd); DTensor's dispatch looks up the rule
registered here (``torch.distributed.tensor.experimental.register_sharding``), moves the
inputs to one of the placements it accepts, runs the op on each rank's local tensors and
wraps the results. Every rule is made from the op's description (:func:`rule_for`):

- the op works row by row: the tensors the description names in ``row_sharded``
  (``{name: (offset, trailing)}``) hold the rows in their dims ``offset`` to ``ndim -
  trailing`` (x of (B, S, D): ``(0, 1)``; statistics kept as ``(k, B, S)``: ``(1, 0)``; a
  key padding mask (B, Nk) of scores (B, H, Nq, Nk): ``(0, 1)``, the batch dim alone), and
  all shard along the same row dim (a tensor without that dim is replicated); each other
  tensor (the weight, the bias) is replicated;
- in the backward, the gradient of a row-sharded input is sharded as the input, that of a
  replicated one (a parameter's) is ``Partial`` (each rank's rows' sum: DTensor or FSDP2 sum
  them; nothing is reduced by hand); a gradient not asked for is an empty placeholder,
  replicated;
- an output that holds no rows (coor_descent's eps schedule) is the same on every rank,
  replicated;
- every tensor replicated is always a choice too (DTensor then runs the op whole on every
  rank: the fallback for placements no rule names, such as a shard of the normalized dim).

So the computation runs on the local shard, with no gather of activations, and a shard of
any size (a sequence not divisible by the mesh) is exact: every rank's rows are whole.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["forward_rule", "register_rules", "rule_for"]


def _is_tensor(kind) -> bool:
    return kind in (Tensor, Optional[Tensor])


def _placements():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Shard, Replicate, Partial


def rule_for(desc, backward: bool):
    """The sharding rule of the op's forward (or backward) custom op: a function of the op's
    arguments (tensors as DTensor specs) giving its acceptable ``(outputs, inputs)`` placements."""
    rows = dict(desc.row_sharded)
    if backward:
        grads = tuple(f"grad_{name}" for name in desc.outputs)
        rows.update({g: rows[name] for g, name in zip(grads, desc.outputs)})
        inputs = tuple((g, Optional[Tensor]) for g in grads) + desc.saved + (("needs", list),)
    else:
        inputs = desc.inputs
    names = [n for n, _ in inputs]
    outs = desc.differentiable if backward else desc.outputs + desc.residuals

    def row_dims(name: str, spec) -> int:
        offset, trailing = rows[name]
        return spec.ndim - trailing - offset

    def shard(name: str, spec, d: Optional[int]):
        """The placement of a row-sharded tensor along the row dim ``d`` (None: replicated)."""
        Shard, Replicate, _ = _placements()
        return Replicate() if d is None or d >= row_dims(name, spec) else Shard(d + rows[name][0])

    def rule(*args):
        Shard, Replicate, Partial = _placements()
        values = dict(zip(names, args))
        n_rows = max(row_dims(n, v) for n, v in values.items() if n in rows and v is not None)
        skip = desc.unshardable_rows(values, n_rows) if desc.unshardable_rows else ()
        if backward:
            needs = dict(zip(desc.differentiable, values["needs"]))
            shared = {a for a, b in desc.shared_grads if needs[a] and needs[b]
                      and (desc.shared_when is None or desc.shared_when(values))}

        def outputs(d: Optional[int]) -> list:
            out = []
            for n in outs:
                if backward and (not needs[n] or n in shared):
                    out.append(Replicate())  # an empty placeholder
                elif n in rows:  # (an output holds all the main input's row dims, from its offset)
                    out.append(Replicate() if d is None else Shard(d + rows[n][0]))
                elif backward:  # a replicated input's gradient: each rank's rows' part of the sum
                    out.append(Replicate() if d is None else Partial())
                else:  # an output that is no rows' (coor_descent's eps schedule): the same on every rank
                    out.append(Replicate())
            return out

        def inputs_at(d: Optional[int]) -> list:
            return [None if not _is_tensor(kind) or v is None else shard(n, v, d) if n in rows else Replicate()
                    for (n, kind), v in zip(inputs, args)]

        return [(outputs(None), inputs_at(None))] + [
            (outputs(d), inputs_at(d)) for d in range(n_rows) if d not in skip]

    return rule


_FORWARD_RULES: dict = {}


def forward_rule(desc):
    """The rule of ``desc``'s forward custom op, made once: the one registered with DTensor and
    the one the DTensor door (``calls/dtensor``) asks."""
    rule = _FORWARD_RULES.get(desc.name)
    if rule is None:
        rule = _FORWARD_RULES[desc.name] = rule_for(desc, backward=False)
    return rule


_REGISTERED: set = set()


def register_rules(op) -> None:
    """Register the rules of ``op``'s two custom ops (once; where torch.distributed has DTensor)."""
    if op.desc.row_sharded is None or op.desc.name in _REGISTERED:
        return
    try:
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:  # torch built without distributed
        return
    namespace = torch.ops.triton_layers
    register_sharding(getattr(namespace, f"{op.desc.name}_fwd").default)(forward_rule(op.desc))
    register_sharding(getattr(namespace, f"{op.desc.name}_bwd").default)(rule_for(op.desc, backward=True))
    _REGISTERED.add(op.desc.name)
