"""coor_descent's launch heuristics: how the backward splits rows into chunks for the GPU's
SMs. Pure functions of the shapes, the knobs
(:class:`~triton_layers.launch_config.CoorDescentLaunch`) and the GPU value;
``kernels/coor_descent.py``'s plans call them. Each knob's reasons: docs/TUNING.md.
"""
from __future__ import annotations

import functools

from ..launch_config import GPU, CoorDescentLaunch
from ._common import cdiv, next_power_of_2


@functools.lru_cache(maxsize=4096)
def split_row(n_rows: int, n_cols: int, cfg: CoorDescentLaunch, gpu: GPU) -> tuple[int, int]:
    """Return ``(BLOCK, chunks_per_row)`` for a grid of (rows, chunks) programs: about
    ``cfg.split_programs_per_sm`` programs an SM, chunks of ``cfg.split_min_block`` to
    ``cfg.loop_block`` columns."""
    per_row = cdiv(gpu.sm_count * cfg.split_programs_per_sm, max(n_rows, 1))
    block = next_power_of_2(cdiv(n_cols, per_row))
    block = min(max(block, cfg.split_min_block), cfg.loop_block)
    return block, cdiv(n_cols, block)
