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


# Softmax keeps rows of up to this many columns whole in registers (one read of the row;
# 32 fp32 values a thread at 32 warps); longer rows are streamed in LOOP_BLOCK chunks.
SOFTMAX_MAX_FUSED_COLS = 32768
# Short rows are packed into (rows x block) tiles of about this many elements, so that
# each program still moves enough bytes when rows are short (N = 1024 and below).
SOFTMAX_TILE_ELEMENTS = 4096
SOFTMAX_MAX_TILE_ROWS = 64


def softmax_tile(n_rows: int, n_cols: int) -> tuple[int, int, bool, int]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass, num_warps)`` for a row-wise softmax.

    ``BLOCK_M`` rows of ``BLOCK_N`` columns per program on the single-pass path; one row
    per program, walked in ``BLOCK_N`` chunks, on the looped path. About 16 elements a thread.
    """
    if n_cols > SOFTMAX_MAX_FUSED_COLS:
        block_n = min(LOOP_BLOCK, SOFTMAX_MAX_FUSED_COLS)
        return 1, block_n, False, max(1, min(32, block_n // 512))
    block_n = max(triton.next_power_of_2(n_cols), 16)
    rows = triton.next_power_of_2(max(n_rows, 1))
    block_m = max(1, min(SOFTMAX_TILE_ELEMENTS // block_n, SOFTMAX_MAX_TILE_ROWS, rows))
    return block_m, block_n, True, max(1, min(32, block_m * block_n // 512))
