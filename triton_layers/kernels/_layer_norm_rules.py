"""The norms' launch heuristics (LayerNorm, RMSNorm, the fused residual add): tiles, warps,
grids, prefetch stages and when the long-row forms run in one pass. Pure functions of the
shapes, the knobs (:class:`~triton_layers.launch_config.LayerNormLaunch`) and the GPU value
(:class:`~triton_layers.launch_config.GPU`): ``kernels/layer_norm.py``'s plans call them once
per call signature. Each knob's reasons: docs/TUNING.md.
"""
from __future__ import annotations

import functools
from typing import Optional

from ..launch_config import GPU, LayerNormLaunch
from ._common import cdiv, next_power_of_2, row_block, warps_for


@functools.lru_cache(maxsize=4096)
def row_tile(n_rows: int, n_cols: int, max_fused_cols: int, loop_block: int,
             tile_elements: int, max_tile_rows: int) -> tuple[int, int, bool]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass)``: rows per program tile (at most
    ``max_tile_rows``) and columns per block."""
    block_n, single_pass = row_block(n_cols, max_fused_cols, loop_block)
    block_m = max(1, min(tile_elements // block_n, next_power_of_2(max(n_rows, 1)), max_tile_rows))
    return block_m, block_n, single_pass


def fp8_tile(n_rows: int, n_cols: int, cfg: LayerNormLaunch, gpu: GPU,
             layer_norm: bool = False) -> tuple[int, int, bool, int]:
    """``(BLOCK_M, BLOCK_N, whole_rows, elems_per_thread)`` of an FP8 norm program
    (kernels/norm_fp8.py): :func:`row_tile` at ``cfg.fp8_tile_elements``, ``cfg.fp8_elems_per_thread``
    a thread; rows over ``fwd_max_fused_cols`` in chunks at the plain forward's ``elems_per_thread``.
    Two rules for the GPUs they name (docs/TUNING.md, "LayerNormLaunch.fp8_small_grid_elems_per_thread" and
    "LayerNormLaunch.fp8_layer_norm_8192_tile_elements"):

    - on those of ``cfg.fp8_small_grid_gpus``, rows of at least ``cfg.fp8_small_grid_min_cols``
      columns that number at most the SMs (decode sizes) take one row a program at
      ``cfg.fp8_small_grid_elems_per_thread``: twice the default's warps at 4,096 and 8,192
      columns, where one program's latency is the call's;
    - on those of ``cfg.fp8_layer_norm_8192_gpus``, LayerNorm without a residual (``layer_norm``)
      at rows of 8,192, past the small grid, takes tiles of ``cfg.fp8_layer_norm_8192_tile_elements``."""
    tile = cfg.fp8_tile_elements
    if layer_norm and n_cols == 8192 and gpu.named(cfg.fp8_layer_norm_8192_gpus):
        tile = cfg.fp8_layer_norm_8192_tile_elements
    block_m, block_n, whole_rows = row_tile(n_rows, n_cols, cfg.fwd_max_fused_cols, cfg.loop_block, tile,
                                            cfg.max_tile_rows)
    if not whole_rows:
        return block_m, block_n, False, cfg.elems_per_thread
    if n_cols >= cfg.fp8_small_grid_min_cols and n_rows <= gpu.sm_count and gpu.named(cfg.fp8_small_grid_gpus):
        return 1, block_n, True, cfg.fp8_small_grid_elems_per_thread
    return block_m, block_n, True, cfg.fp8_elems_per_thread


def num_warps(block: int, cfg: LayerNormLaunch, max_warps: int = 16) -> int:
    """Warps for a program holding ``block`` elements at a time, ``cfg.elems_per_thread`` a
    thread."""
    return warps_for(block, cfg.elems_per_thread, max_warps)


def fwd_warps(block: int, elem_size: int, cfg: LayerNormLaunch, whole_rows: bool = False,
              gpu: Optional[GPU] = None, residual_elem_size: int = 0, rms: bool = False) -> int:
    """Warps for a LayerNorm forward tile: up to 16, or 32 once a tile holds more than
    64 KiB of input (an fp32 row of 32768: 64 values a thread at 16 warps; docs/TUNING.md,
    "LayerNormLaunch.elems_per_thread"). 2-byte tiles of 16,384 take 8 warps: at 16 (32
    values a thread) LayerNorm's kernel holds more registers a thread than two programs an
    SM allow (offline sm_90 build, Triton 3.6), so one 512-thread program fills an SM's
    registers and its loads stall while it reduces; at 8 warps (128 registers) two programs
    fit. fp32 tiles of 16,384 keep 16 (``tune_layernorm --dirs fwd``, which sweeps
    ``cfg.fwd_warps``; the figures: docs/TUNING.md, "LayerNormLaunch.fwd_warps"). On the GPUs
    of ``cfg.fwd_4_warps_8192_gpus`` (:meth:`GPU.named`), 2-byte tiles of 8,192 that are
    ``whole_rows`` take 4 warps: without a residual (``residual_elem_size`` 0), or RMSNorm's
    (``rms``) with a 2-byte residual and h (their wider element size); not LayerNorm's fused
    add, nor the chunks of longer rows (docs/TUNING.md, "LayerNormLaunch.fwd_4_warps_8192_gpus");
    every other GPU (no ``gpu`` given, or one the names do not name) takes 16.
    ``cfg.fwd_warps`` set overrides this rule (sweeps)."""
    if cfg.fwd_warps is not None:
        return cfg.fwd_warps
    if elem_size == 2 and block == 16384:
        return 8
    if elem_size == 2 and block == 8192 and whole_rows and gpu is not None \
            and (residual_elem_size == 0 or (rms and residual_elem_size == 2)) \
            and gpu.named(cfg.fwd_4_warps_8192_gpus):
        return 4
    return num_warps(block, cfg, max_warps=32 if block * elem_size > 65536 else 16)


def affine_first(rms: bool, programs: int, cfg: LayerNormLaunch, gpu: GPU) -> bool:
    """Whether the whole-row forward loads the weight (and bias) before x rather than after its
    reductions: RMSNorm always; LayerNorm where its grid of ``programs`` has at most
    ``cfg.fwd_affine_first_programs_per_sm`` programs per SM of ``gpu`` (decode sizes, where a
    program's loads wait on memory and its registers cost no occupancy; docs/TUNING.md,
    "LayerNormLaunch.fwd_affine_first_programs_per_sm")."""
    return rms or programs <= cfg.fwd_affine_first_programs_per_sm * gpu.sm_count


@functools.lru_cache(maxsize=4096)
def prefetch_stages(stages: int, stage_bytes: int, gpu: GPU, scratch_bytes: int) -> int:
    """``stages`` for a ``tl.range(num_stages=...)`` loop whose iterations load ``stage_bytes``,
    capped so that its buffers and ``scratch_bytes`` (``cfg.bwd_reduction_scratch_bytes``) fit
    the GPU's shared memory: Triton keeps stages - 1 tiles of every pipelined load there, the
    weight's too where a tile loads it (measured on an H100: 2 x 128 KB for a 16,384-column fp32
    row of z and dy at 3 stages; offline sm_90 builds, Triton 3.6: 1 x 256 KB at 2 stages for
    z, dy, dh and the weight, which failed at launch while the weight was left out of
    ``stage_bytes``). The defaults fit an H100's or H200's 227 KB a program, not an A100's
    163 KB or the 99 KB of an RTX 4090 or L4, where the launch would fail. Off CUDA, or where
    the GPU's limit is unknown, ``stages`` as asked."""
    if gpu.device_type != "cuda" or stages <= 1 or gpu.shared_memory is None:
        return stages
    return max(1, min(stages, 1 + (gpu.shared_memory - scratch_bytes) // max(stage_bytes, 1)))


def partials_tile(n_partials: int, writers: int, n_cols: int, cfg: LayerNormLaunch, gpu: GPU) -> tuple[int, int]:
    """``(BLOCK_W, BLOCK_N)`` of the partials' sum: column blocks of 4-128 (a power of 2) that
    give about ``cfg.partials_programs_per_sm`` programs an SM, and rows of writers for a tile
    of ``cfg.partials_tile_elements`` (no more than the writers). On the CPU (the Triton
    interpreter, which runs programs one after another, each at a fixed cost) the fewest
    programs: blocks of up to ``cfg.partials_tile_elements`` columns. (Meta tensors, which
    the offline builds plan with, get the GPU's blocks.)"""
    if gpu.device_type != "cpu":
        programs = gpu.sm_count * cfg.partials_programs_per_sm
        block_n = min(128, max(4, next_power_of_2(cdiv(n_cols * n_partials, programs))))
    else:
        block_n = min(next_power_of_2(n_cols), cfg.partials_tile_elements)
    return min(next_power_of_2(writers), max(1, cfg.partials_tile_elements // block_n)), block_n


def bwd_programs_per_sm_for(tile_elements: int, loaded_bytes: int, cfg: LayerNormLaunch) -> int:
    """Persistent programs per SM of the whole-row norm backward for tiles of ``tile_elements``
    whose loads bring ``loaded_bytes`` an element: ``cfg.bwd_long_row_programs_per_sm`` from
    ``cfg.bwd_long_row`` elements on, else ``cfg.bwd_programs_per_sm`` times how many such
    tiles make ``cfg.bwd_tile_bytes``."""
    if tile_elements >= cfg.bwd_long_row:
        return cfg.bwd_long_row_programs_per_sm
    return cfg.bwd_programs_per_sm * max(1, cfg.bwd_tile_bytes // max(tile_elements * loaded_bytes, 1))


@functools.lru_cache(maxsize=4096)
def persistent_grid(n_rows: int, gpu: GPU, programs_per_sm: int = 1) -> tuple[int, int]:
    """Grid size and rows per program for kernels that walk a contiguous range of rows.

    Used where each program accumulates per-column partial sums (weight gradients): the
    number of programs is fixed by the GPU, not by timing, so the reduction order and
    therefore the result are the same on every run.
    """
    programs = max(1, min(n_rows, gpu.sm_count * programs_per_sm))
    rows_per_program = cdiv(n_rows, programs)
    programs = cdiv(n_rows, rows_per_program)
    return programs, rows_per_program


@functools.lru_cache(maxsize=4096)
def row_groups(n_rows: int, n_chunks: int, block_m: int, programs_per_sm: int, gpu: GPU) -> int:
    """Row groups for a (column chunk x row group) grid: about ``programs_per_sm`` programs
    per SM, each group at least one tile high. Depends only on the shape and the GPU."""
    wanted = max(1, gpu.sm_count * programs_per_sm // n_chunks)
    return max(1, min(wanted, cdiv(n_rows, block_m)))


def split_rows(block_n: int, elem_size: int, one_pass: bool, cfg: LayerNormLaunch) -> int:
    """Rows per tile of the long-row norm backward: ``cfg.split_tile_bytes`` of z in one
    pass, ``cfg.split_two_pass_tile_bytes`` in two; a power of 2 from 1 to 8."""
    tile_bytes = cfg.split_tile_bytes if one_pass else cfg.split_two_pass_tile_bytes
    rows = max(1, tile_bytes // (block_n * elem_size))
    return min(8, 1 << (rows.bit_length() - 1))


def waits_run(cfg: LayerNormLaunch, gpu: GPU) -> bool:
    """Whether kernels whose programs wait for each other can run: on a GPU, or in the Triton
    interpreter (one program at a time, where a waiting program would wait forever) only with
    ``cfg.split_wait_polls`` > 0 (bounded waits)."""
    return (gpu.device_type == "cuda" and not gpu.interpreted) or (gpu.interpreted and cfg.split_wait_polls > 0)


def one_pass_forward_programs_per_sm(elem_size: int, cfg: LayerNormLaunch) -> int:
    """Programs per SM of the one-pass long-row norm forward: as many as hold
    ``cfg.fwd_one_pass_sm_bytes`` of input chunks, at least 1."""
    return max(1, cfg.fwd_one_pass_sm_bytes // (cfg.fwd_one_pass_block * elem_size))


def one_pass_forward(n_chunks: int, residual: bool, cfg: LayerNormLaunch, gpu: GPU) -> bool:
    """Whether the norm forward (with a ``residual`` to add, or not) of rows of ``n_chunks``
    chunks takes its one-pass split form: asked by ``cfg`` (``fwd_residual_one_pass``,
    ``fwd_one_pass``), where waits can run (:func:`waits_run`), with a row's chunks few
    enough to run at once (one per SM at most) and to wait for."""
    asked = cfg.fwd_residual_one_pass if residual else plain_one_pass_forward(cfg, gpu)
    return asked and waits_run(cfg, gpu) and n_chunks <= min(cfg.fwd_one_pass_max_chunks, gpu.sm_count)


def plain_one_pass_forward(cfg: LayerNormLaunch, gpu: GPU) -> bool:
    """``cfg.fwd_one_pass`` on ``gpu``: where None, whether ``cfg.fwd_one_pass_gpus`` names it
    (:meth:`GPU.named`: the GPUs where the one pass won without a residual); every other GPU
    falls back to the loop, which needs no programs resident at once."""
    if cfg.fwd_one_pass is None:
        return gpu.named(cfg.fwd_one_pass_gpus)
    return cfg.fwd_one_pass


def one_pass_split(n_chunks: int, rms: bool, elem_size: int, cfg: LayerNormLaunch, gpu: GPU) -> bool:
    """Whether the long-row norm backward takes its one-pass form: asked by ``cfg``, where waits
    can run (:func:`waits_run`), with a row's chunks few enough to run at once (one per SM at
    most) and to wait for (``cfg.split_one_pass_max_chunks``); for RMSNorm, or LayerNorm inputs
    of ``cfg.split_one_pass_layer_norm_min_bytes`` an element or more, or LayerNorm rows of at
    most ``cfg.split_one_pass_layer_norm_max_chunks`` chunks."""
    return (cfg.split_one_pass and waits_run(cfg, gpu)
            and n_chunks <= min(cfg.split_one_pass_max_chunks, gpu.sm_count)
            and (rms or elem_size >= cfg.split_one_pass_layer_norm_min_bytes
                 or n_chunks <= cfg.split_one_pass_layer_norm_max_chunks))
