"""Launch heuristics shared by every kernel file: block widths, warps, grid sizes.

The knobs are frozen per-op config objects gathered in one :class:`LaunchConfig`.
``DEFAULT`` is what every launch uses; ``TINY`` shrinks the row limits so that rows of a
few dozen elements take the chunked (long-row) paths, which is how the CPU tests and
``scripts/sanitize.py --tiny`` cover those paths. :func:`use_config` switches the config
for a ``with`` block; nothing patches module globals. The launchers read the config once
per call through :func:`current`. Nothing here queries CUDA at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import weakref
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass(frozen=True)
class LayerNormLaunch:
    """LayerNorm (and RMSNorm) launch knobs."""

    # docs/TUNING.md, "LayerNormLaunch.fwd_max_fused_cols"
    fwd_max_fused_cols: int = 32768
    # docs/TUNING.md, "LayerNormLaunch.fwd_residual_max_fused_cols"
    fwd_residual_max_fused_cols: int = 32768
    # docs/TUNING.md, "LayerNormLaunch.fwd_one_pass"
    fwd_one_pass: Optional[bool] = None
    fwd_one_pass_gpus: tuple[str, ...] = ("H100",)
    fwd_residual_one_pass: bool = True
    fwd_one_pass_block: int = 4096
    fwd_one_pass_max_chunks: int = 64
    fwd_one_pass_sm_bytes: int = 32768
    # docs/TUNING.md, "LayerNormLaunch.fwd_one_pass_ahead"
    fwd_one_pass_ahead: int = 1
    fwd_one_pass_rms_fp32_ahead: int = 2
    # docs/TUNING.md, "LayerNormLaunch.bwd_max_fused_cols"
    bwd_max_fused_cols: int = 8192
    # docs/TUNING.md, "LayerNormLaunch.bwd_residual_max_fused_cols"
    bwd_residual_max_fused_cols: int = 8192
    # docs/TUNING.md, "LayerNormLaunch.bwd_rms_max_fused_cols"
    bwd_rms_max_fused_cols: int = 16384
    # docs/TUNING.md, "LayerNormLaunch.loop_block"
    loop_block: int = 8192
    # docs/TUNING.md, "LayerNormLaunch.tile_elements"
    tile_elements: int = 2048
    # docs/TUNING.md, "LayerNormLaunch.fwd_warps"
    fwd_warps: Optional[int] = None
    # docs/TUNING.md, "LayerNormLaunch.fwd_4_warps_8192_gpus"
    fwd_4_warps_8192_gpus: tuple[str, ...] = ("H200",)
    # docs/TUNING.md, "LayerNormLaunch.bwd_programs_per_sm"
    bwd_programs_per_sm: int = 2
    bwd_stages: int = 3
    # docs/TUNING.md, "LayerNormLaunch.bwd_tile_bytes"
    bwd_tile_bytes: int = 16384
    # docs/TUNING.md, "LayerNormLaunch.bwd_long_row_stages"
    bwd_long_row_stages: int = 1
    # docs/TUNING.md, "LayerNormLaunch.bwd_max_warps"
    bwd_max_warps: int = 16
    # docs/TUNING.md, "LayerNormLaunch.bwd_long_row_weight_per_tile"
    bwd_long_row_weight_per_tile: bool = True
    # docs/TUNING.md, "LayerNormLaunch.bwd_long_row_programs_per_sm"
    bwd_long_row_programs_per_sm: int = 1
    # docs/TUNING.md, "LayerNormLaunch.split_one_pass"
    split_one_pass: bool = True
    split_publish_ahead: int = 2
    # docs/TUNING.md, "LayerNormLaunch.split_tile_bytes"
    split_tile_bytes: int = 32768
    split_two_pass_tile_bytes: int = 16384
    split_programs_per_sm: int = 2
    # docs/TUNING.md, "LayerNormLaunch.split_one_pass_max_chunks"
    split_one_pass_max_chunks: int = 16
    # docs/TUNING.md, "LayerNormLaunch.split_one_pass_layer_norm_min_bytes"
    split_one_pass_layer_norm_min_bytes: int = 4
    # docs/TUNING.md, "LayerNormLaunch.split_one_pass_layer_norm_max_chunks"
    split_one_pass_layer_norm_max_chunks: int = 2
    # docs/TUNING.md, "LayerNormLaunch.split_wait_polls"
    split_wait_polls: int = 0
    # docs/TUNING.md, "LayerNormLaunch.partials_programs_per_sm"
    partials_programs_per_sm: int = 4
    partials_tile_elements: int = 2048


@dataclass(frozen=True)
class SoftmaxLaunch:
    """Softmax launch knobs."""

    # docs/TUNING.md, "SoftmaxLaunch.max_fused_cols"
    max_fused_cols: int = 32768
    loop_block: int = 4096
    # docs/TUNING.md, "SoftmaxLaunch.tile_elements"
    tile_elements: int = 4096
    # docs/TUNING.md, "SoftmaxLaunch.causal_tile_elements"
    causal_tile_elements: int = 1024
    max_tile_rows: int = 64
    # docs/TUNING.md, "SoftmaxLaunch.elems_per_thread"
    elems_per_thread: int = 32
    # docs/TUNING.md, "SoftmaxLaunch.causal_prefix_splits"
    causal_prefix_splits: int = 2
    # docs/TUNING.md, "SoftmaxLaunch.causal_class_min_cols"
    causal_class_min_cols: int = 32768
    causal_class_thread_bytes: int = 64
    # docs/TUNING.md, "SoftmaxLaunch.bwd_reload_min_cols"
    bwd_reload_min_cols: int = 32768


@dataclass(frozen=True)
class WeightedSumLaunch:
    """Weighted-sum launch knobs: 2-D tiles of a (rows x columns) matrix (docs/TUNING.md)."""

    # docs/TUNING.md, "WeightedSumLaunch.tile_bytes"
    tile_bytes: int = 8192
    tile_max_cols: int = 2048
    elems_per_thread: int = 32
    unaligned_elems_per_thread: int = 8
    fwd_programs_per_sm: int = 8
    bwd_programs_per_sm: int = 4
    # docs/TUNING.md, "WeightedSumLaunch.fwd_stages"
    fwd_stages: Optional[int] = 2
    bwd_stages: Optional[int] = 2
    # docs/TUNING.md, "WeightedSumLaunch.fwd_tile_bytes_4byte"
    fwd_tile_bytes_4byte: int = 16384
    fwd_stages_4byte: Optional[int] = None
    # docs/TUNING.md, "WeightedSumLaunch.reduce_block"
    reduce_block: int = 1024
    # docs/TUNING.md, "WeightedSumLaunch.bwd_two_pass_min_bytes"
    bwd_two_pass_min_bytes: int = 64 << 20
    bwd_dw_stages: Optional[int] = 3


@dataclass(frozen=True)
class CoorDescentLaunch:
    """coor_descent launch knobs: the op is bound by its chain of n_iters row reductions,
    not by bytes. Chosen with benchmarks/dev/tune_coor_descent.py (H100, GPU time, 2026-11-25)."""

    # docs/TUNING.md, "CoorDescentLaunch.max_fused_cols"
    max_fused_cols: int = 32768
    loop_block: int = 4096
    # docs/TUNING.md, "CoorDescentLaunch.fwd_elems_per_thread"
    fwd_elems_per_thread: int = 8
    fwd_max_warps: int = 16
    bwd_elems_per_thread: int = 8
    # docs/TUNING.md, "CoorDescentLaunch.split_min_block"
    split_min_block: int = 256
    split_programs_per_sm: int = 1


@dataclass(frozen=True)
class LaunchConfig:
    """Every op's launch knobs. Derive variants with ``dataclasses.replace``."""

    # docs/TUNING.md, "LaunchConfig.layer_norm"
    layer_norm: LayerNormLaunch = LayerNormLaunch()
    softmax: SoftmaxLaunch = SoftmaxLaunch()
    weighted_sum: WeightedSumLaunch = WeightedSumLaunch()
    coor_descent: CoorDescentLaunch = CoorDescentLaunch()


DEFAULT = LaunchConfig()


def shrunk(max_cols: int, loop_block: int, softmax_tile_elements: int = 64) -> LaunchConfig:
    """DEFAULT with every row limit at ``max_cols`` and every chunk at ``loop_block``
    columns, so that rows longer than ``max_cols`` take the chunked paths."""
    d = DEFAULT
    return LaunchConfig(
        layer_norm=dataclasses.replace(d.layer_norm, fwd_max_fused_cols=max_cols, bwd_max_fused_cols=max_cols,
                                       bwd_rms_max_fused_cols=max_cols,
                                       fwd_residual_max_fused_cols=max_cols, bwd_residual_max_fused_cols=max_cols,
                                       loop_block=loop_block, fwd_one_pass_block=loop_block),
        softmax=dataclasses.replace(d.softmax, max_fused_cols=max_cols, loop_block=loop_block,
                                    tile_elements=softmax_tile_elements, causal_tile_elements=softmax_tile_elements),
        weighted_sum=d.weighted_sum,
        coor_descent=dataclasses.replace(d.coor_descent, max_fused_cols=max_cols, loop_block=loop_block),
    )


# Rows over 16 columns take the chunked paths (8-column chunks), and weighted-sum tiles
# hold 512 bytes (column loops, column splits, several partial rows on small inputs), its
# backward in two passes from 4 KB: small enough for the Triton interpreter on the CPU.
TINY = dataclasses.replace(
    shrunk(16, 8), weighted_sum=dataclasses.replace(DEFAULT.weighted_sum, tile_bytes=512, tile_max_cols=32,
                                                    bwd_two_pass_min_bytes=4096))

_current = DEFAULT
# Emptied (``.clear()``) whenever the config changes: the plan caches of both doors, which hold
# the decisions of the config they were made under (kernels/_eager.py: PlanCache).
_on_change: "weakref.WeakSet" = weakref.WeakSet()


def current() -> LaunchConfig:
    """The config the launchers use now."""
    return _current


def _set(config: LaunchConfig) -> None:
    global _current
    if config is not _current:
        _current = config
        for cache in list(_on_change):
            cache.clear()


@contextlib.contextmanager
def use_config(config: LaunchConfig) -> Iterator[LaunchConfig]:
    """Launch with ``config`` inside the ``with`` block, then restore the previous one.

    Process-wide (not per thread): autograd runs backwards on its own threads, and a
    backward must see the config its forward was launched with.
    """
    if not isinstance(config, LaunchConfig):
        raise TypeError(f"config must be a LaunchConfig, got {type(config).__name__}")
    saved = _current
    _set(config)
    try:
        yield config
    finally:
        _set(saved)


# --- helpers the launchers share ----------------------------------------------------------
# The shape heuristics are pure functions of hashable arguments (ints, frozen configs,
# devices), cached: launchers call them on every eager call, where the host sets the pace.

# Elements each warp holds in a tile (8 per thread).
ELEMENTS_PER_WARP = 512


def warps_for(block: int, elems_per_thread: int, max_warps: int = 32) -> int:
    """Warps for a program holding ``block`` elements, about ``elems_per_thread`` a thread."""
    return max(1, min(max_warps, block // (32 * elems_per_thread)))


def num_warps(block: int, max_warps: int = 16) -> int:
    """Warps for a program holding ``block`` elements at a time (ELEMENTS_PER_WARP a warp)."""
    return warps_for(block, ELEMENTS_PER_WARP // 32, max_warps)


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


def device_index(t: torch.Tensor) -> Optional[int]:
    """``t``'s CUDA device index; None off CUDA (the Triton interpreter's CPU tensors)."""
    return t.get_device() if t.is_cuda else None


def new_output(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``t``'s shape and device (and ``dtype``, default
    t's) for a launcher to write: ``torch.empty_like`` costs about a third of the host time of
    ``torch.empty(t.shape, ...)``, whose ``torch.Size`` argument dominates at small shapes."""
    return torch.empty_like(t, dtype=dtype, memory_format=torch.contiguous_format)


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code (``triton.cdiv`` costs microseconds per call there)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of 2 >= n (>= 1), for host code."""
    return 1 << max(n - 1, 0).bit_length()


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a small stand-in on the CPU (interpreter)."""
    if device.type == "cuda":
        return _sm_count(_index(device))
    return 4


@functools.lru_cache(maxsize=None)
def _device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


@functools.lru_cache(maxsize=None)
def _shared_memory(device_index: int) -> Optional[int]:
    """Bytes of shared memory one program may use on the device, the limit Triton checks at
    launch (None if neither Triton nor torch says)."""
    try:
        from triton.runtime.driver import driver

        return int(driver.active.utils.get_device_properties(device_index)["max_shared_mem"])
    except Exception:  # another Triton: torch knows it too (2.4+)
        return getattr(torch.cuda.get_device_properties(device_index), "shared_memory_per_block_optin", None)


# Rows longer than this are "long" to the norm backward's whole-row kernel (16 warps of
# ELEMENTS_PER_WARP): they take bwd_long_row_stages.
LONG_ROW = 16 * ELEMENTS_PER_WARP

# Shared memory left to a program's reductions beside its prefetch buffers.
REDUCTION_SCRATCH = 16384


@functools.lru_cache(maxsize=4096)
def prefetch_stages(stages: int, stage_bytes: int, device: torch.device) -> int:
    """``stages`` for a ``tl.range(num_stages=...)`` loop whose iterations load ``stage_bytes``,
    capped so that its buffers fit the device's shared memory: Triton keeps stages - 1 tiles
    of every pipelined load there, the weight's too where a tile loads it (measured on an
    H100: 2 x 128 KB for a 16,384-column fp32 row of z and dy at 3 stages; offline sm_90
    builds, Triton 3.6: 1 x 256 KB at 2 stages for z, dy, dh and the weight, which failed at
    launch while the weight was left out of ``stage_bytes``). The defaults fit an H100's or
    H200's 227 KB a program, not an A100's 163 KB or the 99 KB of an RTX 4090 or L4, where
    the launch would fail."""
    if device.type != "cuda" or stages <= 1:
        return stages
    limit = _shared_memory(_index(device))
    if limit is None:
        return stages
    return max(1, min(stages, 1 + (limit - REDUCTION_SCRATCH) // max(stage_bytes, 1)))


@functools.lru_cache(maxsize=4096)
def row_block(n_cols: int, max_fused_cols: int, loop_block: int) -> tuple[int, bool]:
    """Return ``(BLOCK, single_pass)`` for rows of ``n_cols`` elements: whole rows up to
    ``max_fused_cols``, else ``loop_block``-wide chunks."""
    if n_cols <= max_fused_cols:
        return max(next_power_of_2(n_cols), 16), True
    return min(loop_block, max_fused_cols), False


@functools.lru_cache(maxsize=4096)
def row_tile(n_rows: int, n_cols: int, max_fused_cols: int, loop_block: int,
             tile_elements: int) -> tuple[int, int, bool]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass)``: rows per program tile and columns per block."""
    block_n, single_pass = row_block(n_cols, max_fused_cols, loop_block)
    block_m = max(1, min(tile_elements // block_n, next_power_of_2(max(n_rows, 1)), 64))
    return block_m, block_n, single_pass


def ln_fwd_warps(block: int, elem_size: int, cfg: LayerNormLaunch, plain_whole_rows: bool = False,
                 device: Optional[torch.device] = None) -> int:
    """Warps for a LayerNorm forward tile: up to 16, or 32 once a tile holds more than
    64 KiB of input (an fp32 row of 32768: 64 values a thread at 16 warps; measured on an
    H200, 32 warps read it at 89% of copy against 80%, while bf16 rows run best at 16).
    2-byte tiles of 16,384 take 8 warps: at 16 (32 values a thread) LayerNorm's kernel holds
    105 registers a thread (offline sm_90 build, Triton 3.6), so one 512-thread program
    fills an SM's registers and its loads stall while it reduces; at 8 warps (128
    registers) two programs fit. GPU time, 2048x16384 bf16: H100 53.9 us against 68.1, H200
    44.2 against 62.6; RMSNorm and the fused adds level or 1-4% faster; fp32 tiles of 16,384
    mixed (H200 4 warps 5% faster, H100 3% slower), kept at 16 (``tune_layernorm --dirs
    fwd`` sweeps ``cfg.fwd_warps``: no other tile of 1,024-32,768 columns gained over 5%
    on an H100). On the GPUs of ``cfg.fwd_4_warps_8192_gpus``, 2-byte tiles of 8,192 that are
    ``plain_whole_rows`` (rows kept whole, no residual) take 4 warps; not the chunks of longer
    rows (H200, LayerNorm 1024x131072 bf16: 283 us at 4 warps against 215). ``cfg.fwd_warps``
    set overrides this rule (sweeps)."""
    if cfg.fwd_warps is not None:
        return cfg.fwd_warps
    if elem_size == 2 and block == 16384:
        return 8
    if elem_size == 2 and block == 8192 and plain_whole_rows and device is not None \
            and named_gpu(device, cfg.fwd_4_warps_8192_gpus):
        return 4
    return num_warps(block, max_warps=32 if block * elem_size > 65536 else 16)


def partials_tile(n_partials: int, writers: int, n_cols: int, cfg: LayerNormLaunch,
                  device: torch.device) -> tuple[int, int]:
    """``(BLOCK_W, BLOCK_N)`` of the partials' sum: column blocks of 4-128 (a power of 2) that
    give about ``cfg.partials_programs_per_sm`` programs an SM, and rows of writers for a tile
    of ``cfg.partials_tile_elements`` (no more than the writers). On the CPU (the Triton
    interpreter, which runs programs one after another, each at a fixed cost) the fewest
    programs: blocks of up to ``cfg.partials_tile_elements`` columns. (Meta tensors, which
    the offline builds plan with, get the GPU's blocks.)"""
    if device.type != "cpu":
        programs = num_sms(device) * cfg.partials_programs_per_sm
        block_n = min(128, max(4, next_power_of_2(cdiv(n_cols * n_partials, programs))))
    else:
        block_n = min(next_power_of_2(n_cols), cfg.partials_tile_elements)
    return min(next_power_of_2(writers), max(1, cfg.partials_tile_elements // block_n)), block_n


def bwd_programs_per_sm_for(tile_elements: int, loaded_bytes: int, cfg: LayerNormLaunch) -> int:
    """Persistent programs per SM of the whole-row norm backward for tiles of ``tile_elements``
    whose loads bring ``loaded_bytes`` an element: ``cfg.bwd_long_row_programs_per_sm`` from
    LONG_ROW elements on, else ``cfg.bwd_programs_per_sm`` times how many such tiles make
    ``cfg.bwd_tile_bytes``."""
    if tile_elements >= LONG_ROW:
        return cfg.bwd_long_row_programs_per_sm
    return cfg.bwd_programs_per_sm * max(1, cfg.bwd_tile_bytes // max(tile_elements * loaded_bytes, 1))


@functools.lru_cache(maxsize=4096)
def row_groups(n_rows: int, n_chunks: int, block_m: int, programs_per_sm: int, device: torch.device) -> int:
    """Row groups for a (column chunk x row group) grid: about ``programs_per_sm`` programs
    per SM, each group at least one tile high. Depends only on the shape and the device."""
    wanted = max(1, num_sms(device) * programs_per_sm // n_chunks)
    return max(1, min(wanted, cdiv(n_rows, block_m)))


def split_rows(block_n: int, elem_size: int, one_pass: bool, cfg: LayerNormLaunch) -> int:
    """Rows per tile of the long-row norm backward: ``cfg.split_tile_bytes`` of z in one
    pass, ``cfg.split_two_pass_tile_bytes`` in two; a power of 2 from 1 to 8."""
    tile_bytes = cfg.split_tile_bytes if one_pass else cfg.split_two_pass_tile_bytes
    rows = max(1, tile_bytes // (block_n * elem_size))
    return min(8, 1 << (rows.bit_length() - 1))


def _waits_run(cfg: LayerNormLaunch, device: torch.device) -> bool:
    """Whether kernels whose programs wait for each other can run: on a GPU, or in the Triton
    interpreter (one program at a time, where a waiting program would wait forever) only with
    ``cfg.split_wait_polls`` > 0 (bounded waits)."""
    return (device.type == "cuda" and not _INTERPRET) or (_INTERPRET and cfg.split_wait_polls > 0)


def one_pass_forward_programs_per_sm(elem_size: int, cfg: LayerNormLaunch) -> int:
    """Programs per SM of the one-pass long-row norm forward: as many as hold
    ``cfg.fwd_one_pass_sm_bytes`` of input chunks, at least 1."""
    return max(1, cfg.fwd_one_pass_sm_bytes // (cfg.fwd_one_pass_block * elem_size))


def one_pass_forward(n_chunks: int, residual: bool, cfg: LayerNormLaunch, device: torch.device) -> bool:
    """Whether the norm forward (with a ``residual`` to add, or not) of rows of ``n_chunks``
    chunks takes its one-pass split form: asked by ``cfg`` (``fwd_residual_one_pass``,
    ``fwd_one_pass``), where waits can run (:func:`_waits_run`), with a row's chunks few
    enough to run at once (one per SM at most) and to wait for."""
    asked = cfg.fwd_residual_one_pass if residual else plain_one_pass_forward(cfg, device)
    return asked and _waits_run(cfg, device) and n_chunks <= min(cfg.fwd_one_pass_max_chunks, num_sms(device))


def plain_one_pass_forward(cfg: LayerNormLaunch, device: torch.device) -> bool:
    """``cfg.fwd_one_pass`` on ``device``: where None, whether the device's name contains one of
    ``cfg.fwd_one_pass_gpus`` (the GPUs where the one pass won without a residual)."""
    if cfg.fwd_one_pass is None:
        return named_gpu(device, cfg.fwd_one_pass_gpus)
    return cfg.fwd_one_pass


def named_gpu(device: torch.device, names: tuple[str, ...]) -> bool:
    """Whether ``device`` is a GPU whose name contains one of ``names`` (e.g. "H100")."""
    return device.type == "cuda" and any(gpu in _device_name(_index(device)) for gpu in names)


def one_pass_split(n_chunks: int, rms: bool, elem_size: int, cfg: LayerNormLaunch, device: torch.device) -> bool:
    """Whether the long-row norm backward takes its one-pass form: asked by ``cfg``, where waits
    can run (:func:`_waits_run`), with a row's chunks few enough to run at once (one per SM at
    most) and to wait for (``cfg.split_one_pass_max_chunks``); for RMSNorm, or LayerNorm inputs
    of ``cfg.split_one_pass_layer_norm_min_bytes`` an element or more, or LayerNorm rows of at
    most ``cfg.split_one_pass_layer_norm_max_chunks`` chunks."""
    return (cfg.split_one_pass and _waits_run(cfg, device)
            and n_chunks <= min(cfg.split_one_pass_max_chunks, num_sms(device))
            and (rms or elem_size >= cfg.split_one_pass_layer_norm_min_bytes
                 or n_chunks <= cfg.split_one_pass_layer_norm_max_chunks))


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=4096)
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


@functools.lru_cache(maxsize=4096)
def split_row(n_rows: int, n_cols: int, cfg: CoorDescentLaunch, device: torch.device) -> tuple[int, int]:
    """Return ``(BLOCK, chunks_per_row)`` for a grid of (rows, chunks) programs."""
    per_row = cdiv(num_sms(device) * cfg.split_programs_per_sm, max(n_rows, 1))
    block = next_power_of_2(cdiv(n_cols, per_row))
    block = min(max(block, cfg.split_min_block), cfg.loop_block)
    return block, cdiv(n_cols, block)


def softmax_prefix_splits(block_n: int, single_pass: bool, causal: bool, cfg: SoftmaxLaunch) -> int:
    """PREFIX_SPLITS for a softmax launch: ``cfg.causal_prefix_splits`` for causal rows held
    whole, while the narrowest part keeps 16 columns (a 16-byte vector of bf16 and more);
    else 1."""
    splits = cfg.causal_prefix_splits if causal and single_pass else 1
    while splits > 1 and block_n // splits < 16:
        splits //= 2
    return splits


def softmax_causal_classes(n_cols: int, n_q: int, elem_size: int, block_n: int, single_pass: bool, causal: bool,
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


def softmax_bwd_reload(block_n: int, single_pass: bool, cfg: SoftmaxLaunch) -> bool:
    """RELOAD for a softmax backward launch: rows held whole in blocks of at least
    ``cfg.bwd_reload_min_cols`` columns read y and dy again for dx (from L2)."""
    return single_pass and block_n >= cfg.bwd_reload_min_cols


@functools.lru_cache(maxsize=4096)
def softmax_tile(n_rows: int, n_cols: int, cfg: SoftmaxLaunch,
                 causal: bool = False) -> tuple[int, int, bool, int, int]:
    """Return ``(BLOCK_M, BLOCK_N, single_pass, num_warps, PREFIX_SPLITS)`` for a row-wise softmax.

    ``BLOCK_M`` rows of ``BLOCK_N`` columns per program on the single-pass path; one row
    per program, walked in ``BLOCK_N`` chunks, on the looped path. About ``cfg.elems_per_thread``
    elements a thread. ``PREFIX_SPLITS``: :func:`softmax_prefix_splits`.
    """
    if n_cols > cfg.max_fused_cols:
        block_n = min(cfg.loop_block, cfg.max_fused_cols)
        return 1, block_n, False, warps_for(block_n, cfg.elems_per_thread), 1
    block_n = max(next_power_of_2(n_cols), 16)
    rows = next_power_of_2(max(n_rows, 1))
    tile = cfg.causal_tile_elements if causal else cfg.tile_elements
    block_m = max(1, min(tile // block_n, cfg.max_tile_rows, rows))
    return (block_m, block_n, True, warps_for(block_m * block_n, cfg.elems_per_thread),
            softmax_prefix_splits(block_n, True, causal, cfg))
