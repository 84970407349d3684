"""The softmax's launch heuristics (plain, causal, masked): tiles, warps, the causal forms.
Pure functions of the shapes and the knobs (:class:`~triton_layers.launch_config.SoftmaxLaunch`);
``kernels/softmax.py``'s plans call them. Each knob's reasons: docs/TUNING.md.
"""
from __future__ import annotations

import functools

from ..launch_config import SoftmaxLaunch
from ._common import next_power_of_2, warps_for


def prefix_splits(block_n: int, single_pass: bool, causal: bool, cfg: SoftmaxLaunch) -> int:
    """PREFIX_SPLITS for a softmax launch: ``cfg.causal_prefix_splits`` for causal rows held
    whole, while the narrowest part keeps 16 columns (a 16-byte vector of bf16 and more);
    else 1."""
    splits = cfg.causal_prefix_splits if causal and single_pass else 1
    while splits > 1 and block_n // splits < 16:
        splits //= 2
    return splits


def causal_classes(n_cols: int, n_q: int, elem_size: int, block_n: int, single_pass: bool, causal: bool,
                   cfg: SoftmaxLaunch) -> tuple[tuple[int, int, int, int], ...]:
    """The causal forward's launches by class of rows (``cfg.causal_class_min_cols``), as
    ``(first query, queries, WIDTH, num_warps)`` for each class that has rows: the queries
    whose rows see at most ``block_n // 2`` keys, then the rest; ``()`` where one launch runs
    every row (not causal, rows streamed, or blocks narrower than the limit)."""
    if not (causal and single_pass and block_n >= cfg.causal_class_min_cols):
        return ()
    # query q sees q + 1 + (n_cols - n_q) keys (bottom-right aligned): at most block_n // 2
    # below q_split
    q_split = min(max(block_n // 2 - (n_cols - n_q), 0), n_q)
    per_thread = max(1, cfg.causal_class_thread_bytes // elem_size)
    classes = ((0, q_split, block_n // 2), (q_split, n_q - q_split, block_n))
    return tuple((q_lo, count, width, warps_for(width, per_thread)) for q_lo, count, width in classes if count)


def bwd_reload(block_n: int, single_pass: bool, cfg: SoftmaxLaunch) -> bool:
    """RELOAD for a softmax backward launch: rows held whole in blocks of at least
    ``cfg.bwd_reload_min_cols`` columns read y and dy again for dx (from L2)."""
    return single_pass and block_n >= cfg.bwd_reload_min_cols


@functools.lru_cache(maxsize=4096)
def tile(n_rows: int, n_cols: int, cfg: SoftmaxLaunch, causal: bool = False) -> tuple[int, int, bool, int, int]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass, num_warps, PREFIX_SPLITS)`` for a row-wise softmax.

    ``BLOCK_M`` rows of ``BLOCK_N`` columns per program on the single-pass path; one row
    per program, walked in ``BLOCK_N`` chunks, on the looped path. About ``cfg.elems_per_thread``
    elements a thread. ``PREFIX_SPLITS``: :func:`prefix_splits`.
    """
    if n_cols > cfg.max_fused_cols:
        block_n = min(cfg.loop_block, cfg.max_fused_cols)
        return 1, block_n, False, warps_for(block_n, cfg.elems_per_thread), 1
    block_n = max(next_power_of_2(n_cols), 16)
    rows = next_power_of_2(max(n_rows, 1))
    tile_elements = cfg.causal_tile_elements if causal else cfg.tile_elements
    block_m = max(1, min(tile_elements // block_n, cfg.max_tile_rows, rows))
    return (block_m, block_n, True, warps_for(block_m * block_n, cfg.elems_per_thread),
            prefix_splits(block_n, True, causal, cfg))
