"""Input checks and path choice shared by the functional ops.

Every check raises ``TypeError`` (wrong kind or dtype) or ``ValueError`` (wrong shape,
device, value) naming what was given; none uses ``assert`` (it vanishes under -O). The
value checkers (``check_int``, ``check_number``, ``check_flag``, ``check_use_triton``) are
``_values``'s, which states their rule: they serve the functional ops, the modules and the
references alike, so the same value gets the same error through any of them.
"""
from __future__ import annotations

import sys

from typing import Optional, Sequence

import torch
from torch import Tensor

from .calls.tracing import tracing
# (the value checkers: use_kernels's, and re-exported for the functional ops' checks)
from ._values import check_flag, check_int, check_int_sequence, check_number, check_use_triton  # noqa: F401
from .calls.eager import (  # (no Triton there: importable without it)
    PLAIN_TENSORS, functorch_active, is_async_collective, is_dtensor, subclass_of,
)
from .launch_config import TRITON_INTERPRET

# What the kernels read and write. float64 is accepted too (INPUT_DTYPES), as torch's layers
# accept it, and always takes the reference, which computes in float64 (use_kernels).
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INPUT_DTYPES = FLOAT_DTYPES + (torch.float64,)

# The kernel ops, or None where Triton is not installed (it has no wheels for macOS or
# Windows): import triton_layers and the reference path work without it.
KERNELS = None
KERNELS_MISSING: Optional[str] = None
try:
    from .kernels import ops as KERNELS
except ModuleNotFoundError as _err:  # only a missing triton; any other error is a bug to show
    if _err.name != "triton" and not (_err.name or "").startswith("triton."):
        raise
    KERNELS_MISSING = f"needs triton, which is not installed ({_err})"


def interpreter_problem(triton_version: str, numpy_version: str) -> Optional[str]:
    """Why the Triton interpreter of ``triton_version`` cannot run our kernels beside NumPy
    ``numpy_version``, or None. Triton before 3.7 turns its scalars into Python ints with
    ``int(array)``, which NumPy 2.4 refuses for 1-element arrays: every loop over a range
    then fails inside the interpreter (triton-lang/triton#9171, fixed in Triton 3.7)."""
    def major_minor(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())

    if major_minor(triton_version) < (3, 7) and major_minor(numpy_version) >= (2, 4):
        return (f"the Triton interpreter (TRITON_INTERPRET=1) of Triton {triton_version} cannot run beside "
                f"NumPy {numpy_version} (triton-lang/triton#9171): install numpy<2.4, or Triton >= 3.7")
    return None


# Set where TRITON_INTERPRET=1 meets an interpreter that cannot run: CPU tensors then raise
# it at their first kernel call, rather than the interpreter's TypeError from deep inside.
INTERPRETER_PROBLEM: Optional[str] = None
if TRITON_INTERPRET and KERNELS is not None:
    import numpy

    # (the kernels imported Triton: its version read from there, so that kernels/ stays the one
    # importer of Triton)
    INTERPRETER_PROBLEM = interpreter_problem(sys.modules["triton"].__version__, numpy.__version__)


def check_tensor(t: object, name: str, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES) -> Tensor:
    """``t`` must be a dense tensor of one of ``dtypes``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout is not torch.strided:  # (sparse, nested: no strides for the kernels or the reference)
        raise TypeError(f"{name} must be a dense tensor (layout torch.strided), got layout {t.layout}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {names}")
    return t


def check_same_device(names: tuple[str, ...], *tensors: Optional[Tensor]) -> None:
    """All given (non-None) ``tensors``, called ``names`` in that order, must be on one device;
    the first is a tensor (the op's main input).

    (On every op: names as a constant tuple, not keyword arguments, and CUDA devices compared
    by index, so the common case builds no dict and no ``torch.device``.)"""
    first = tensors[0]
    if first.is_cuda:
        index = first.get_device()
        for t in tensors:
            if t is not None and (not t.is_cuda or t.get_device() != index):
                break
        else:
            return
    else:
        device = first.device
        if all(t is None or t.device == device for t in tensors):
            return
    where = ", ".join(f"{name} on {t.device}" for name, t in zip(names, tensors) if t is not None)
    raise ValueError(f"all tensors must be on one device; got {where}")


def check_shape(t: Optional[Tensor], name: str, shape: Sequence[int]) -> None:
    """``t`` (when given) must have exactly ``shape``."""
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def float64_among(names: Sequence[str], *items: object) -> Optional[str]:
    """The name (from ``names``, in order) of the first of ``items`` (tensors, dtypes, None) that
    is or has float64, or None: what :func:`use_kernels` takes as ``float64``."""
    for name, item in zip(names, items):
        if item is torch.float64 or getattr(item, "dtype", None) is torch.float64:
            return name
    return None


def use_kernels(x: Tensor, use_triton: Optional[bool], others: Sequence[Optional[Tensor]] = (),
                dtensors: bool = False, float64: Optional[str] = None) -> bool:
    """Pick the path for ``x`` (and the op's ``others`` tensors): the Triton kernels or the
    pure-torch reference.

    ``None`` (auto): kernels for CUDA tensors, and for CPU tensors when TRITON_INTERPRET=1
    was set before triton_layers was imported; the reference otherwise, always under a
    torch.func transform (vmap, grad, ...), and for tensor subclasses (FakeTensor outside
    torch.compile, wrappers: their data is not one plain buffer a kernel can read; torch's
    ops on them are what the subclass defines). DTensors take the kernels (through the
    custom op, whose sharding rule runs it on the local shards: ``calls/sharding``) where
    the op has a rule (``dtensors``), else the reference. ``True`` forces the kernels and
    raises where they cannot run; ``False`` forces the reference.

    float64 takes the reference (in float64): the kernels compute in fp32 and write fp32, fp16
    or bf16. ``x`` is checked here; ``float64`` names another argument of the call that is
    float64 (a parameter, a residual, an output dtype: :func:`float64_among`), or is None.
    """
    check_use_triton(use_triton)  # (as the modules' constructors: "yes" is no flag)
    if float64 is None and x.dtype is torch.float64:
        float64 = "x"
    kind = None if tracing() else subclass_of((x, *others))
    if kind is not None and ((dtensors and is_dtensor(kind)) or is_async_collective(kind)):
        # (a DTensor: the custom op's door; a collective in flight: the doors wait for it
        # before launching, calls/eager.ready. The device decides, below.)
        kind = None
    if kind is not None:
        can_run = False
        why = (f"cannot launch a kernel on a {kind.__name__} (a tensor subclass); use_triton=None takes the "
               f"reference (torch's ops) there")
    elif functorch_active():
        # Our eager door is an autograd.Function with neither setup_context nor a vmap rule,
        # which torch.func's transforms refuse: under them the reference (torch ops) runs.
        can_run = False
        why = "cannot run under torch.func transforms (vmap, grad, jacrev, ...); use_triton=None takes the reference there"
    elif float64 is not None:
        can_run = False
        why = (f"cannot compute in torch.float64 ({float64} has dtype torch.float64): the kernels compute in fp32 "
               f"and write fp32, fp16 or bf16; use_triton=None takes the reference there, which computes in float64")
    elif x.is_cuda:
        if use_triton is None and KERNELS is not None:
            return True  # the common case, first
        can_run, why = KERNELS is not None, KERNELS_MISSING
    elif x.device.type == "cpu" and TRITON_INTERPRET and KERNELS is not None:
        if INTERPRETER_PROBLEM is not None and use_triton is not False and not tracing():
            raise RuntimeError(f"triton_layers: {INTERPRETER_PROBLEM}; or use_triton=False for the reference")
        # The interpreter runs kernels on real data only: under torch.compile or export the
        # tensors are fakes, so traced CPU calls take the reference (same math).
        can_run = not tracing()
        why = ("cannot run the Triton interpreter (TRITON_INTERPRET=1) under torch.compile or torch.export; "
               "use_triton=None takes the reference there")
    else:
        can_run = False
        why = KERNELS_MISSING or (
            f"needs a CUDA tensor (or a CPU tensor with TRITON_INTERPRET=1 set before "
            f"importing triton_layers); got a tensor on {x.device}")
    if use_triton is None:
        return can_run
    if use_triton and not can_run:
        raise ValueError(f"use_triton=True {why}")
    return bool(use_triton)


def kernel_rows(x: Tensor, n_cols: int) -> Tensor:
    """``x`` for the kernels: as it is when it is contiguous rows of its last dim (the
    launchers view it as (rows, n_cols) inside the autograd Function, where no view node
    joins the graph: each costs host time, forward and backward), else :func:`as_rows`."""
    if x.dim() and x.shape[-1] == n_cols and (x.is_contiguous() or (
            type(x) not in PLAIN_TENSORS and is_dtensor(type(x)))):
        # (a DTensor whole, in any layout: the doors make its local tensor readable; a reshape
        # would be DTensor's, which cannot flatten a sharded dim of a strided shard)
        return x
    return as_rows(x, n_cols)


def kernel_heads(x: Tensor, n_cols: int) -> Tensor:
    """``x`` for the norms' forward without a residual: :func:`kernel_rows`, except that heads
    ``(..., heads, n_cols)`` that are not rows with one stride (the q or k slice of a fused
    qkv projection, QK-norm's input) stay a view ``(tokens, heads, n_cols)``, read in place
    (kernels/_common.py ``head_layout``) instead of copied."""
    if x.dim() >= 3 and x.shape[-1] == n_cols and n_cols > 1 and x.stride(-1) == 1 and not x.is_contiguous() \
            and type(x) in PLAIN_TENSORS:
        try:
            return x if x.dim() == 3 else x.view(-1, *x.shape[-2:])
        except RuntimeError:  # (the leading dims do not merge into one stride)
            pass
    return kernel_rows(x, n_cols)


def as_rows(x: Tensor, n_cols: int) -> Tensor:
    """View ``x`` as (rows, n_cols) with last stride 1, copying only when that is impossible.

    A slice of a fused projection (last stride 1, row stride > n_cols) stays a view.
    """
    x2 = x if x.dim() == 2 and x.shape[1] == n_cols else x.reshape(-1, n_cols)
    if n_cols > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2
