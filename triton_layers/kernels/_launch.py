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


# Elements a program holds per tile when rows are short: BLOCK_M rows of BLOCK_N columns.
TILE_ELEMENTS = 2048
# Persistent kernels (weight-gradient partials) launch this many programs per SM.
PROGRAMS_PER_SM = 2


# Long-row LayerNorm backward: rows per tile of the column-split kernel, and programs per SM.
SPLIT_BLOCK_M = 2
SPLIT_PROGRAMS_PER_SM = 2


def row_groups(n_rows: int, n_chunks: int, block_m: int, device: torch.device) -> int:
    """Row groups for a (column chunk x row group) grid: about SPLIT_PROGRAMS_PER_SM programs
    per SM, each group at least one tile high. Depends only on the shape and the device."""
    wanted = max(1, num_sms(device) * SPLIT_PROGRAMS_PER_SM // n_chunks)
    return max(1, min(wanted, triton.cdiv(n_rows, block_m)))


def row_tile(n_rows: int, n_cols: int) -> tuple[int, int, bool]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass)``: rows per program tile and columns per block."""
    block_n, single_pass = row_block(n_cols)
    block_m = max(1, min(TILE_ELEMENTS // block_n, triton.next_power_of_2(max(n_rows, 1)), 64))
    return block_m, block_n, single_pass


# Elements each warp holds in a tile (8 per thread).
ELEMENTS_PER_WARP = 512


def num_warps(block: int) -> int:
    """Warps for a program holding ``block`` elements at a time."""
    return max(1, min(16, block // ELEMENTS_PER_WARP))


def direct(kernel):
    """Launch a kernel as is (eager). The custom ops pass ``torch.library.wrap_triton`` instead."""
    return kernel


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
