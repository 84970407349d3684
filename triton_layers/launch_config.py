"""Launch configs: every launch knob of the kernels, and the GPU a launch plans for.

The knobs are frozen per-op configs (:class:`LayerNormLaunch`, :class:`SoftmaxLaunch`,
:class:`WeightedSumLaunch`, :class:`CoorDescentLaunch`) gathered in one :class:`LaunchConfig`.
:data:`DEFAULT` is what every launch uses; :data:`TINY` sends rows of a few dozen elements down
the chunked paths (the interpreter's tests). Switch the whole config for a ``with`` block with
:func:`use_config`, or one knob of one op with :func:`use_knobs`::

    from triton_layers import launch_config as lc

    with lc.use_knobs("layer_norm", loop_block=4096):      # one knob of one op
        y = norm(x)
    with lc.use_config(lc.DEFAULT.with_knobs("softmax", elems_per_thread=16)):
        y = softmax(scores)

Each knob's reasons and measurements: docs/TUNING.md. Plans are kept per call signature and
dropped whenever the config changes, so a switch costs the next call of each signature a new
plan, and nothing else.

:class:`GPU` is what a launch's heuristics know of its device (name, SMs, shared memory),
read once per device (:meth:`GPU.of`); rules that name GPUs match whole names or model tokens
(:meth:`GPU.named`). :func:`plan_as` plans meta (and CUDA) tensors' launches as on another GPU:
how the kernels are built and counted offline, without one.

Nothing here imports Triton or queries CUDA at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

__all__ = ["GPU", "LayerNormLaunch", "SoftmaxLaunch", "WeightedSumLaunch", "CoorDescentLaunch", "LaunchConfig",
           "DEFAULT", "TINY", "TRITON_INTERPRET", "shrunk", "current", "use_config", "use_knobs", "plan_as"]

TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""Whether the kernels run in the Triton interpreter: ``TRITON_INTERPRET=1`` read once, when
triton_layers is imported, as Triton reads it when the kernels are defined (so the path choice
agrees with how they were built). Its programs run one after another."""


@dataclass(frozen=True)
class GPU:
    """What launch heuristics know of the device a launch runs on: a value, read once per
    device (:meth:`GPU.of`), passed to the heuristics that depend on it, and built by hand to
    plan as on another GPU (:func:`plan_as`; tests)::

        H100 = GPU("NVIDIA H100 80GB HBM3", sm_count=132, shared_memory=232448)

    Off CUDA it stands in for the device: the Triton interpreter's CPU tensors and meta
    tensors get ``GPU("", 4, None, device_type="cpu" | "meta", interpreted=...)``.
    """

    name: str
    """``torch.cuda.get_device_name``, e.g. ``"NVIDIA H100 80GB HBM3"``; ``""`` off CUDA."""
    sm_count: int
    """Streaming multiprocessors (grid sizes); 4 for the stand-ins."""
    shared_memory: Optional[int] = None
    """Bytes of shared memory one program may use (the limit Triton checks at launch); None:
    unknown, and nothing is capped by it."""
    device_type: str = "cuda"
    """``"cuda"`` for a GPU; the stand-ins' device type otherwise (``"cpu"``, ``"meta"``)."""
    interpreted: bool = False
    """Whether launches run in the Triton interpreter (TRITON_INTERPRET=1): one program at a
    time, so that programs that wait for each other need bounded waits."""

    @staticmethod
    def of(device: torch.device) -> "GPU":
        """The GPU of ``device`` (a CUDA device's index None: the current one), queried once
        per device and kept; a stand-in off CUDA. Inside :func:`plan_as`, meta and CUDA devices
        give that block's GPU instead."""
        if _plan_as is not None and device.type in ("meta", "cuda"):
            return _plan_as
        if device.type == "cuda":
            return _cuda_gpu(device.index if device.index is not None else torch.cuda.current_device())
        return _stand_in(device.type)

    def named(self, names: tuple[str, ...]) -> bool:
        """Whether a rule naming ``names`` applies to this GPU: it is a CUDA GPU and one of
        ``names`` is its whole name or one of its name's tokens (the name split at spaces,
        hyphens and underscores). So ``"H200"`` names ``"NVIDIA H200"`` and ``"NVIDIA H200 NVL"``
        but not ``"NVIDIA GH200 480GB"`` (whose token is ``"GH200"``), and ``"H100"`` names
        ``"NVIDIA H100 80GB HBM3"`` and ``"NVIDIA H100 PCIe"``. A GPU that no rule names takes
        the rule's fallback, the setting its docstring gives for unmeasured GPUs
        (docs/TUNING.md, "GPU names")."""
        if self.device_type != "cuda":
            return False
        tokens = _tokens(self.name)
        return any(n == self.name or n in tokens for n in names)


@functools.lru_cache(maxsize=None)
def _tokens(name: str) -> frozenset:
    return frozenset(t for t in re.split(r"[\s_-]+", name) if t)


@functools.lru_cache(maxsize=None)
def _cuda_gpu(index: int) -> GPU:
    props = torch.cuda.get_device_properties(index)
    return GPU(torch.cuda.get_device_name(index), props.multi_processor_count, _shared_memory(index, props),
               "cuda", TRITON_INTERPRET)


def _shared_memory(index: int, props) -> Optional[int]:
    """Bytes of shared memory one program may use on the device, the limit Triton checks at
    launch (None if neither Triton nor torch says)."""
    try:
        from triton.runtime.driver import driver

        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # another Triton: torch knows it too (2.4+)
        return getattr(props, "shared_memory_per_block_optin", None)


@functools.lru_cache(maxsize=None)
def _stand_in(device_type: str) -> GPU:
    return GPU("", 4, None, device_type, TRITON_INTERPRET)


# The GPU meta and CUDA tensors are planned for inside plan_as (None: their own).
_plan_as: Optional[GPU] = None


@dataclass(frozen=True)
class LayerNormLaunch:
    """LayerNorm and RMSNorm launch knobs (the fused residual add's too): row limits, chunks,
    tiles, warps, grids and the long-row one-pass forms. Each field's reasons and measurements:
    docs/TUNING.md, "LayerNormLaunch.<field>"."""

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
    # docs/TUNING.md, "LayerNormLaunch.elems_per_thread"
    elems_per_thread: int = 16
    # docs/TUNING.md, "LayerNormLaunch.fwd_warps"
    fwd_warps: Optional[int] = None
    # docs/TUNING.md, "LayerNormLaunch.fwd_4_warps_8192_gpus"
    fwd_4_warps_8192_gpus: tuple[str, ...] = ("H200",)
    # docs/TUNING.md, "LayerNormLaunch.bwd_programs_per_sm"
    bwd_programs_per_sm: int = 2
    bwd_stages: int = 3
    # docs/TUNING.md, "LayerNormLaunch.bwd_reduction_scratch_bytes"
    bwd_reduction_scratch_bytes: int = 16384
    # docs/TUNING.md, "LayerNormLaunch.bwd_tile_bytes"
    bwd_tile_bytes: int = 16384
    # docs/TUNING.md, "LayerNormLaunch.bwd_long_row"
    bwd_long_row: int = 8192
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
    """Softmax launch knobs (plain, causal, masked): row limits, tiles, warps and the causal
    forms. Each field's reasons: docs/TUNING.md, "SoftmaxLaunch.<field>"."""

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
    """Every op's launch knobs, one frozen config an op. Change one knob of one op with
    :meth:`with_knobs` (or :func:`use_knobs` for a ``with`` block); ``dataclasses.replace``
    works too."""

    # docs/TUNING.md, "LaunchConfig.layer_norm"
    layer_norm: LayerNormLaunch = LayerNormLaunch()
    softmax: SoftmaxLaunch = SoftmaxLaunch()
    weighted_sum: WeightedSumLaunch = WeightedSumLaunch()
    coor_descent: CoorDescentLaunch = CoorDescentLaunch()


    def with_knobs(self, op: str, **knobs: Any) -> "LaunchConfig":
        """This config with the ``knobs`` of one ``op`` changed, e.g.
        ``DEFAULT.with_knobs("layer_norm", loop_block=4096)``. ``op`` is a field of
        :class:`LaunchConfig` (``"layer_norm"``, ``"softmax"``, ``"weighted_sum"``,
        ``"coor_descent"``), each knob a field of that op's config; a name that is neither is a
        ``TypeError`` listing the names there are."""
        ops = [f.name for f in dataclasses.fields(self)]
        if op not in ops:
            raise TypeError(f"no op {op!r} in LaunchConfig: one of {ops}")
        cfg = getattr(self, op)
        names = {f.name for f in dataclasses.fields(cfg)}
        unknown = sorted(set(knobs) - names)
        if unknown:
            raise TypeError(f"{type(cfg).__name__} has no knob {', '.join(map(repr, unknown))}: "
                            f"its knobs are {sorted(names)}")
        return dataclasses.replace(self, **{op: dataclasses.replace(cfg, **knobs)})


DEFAULT = LaunchConfig()
"""What every launch uses unless :func:`use_config` or :func:`use_knobs` says otherwise."""


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
"""Every chunked and tiled path at rows of a few dozen elements: for the Triton interpreter
(the CPU tests, ``scripts/sanitize.py --tiny``), not for speed."""


_current = DEFAULT
# Emptied (``.clear()``) whenever the config (or plan_as's GPU) changes: the plan caches of both
# doors, which hold the decisions made under it (kernels/_eager.py: PlanCache).
_on_change: "weakref.WeakSet" = weakref.WeakSet()


def _changed() -> None:
    for cache in list(_on_change):
        cache.clear()


def current() -> LaunchConfig:
    """The config the launches use now (:data:`DEFAULT` unless :func:`use_config` or
    :func:`use_knobs` switched it)."""
    return _current


def _set(config: LaunchConfig) -> None:
    global _current
    if config is not _current:
        _current = config
        _changed()


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


def use_knobs(op: str, **knobs: Any) -> "contextlib.AbstractContextManager[LaunchConfig]":
    """Launch with these ``knobs`` of one ``op`` changed from the current config inside the
    ``with`` block (:meth:`LaunchConfig.with_knobs` under :func:`use_config`)::

        with use_knobs("layer_norm", loop_block=4096) as config:
            ...
    """
    return use_config(current().with_knobs(op, **knobs))


@contextlib.contextmanager
def plan_as(gpu: GPU) -> Iterator[GPU]:
    """Plan the launches of meta and CUDA tensors as on ``gpu`` inside the ``with`` block.

    For planning without the GPU: on meta tensors, ``Op.record_launches`` gives the launches
    ``gpu`` would make, which ``benchmarks/dev/offline.py`` builds for it (registers, spills,
    what compiles). On CUDA tensors the plans are ``gpu``'s and run on the device at hand: a
    smaller GPU's choices run anywhere (less shared memory: fewer stages), a larger one's may
    not launch. CPU tensors (the interpreter) keep their own stand-in. Plans kept are dropped
    on entry and exit.
    """
    global _plan_as
    if not isinstance(gpu, GPU):
        raise TypeError(f"gpu must be a GPU, got {type(gpu).__name__}")
    saved = _plan_as
    _plan_as = gpu
    _changed()
    try:
        yield gpu
    finally:
        _plan_as = saved
        _changed()
