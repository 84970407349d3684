"""Launch heuristics shared by every kernel file: block widths, warps, grid sizes.

Kept in one place so the kernels' launchers never pick numbers of their own, and so
tests can shrink the limits (e.g. ``MAX_FUSED_COLS``) to exercise the looped paths on
small rows. Nothing here queries CUDA at import time.
"""
from __future__ import annotations

import functools

import torch
import triton

# Rows up to this many columns are held in registers whole (one read of the row);
# longer rows are streamed in LOOP_BLOCK-wide chunks, re-read from L2 in a second pass.
MAX_FUSED_COLS = 8192
LOOP_BLOCK = 4096


def row_block(n_cols: int) -> tuple[int, bool]:
    """Return ``(BLOCK, single_pass)`` for rows of ``n_cols`` elements."""
    if n_cols <= MAX_FUSED_COLS:
        return max(triton.next_power_of_2(n_cols), 16), True
    return min(LOOP_BLOCK, MAX_FUSED_COLS), False


def num_warps(block: int) -> int:
    """Warps for a program working on ``block`` columns: about 8 elements per thread."""
    return max(1, min(16, block // 256))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a small stand-in on the CPU (interpreter)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _sm_count(index)
    return 4


def persistent_grid(n_rows: int, device: torch.device, programs_per_sm: int = 1) -> tuple[int, int]:
    """Grid size and rows per program for kernels that walk a contiguous range of rows.

    Used where each program accumulates per-column partial sums (weight gradients): the
    number of programs is fixed by the device, not by timing, so the reduction order and
    therefore the result are the same on every run.
    """
    programs = max(1, min(n_rows, num_sms(device) * programs_per_sm))
    rows_per_program = triton.cdiv(n_rows, programs)
    programs = triton.cdiv(n_rows, rows_per_program)
    return programs, rows_per_program


# Elementwise-after-reduction kernels (coor_descent backward) split each row into chunks
# of at most LOOP_BLOCK columns and at least SPLIT_MIN_BLOCK, aiming at this many
# programs per SM so that a few long rows still fill the GPU.
SPLIT_MIN_BLOCK = 256
SPLIT_PROGRAMS_PER_SM = 4


def split_row(n_rows: int, n_cols: int, device: torch.device) -> tuple[int, int]:
    """Return ``(BLOCK, chunks_per_row)`` for a grid of (rows, chunks) programs."""
    per_row = triton.cdiv(num_sms(device) * SPLIT_PROGRAMS_PER_SM, max(n_rows, 1))
    block = triton.next_power_of_2(triton.cdiv(n_cols, per_row))
    block = min(max(block, SPLIT_MIN_BLOCK), LOOP_BLOCK)
    return block, triton.cdiv(n_cols, block)
