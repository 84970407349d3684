"""What every op's launches share: host arithmetic (ceiling division, powers of 2), warps for a
block, and the views of tensors as matrices of rows (their row strides, their device index,
new outputs). Each op's own heuristics sit beside it (``_<op>_rules.py``); the knobs they
read are in :mod:`triton_layers.launch_config`.

The shape heuristics are pure functions of hashable arguments (ints, frozen configs, GPU
values), ``lru_cache``d where a plan calls them often. Nothing here queries CUDA.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from .. import launch_config
from ..calls.fast_launch import traced


LOG2E = math.log2(math.e)
"""log2(e): the kernels compute exp(x) as exp2(x * LOG2E)."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code (``triton.cdiv`` costs microseconds per call there)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of 2 >= n (>= 1), for host code."""
    return 1 << max(n - 1, 0).bit_length()


def warps_for(block: int, elems_per_thread: int, max_warps: int = 32) -> int:
    """Warps for a program holding ``block`` elements, about ``elems_per_thread`` a thread."""
    return max(1, min(max_warps, block // (32 * elems_per_thread)))


@functools.lru_cache(maxsize=4096)
def row_block(n_cols: int, max_fused_cols: int, loop_block: int) -> tuple[int, bool]:
    """Return ``(BLOCK, single_pass)`` for rows of ``n_cols`` elements: whole rows up to
    ``max_fused_cols``, else ``loop_block``-wide chunks."""
    if n_cols <= max_fused_cols:
        return max(next_power_of_2(n_cols), 16), True
    return min(loop_block, max_fused_cols), False


def matrix(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, its last dim), a view where possible. Launchers call it inside the
    autograd Function, where it is not recorded: functional hands them N-D tensors as they
    are, so that no view node joins the autograd graph (each costs host time on every
    call, forward and backward)."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1] if t.dim() else 1)


def rows_as_is(t: torch.Tensor) -> bool:
    """Whether a kernel can read ``t`` as (rows, its last dim) by its pointer and one row
    stride (:func:`row_stride`): contiguous, or 2-D with last stride 1."""
    return t.is_contiguous() or (t.dim() == 2 and t.stride(1) == 1)


def row_stride(t: torch.Tensor) -> int:
    """The row stride of :func:`rows_as_is` ``t`` seen as (rows, its last dim)."""
    return t.stride(0) if t.dim() == 2 else (t.shape[-1] if t.dim() else 1)


def head_layout(t: torch.Tensor) -> Optional[tuple[int, int, int]]:
    """``(token stride, heads, head stride)`` of a 3-D ``t`` of heads ``(tokens, heads, N)``
    with last stride 1 that is not rows with one stride (the q or k slice of a fused qkv
    projection): the norms' forward reads it in place (kernels/_norm_helpers.py ``head_rows``);
    None for anything else."""
    if t.dim() != 3 or t.stride(2) != 1 or t.is_contiguous():
        return None
    return t.stride(0), t.shape[1], t.stride(1)


def device_index(t: torch.Tensor) -> Optional[int]:
    """``t``'s CUDA device index; None off CUDA (the Triton interpreter's CPU tensors)."""
    return t.get_device() if t.is_cuda else None


def pdl(gpu: launch_config.GPU) -> dict:
    """A kernel's launch options for programmatic dependent launch on ``gpu``: its ``USE_PDL``
    constexpr (the kernel waits on its producer first, kernels/_pdl.py ``pdl_start``) and, where
    it is on (the config's ``pdl`` and the GPU's ``has_pdl``: ``launch_config.pdl_for``), Triton's
    ``launch_pdl`` (the launch attribute; ``KernelCall`` drops it for the compiled door, where
    Inductor launches)."""
    return {"USE_PDL": True, "launch_pdl": True} if launch_config.pdl_for(gpu) else {"USE_PDL": False}


def new_output(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``t``'s shape and device (and ``dtype``, default
    t's) for a launcher to write: ``torch.empty_like`` costs about a third of the host time of
    ``torch.empty(t.shape, ...)``, whose ``torch.Size`` argument dominates at small shapes."""
    return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)


def mask_bytes(mask: Optional[torch.Tensor], launcher) -> Optional[torch.Tensor]:
    """A bool mask as uint8 for the kernels, contiguous (the plans take its row stride to be
    its last dim): a free view on the eager door, a (small) copy where ``launch`` is
    :func:`~triton_layers.calls.fast_launch.traced`, whose Inductor cannot lower a bool -> uint8 view."""
    if mask is None:
        return None
    if not mask.is_contiguous():
        mask = mask.contiguous()
    return mask.to(torch.uint8) if traced(launcher) else mask.view(torch.uint8)
