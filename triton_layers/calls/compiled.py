"""The compiled door of every op: a ``torch.library.triton_op`` pair (forward, backward) tied by
``register_autograd``, whose kernels are launched through ``wrap_triton`` so that Inductor can
trace them (or, where nothing traces, directly: :func:`traced_launcher`). Made from the op's
description (``calls/description.py``) by :func:`compiled_door`, for ``calls/doors.py``'s
:class:`~.doors.Op`, which also holds the eager door.

Why two doors: calling the custom op eagerly costs far more host time per forward + backward
than the eager ``autograd.Function`` (an H200, torch 2.11: docs/journal's H200 notes, "What the
H200 parts are"): the custom op's dispatch and its registered autograd."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch.library import triton_op, wrap_triton

from . import eager as _eager
from .description import _signature, _tensor_tuple
from .fast_launch import direct

__all__ = ["compiled_door", "traced_launcher"]


def compiled_door(op) -> tuple:
    """``(forward_op, backward_op)``: the op's ``triton_op`` pair (``triton_layers::<name>_fwd``
    and ``_bwd``) tied by ``register_autograd``, whose bodies run the description's plans and
    runs with the launch :func:`traced_launcher` picks. ``op``: the :class:`~.doors.Op` it is for
    (its description and its shared steps: readable inputs, the door's forward and backward,
    what autograd saves)."""
    d = op.desc
    n_out = op._n_out

    def forward_body(*args):
        # (the tensors as the plans read them: a DTensor's local shard, say, may come in
        # any layout; traced calls from functional are already so, and pass through)
        args = op._readable(args, op._input_strided)
        return _one_or_tuple(op._door_forward(traced_launcher(args), args))

    forward_body.__signature__ = _signature(d.inputs, _tensor_tuple(len(op._result_names)))
    forward_op = triton_op(f"triton_layers::{d.name}_fwd", mutates_args=())(forward_body)

    grad_params = tuple((f"grad_{name}", Optional[Tensor]) for name in d.outputs)
    backward_params = grad_params + d.saved + (("needs", list[bool]),)

    def backward_body(*args):
        grads = args[:n_out]
        first_value = n_out + op._n_saved_tensors
        saved = (*op._as_saved(args[n_out:first_value]), *args[first_value:-1])
        needs = dict(zip(d.differentiable, args[-1]))
        out = op._door_backward(traced_launcher(args), grads, needs, saved)
        # A custom op returns tensors only: an empty one stands for "no gradient", and
        # for the second of a shared pair (backward() below hands it the first's).
        shared = {a for a, b in d.shared_grads if needs[a] and needs[b] and out[a] is out[b]}
        return _one_or_tuple(_unaliased(
            out[n] if needs[n] and n not in shared else _empty(grads) for n in d.differentiable))

    backward_body.__signature__ = _signature(backward_params, _tensor_tuple(len(d.differentiable)))
    backward_op = triton_op(f"triton_layers::{d.name}_bwd", mutates_args=())(backward_body)

    def setup_context(ctx, inputs, output):
        op._stash(ctx, inputs, (output,) if isinstance(output, Tensor) else tuple(output))

    def backward(ctx, *grads):
        saved = op._saved(ctx)
        if torch.is_grad_enabled() and _builds_graph(grads, saved[:op._n_saved_tensors]):
            return op._grads_in_order(op.backward_graph(grads[:n_out], ctx.needs, saved), ctx.needs, ctx.dtypes)
        return op._custom_op_backward(grads[:n_out], ctx.needs, ctx.dtypes, saved)

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op, backward_op


def traced_launcher(args: tuple) -> Callable:
    """How the compiled door's bodies launch.

    - Real plain tensors and nothing tracing (no dispatch mode: a DTensor's local shards, a call
      of the custom op outside torch.compile): the eager door's own launcher, ``direct`` (the
      kernel's compiled launcher on a GPU, the interpreter on the CPU). ``wrap_triton`` would
      launch there too, but through Triton's per-call binding and a higher-order op: tens of
      microseconds a kernel, paid on every norm of a tensor-parallel model.
    - Tensors without data off a GPU (meta tensors, CPU fakes: DTensor's sharding propagation,
      FakeTensorMode): a launch that does nothing, since the Triton interpreter (the only way
      our kernels run on a CPU) would read their data.
    - Anything else (CUDA fakes under torch.compile, functional tensors, a dispatch mode that
      records: make_fx, CommDebugMode): ``wrap_triton``, which traces the kernel (and on a
      GPU launches nothing for fakes)."""
    plain = True
    for a in args:
        if isinstance(a, Tensor):
            if not a.is_cuda and (a.is_meta or isinstance(a, _FakeTensor)):
                return _no_launch
            plain = plain and type(a) in _eager.PLAIN_TENSORS
    if plain and not _dispatch_modes():
        return direct
    return wrap_triton


_dispatch_modes = torch._C._len_torch_dispatch_stack


def _no_launch(kernel):
    return _NoGrid()


class _NoGrid:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _one_or_tuple(tensors):
    """A custom op whose schema returns one Tensor must return it bare."""
    tensors = tuple(tensors)
    return tensors[0] if len(tensors) == 1 else tensors


def _unaliased(tensors) -> tuple:
    """The tensors, each that shares memory with an earlier one cloned: a custom op's outputs
    may not alias each other (the launchers may return views of one reduction, e.g.
    LayerNorm's weight and bias gradients; the eager door keeps those views). Real tensors are
    told apart by their storage's address (a view made where autograd does not record it, as
    under DTensor's local dispatch, has no ``_base``), fakes by their ``_base``."""
    out, seen = [], set()
    for t in tensors:
        if t.numel() and not t.is_meta and not isinstance(t, _FakeTensor) and type(t) in _eager.PLAIN_TENSORS:
            key = t.untyped_storage().data_ptr()
        else:
            key = id(t._base if t._base is not None else t)
        out.append(t.clone() if key in seen else t)
        seen.add(key)
    return tuple(out)


def _empty(grads) -> Tensor:
    ref = next(g for g in grads if g is not None)
    return ref.new_empty(0)


def _builds_graph(grads: tuple, saved_tensors: tuple) -> bool:
    """Whether a backward running in grad mode (``create_graph=True``) must record its own graph:
    a gradient or a saved tensor requires a gradient. (Asked only in grad mode.)"""
    return any(t is not None and t.requires_grad for t in (*grads, *saved_tensors))
