"""Launch heuristics shared by every kernel file: block widths, warps, grid sizes.

Kept in one place so the kernels' launchers never pick numbers of their own, and so
tests can shrink the limits (e.g. ``MAX_FUSED_COLS``) to exercise the looped paths on
small rows. Nothing here queries CUDA at import time.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

# Rows up to this many columns are held in registers whole (one read of the row);
# longer rows are streamed in LOOP_BLOCK-wide chunks, re-read from L2 in a second pass.
MAX_FUSED_COLS = 8192
LOOP_BLOCK = 4096
# The LayerNorm forward holds one value per element (x, then y), so it keeps rows of up to
# this many columns whole (32 fp32 values a thread at 32 warps) and reads x once; streaming
# them in chunks reads x twice, and the second read misses L2 when many long rows are in
# flight. Kernels holding several values per element (backwards) keep MAX_FUSED_COLS.
LN_FWD_MAX_FUSED_COLS = 32768
# Short-row LayerNorm backward: persistent programs per SM, and loop stages (tiles of x and
# dy prefetched while the current one is reduced). Swept on an H200 over {2, 4, 8, 16} x
# {1, 2, 3}: 2 x 3 was best or within 3% of it at 1024-8192 columns, and 1.2-2.2x faster
# than without prefetch at bf16 (e.g. 32768x1024: 77 us against 104 us).
LN_BWD_PROGRAMS_PER_SM = 2
LN_BWD_STAGES = 3


def ln_fwd_warps(block: int, elem_size: int) -> int:
    """Warps for a LayerNorm forward tile: up to 16, or 32 once a tile holds more than
    64 KiB of input (an fp32 row of 32768: 64 values a thread at 16 warps; measured on an
    H200, 32 warps read it at 89% of copy against 80%, while bf16 rows run best at 16)."""
    return num_warps(block, max_warps=32 if block * elem_size > 65536 else 16)


def row_block(n_cols: int, max_fused_cols: Optional[int] = None) -> tuple[int, bool]:
    """Return ``(BLOCK, single_pass)`` for rows of ``n_cols`` elements (whole rows up to
    ``max_fused_cols``, default MAX_FUSED_COLS)."""
    limit = MAX_FUSED_COLS if max_fused_cols is None else max_fused_cols
    if n_cols <= limit:
        return max(next_power_of_2(n_cols), 16), True
    return min(LOOP_BLOCK, MAX_FUSED_COLS), False


# Elements a program holds per tile when rows are short: BLOCK_M rows of BLOCK_N columns.
TILE_ELEMENTS = 2048
# Persistent kernels (weight-gradient partials) launch this many programs per SM.
PROGRAMS_PER_SM = 2


# Long-row LayerNorm backward: rows per tile of the column-split kernel, and programs per SM.
# (4 is what every H200 benchmark in the README ran with; a pre-merge sweep preferred 2.)
LN_SPLIT_BLOCK_M = 2
LN_SPLIT_PROGRAMS_PER_SM = 4


def row_groups(n_rows: int, n_chunks: int, block_m: int, device: torch.device) -> int:
    """Row groups for a (column chunk x row group) grid: about LN_SPLIT_PROGRAMS_PER_SM programs
    per SM, each group at least one tile high. Depends only on the shape and the device."""
    wanted = max(1, num_sms(device) * LN_SPLIT_PROGRAMS_PER_SM // n_chunks)
    return max(1, min(wanted, cdiv(n_rows, block_m)))


def row_tile(n_rows: int, n_cols: int, max_fused_cols: Optional[int] = None) -> tuple[int, int, bool]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass)``: rows per program tile and columns per block."""
    block_n, single_pass = row_block(n_cols, max_fused_cols)
    block_m = max(1, min(TILE_ELEMENTS // block_n, next_power_of_2(max(n_rows, 1)), 64))
    return block_m, block_n, single_pass


# Elements each warp holds in a tile (8 per thread).
ELEMENTS_PER_WARP = 512


def num_warps(block: int, max_warps: int = 16) -> int:
    """Warps for a program holding ``block`` elements at a time."""
    return max(1, min(max_warps, block // ELEMENTS_PER_WARP))


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code (``triton.cdiv`` costs microseconds per call there)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of 2 >= n (>= 1), for host code."""
    return 1 << max(n - 1, 0).bit_length()


def direct(kernel):
    """Launch a kernel as is (eager). The custom ops pass ``torch.library.wrap_triton`` instead."""
    return kernel


def mask_bytes(mask: Optional[torch.Tensor], traced: bool) -> Optional[torch.Tensor]:
    """A bool mask as uint8 for the kernels: a free view when launching eagerly, a (small)
    copy when traced by torch.compile, whose Inductor cannot lower a bool -> uint8 view."""
    if mask is None:
        return None
    return mask.to(torch.uint8) if traced else mask.view(torch.uint8)


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
    rows_per_program = cdiv(n_rows, programs)
    programs = cdiv(n_rows, rows_per_program)
    return programs, rows_per_program


# Kernels that stream a (rows x columns) matrix in 2-D tiles (weighted sum): bytes of
# the input per tile (BLOCK_M rows x BLOCK_D columns), the widest column block while a
# tile holds several rows, elements per thread (16-byte vector accesses need rows that
# start 16-element aligned; scalar accesses need an address register each, so fewer),
# and how many programs to aim for per SM. Offline sm_90 builds (Triton 3.9): ~60-100
# registers, no spills, 16-byte loads at the benchmark shapes.
TILE_BYTES = 16384
TILE_MAX_COLS = 2048
ELEMS_PER_THREAD = 32
UNALIGNED_ELEMS_PER_THREAD = 8
FWD_PROGRAMS_PER_SM = 8
BWD_PROGRAMS_PER_SM = 8


def tile_2d(n_rows: int, n_cols: int, elem_size: int, aligned: bool = True) -> tuple[int, int, int]:
    """Return ``(BLOCK_M, BLOCK_D, num_warps)`` for tiles of a (n_rows x n_cols) matrix.

    A tile moves about TILE_BYTES of the input: short rows are stacked several to a tile,
    and with few rows the column block widens instead, so no lanes idle on masked rows.
    """
    per_thread = ELEMS_PER_THREAD if aligned else UNALIGNED_ELEMS_PER_THREAD
    elems = max(16, min(TILE_BYTES // elem_size, 16 * 32 * per_thread))
    cols = max(next_power_of_2(n_cols), 16)
    block_d = min(cols, TILE_MAX_COLS, elems)
    block_m = max(1, min(next_power_of_2(n_rows), elems // block_d))
    block_d = min(cols, max(block_d, elems // block_m))
    return block_m, block_d, max(1, min(16, block_m * block_d // (32 * per_thread)))


def rows_aligned(t, n_cols: int) -> bool:
    """Whether every row of the 2-D ``t`` (None: a fresh contiguous one) starts 16-element
    aligned, so the kernels can use vector accesses. Reads no data pointer (works on
    FakeTensors under torch.compile); only a heuristic, never needed for correctness."""
    if n_cols % 16:
        return False
    return t is None or (t.stride(0) % 16 == 0 and t.storage_offset() % 16 == 0)


def split_range(n: int, block: int, parts: int) -> tuple[int, int]:
    """Cut ``n`` into at most ``parts`` contiguous ranges, each a multiple of ``block``.

    Returns ``(range_length, n_ranges)``; the last range may be shorter.
    """
    blocks = cdiv(n, block)
    length = cdiv(blocks, max(1, min(parts, blocks))) * block
    return length, cdiv(n, length)


# Elementwise-after-reduction kernels (coor_descent backward) split each row into chunks
# of at most LOOP_BLOCK columns and at least SPLIT_MIN_BLOCK, aiming at this many
# programs per SM so that a few long rows still fill the GPU.
SPLIT_MIN_BLOCK = 256
SPLIT_ROW_PROGRAMS_PER_SM = 4


def split_row(n_rows: int, n_cols: int, device: torch.device) -> tuple[int, int]:
    """Return ``(BLOCK, chunks_per_row)`` for a grid of (rows, chunks) programs."""
    per_row = cdiv(num_sms(device) * SPLIT_ROW_PROGRAMS_PER_SM, max(n_rows, 1))
    block = next_power_of_2(cdiv(n_cols, per_row))
    block = min(max(block, SPLIT_MIN_BLOCK), LOOP_BLOCK)
    return block, cdiv(n_cols, block)


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
    block_n = max(next_power_of_2(n_cols), 16)
    rows = next_power_of_2(max(n_rows, 1))
    block_m = max(1, min(SOFTMAX_TILE_ELEMENTS // block_n, SOFTMAX_MAX_TILE_ROWS, rows))
    return block_m, block_n, True, max(1, min(32, block_m * block_n // 512))
