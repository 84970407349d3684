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


# Kernels that stream a (rows x columns) matrix in 2-D tiles (weighted sum): bytes of
# the input per tile (a tile is BLOCK_M rows x BLOCK_D columns), the widest column
# block while a tile holds several rows, and how many programs to aim for per SM.
TILE_BYTES = 32768
TILE_MAX_COLS = 2048
FWD_PROGRAMS_PER_SM = 8
BWD_PROGRAMS_PER_SM = 4


def tile_2d(n_rows: int, n_cols: int, elem_size: int) -> tuple[int, int, int]:
    """Return ``(BLOCK_M, BLOCK_D, num_warps)`` for tiles of a (n_rows x n_cols) matrix.

    A tile moves about TILE_BYTES of the input: short rows are stacked several to a tile,
    and with few rows the column block widens instead, so no lanes idle on masked rows.
    """
    elems = max(16, TILE_BYTES // elem_size)
    cols = max(triton.next_power_of_2(n_cols), 16)
    block_d = min(cols, TILE_MAX_COLS, elems)
    block_m = max(1, min(triton.next_power_of_2(n_rows), elems // block_d))
    block_d = min(cols, max(block_d, elems // block_m))
    return block_m, block_d, max(1, min(16, block_m * block_d // 1024))


def split_range(n: int, block: int, parts: int) -> tuple[int, int]:
    """Cut ``n`` into at most ``parts`` contiguous ranges, each a multiple of ``block``.

    Returns ``(range_length, n_ranges)``; the last range may be shorter.
    """
    blocks = triton.cdiv(n, block)
    length = triton.cdiv(blocks, max(1, min(parts, blocks))) * block
    return length, triton.cdiv(n, length)
