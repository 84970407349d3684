"""WeightedSum's launch heuristics: 2-D tiles of a (rows x columns) matrix and how the grid
splits a dimension among the GPU's SMs. Pure functions of the shapes, the knobs
(:class:`~triton_layers.launch_config.WeightedSumLaunch`) and the GPU value;
``kernels/weighted_sum.py``'s plans call them. Each knob's reasons: docs/TUNING.md.
"""
from __future__ import annotations

import functools
from typing import Optional

from ..launch_config import WeightedSumLaunch
from ._common import cdiv, next_power_of_2, warps_for


@functools.lru_cache(maxsize=4096)
def tile_2d(n_rows: int, n_cols: int, elem_size: int, cfg: WeightedSumLaunch,
            aligned: bool = True, tile_bytes: Optional[int] = None) -> tuple[int, int, int]:
    """Return ``(BLOCK_M, BLOCK_D, num_warps)`` for tiles of a (n_rows x n_cols) matrix.

    A tile moves about ``tile_bytes`` (default ``cfg.tile_bytes``) of the input: short rows are
    stacked several to a tile, and with few rows the column block widens instead, so no lanes
    idle on masked rows.
    """
    per_thread = cfg.elems_per_thread if aligned else cfg.unaligned_elems_per_thread
    elems = max(16, min((tile_bytes or cfg.tile_bytes) // elem_size, 16 * 32 * per_thread))
    cols = max(next_power_of_2(n_cols), 16)
    block_d = min(cols, cfg.tile_max_cols, elems)
    block_m = max(1, min(next_power_of_2(n_rows), elems // block_d))
    block_d = min(cols, max(block_d, elems // block_m))
    return block_m, block_d, warps_for(block_m * block_d, per_thread, max_warps=16)


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
