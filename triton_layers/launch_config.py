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

        H100 = GPU("NVIDIA H100 80GB HBM3", sm_count=132, shared_memory=232448, capability=(9, 0))

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
    capability: tuple[int, int] = (0, 0)
    """CUDA compute capability, e.g. ``(9, 0)`` for an H100; ``(0, 0)`` off CUDA or unknown."""

    @property
    def has_pdl(self) -> bool:
        """Whether kernels here can use programmatic dependent launch: a CUDA GPU of compute
        capability 9.0 or newer (Hopper), not the interpreter."""
        return self.device_type == "cuda" and not self.interpreted and self.capability >= (9, 0)

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
               "cuda", TRITON_INTERPRET, (props.major, props.minor))


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
    tiles, warps, grids and the long-row one-pass forms. Each field says what it decides; its
    reasons and measurements: docs/TUNING.md, "LayerNormLaunch.<field>"."""

    fwd_max_fused_cols: int = 32768
    """Longest row (columns) the forward holds whole, reading x once; longer rows are streamed in chunks."""
    fwd_residual_max_fused_cols: int = 32768
    """The same limit for the forward with a fused residual add (x and the residual held at once)."""
    fwd_one_pass: Optional[bool] = None
    """Rows over the forward's limits in one pass (programs holding a row's chunks share their sums) instead of
    reading the row twice: True, False, or None (by fwd_one_pass_gpus)."""
    fwd_one_pass_gpus: tuple[str, ...] = ("H100",)
    """GPUs (names or model tokens) where fwd_one_pass=None takes the one pass without a residual."""
    fwd_residual_one_pass: bool = True
    """Whether the forward with a fused residual add takes the one pass for rows over its limit."""
    fwd_one_pass_block: int = 4096
    """Columns of each chunk of the forward's one pass."""
    fwd_one_pass_max_chunks: int = 64
    """Most chunks a row may have for the forward's one pass (and no more than the SMs)."""
    fwd_one_pass_sm_bytes: int = 32768
    """Bytes of input chunks an SM holds in the forward's one pass: its programs per SM are this over a chunk's
    bytes (at least 1)."""
    fwd_one_pass_ahead: int = 1
    """Rows a program of the forward's one pass publishes ahead of the one it waits for."""
    fwd_one_pass_rms_fp32_ahead: int = 2
    """fwd_one_pass_ahead for RMSNorm of 4-byte inputs."""
    bwd_max_fused_cols: int = 8192
    """Longest row the LayerNorm backward holds whole; longer rows take the two column-split kernels."""
    bwd_residual_max_fused_cols: int = 8192
    """The same limit when the backward also reads h's gradient and writes the residual's."""
    bwd_rms_max_fused_cols: int = 16384
    """The same limit for RMSNorm's backward (no mean, no bias gradient), plain or with the residual."""
    loop_block: int = 8192
    """Columns of a chunk on the long-row paths (forward streaming, backward column split)."""
    tile_elements: int = 2048
    """Elements a program holds per tile when rows are short (several rows to a tile)."""
    max_tile_rows: int = 64
    """Most rows of such a tile (the forward's and the whole-row backward's; the FP8 norms' too)."""
    elems_per_thread: int = 16
    """Elements a thread holds: a program's warps are its tile over 32 times this (capped per kernel)."""
    fwd_warps: Optional[int] = None
    """Warps of a forward program; None: by the tile (the rule in kernels/_layer_norm_rules.py)."""
    fwd_affine_first_programs_per_sm: int = 1
    """LayerNorm's whole-row forward loads its weight and bias before x (not after its reductions) where its grid
    has at most this many programs per SM (0: never; RMSNorm always does)."""
    fp8_tile_elements: int = 8192
    """Elements an FP8 norm program holds (whole rows: as many as fit, at least one)."""
    fp8_elems_per_thread: int = 64
    """Elements a thread of an FP8 norm program holds: its warps are its tile over 32 times this."""
    fp8_small_grid_elems_per_thread: int = 32
    """Elements a thread of an FP8 norm program holds on the GPUs of ``fp8_small_grid_gpus`` where rows of at least
    ``fp8_small_grid_min_cols`` number at most the SMs (decode sizes): one row a program, more warps to it."""
    fp8_small_grid_min_cols: int = 4096
    """Shortest rows the small-grid FP8 launch (``fp8_small_grid_elems_per_thread``) applies to."""
    fp8_small_grid_gpus: tuple[str, ...] = ("H200",)
    """GPUs where the small-grid FP8 launch applies (measured there); others keep the default tile."""
    fp8_layer_norm_8192_tile_elements: int = 16384
    """Elements an FP8 LayerNorm program (no residual) holds at rows of 8,192 on the GPUs of
    ``fp8_layer_norm_8192_gpus``, past the small grid: two rows, 8 warps."""
    fp8_layer_norm_8192_gpus: tuple[str, ...] = ("H200",)
    """GPUs where FP8 LayerNorm's rows of 8,192 take ``fp8_layer_norm_8192_tile_elements`` (measured there)."""
    fp8_amax_parts_max: int = 1024
    """Most programs of a dynamic per-tensor FP8 norm that write an amax each (every program of
    the second launch reads them all); more fold theirs into one zeroed cell (a memset first)."""
    fwd_4_warps_8192_gpus: tuple[str, ...] = ("H200",)
    """GPUs where 2-byte whole rows of 8,192 take 4 warps instead of 16: without a residual, or RMSNorm's with a
    2-byte residual (not LayerNorm's fused add)."""
    bwd_programs_per_sm: int = 2
    """Persistent programs per SM of the short-row backward."""
    bwd_stages: int = 3
    """Loop stages of the short-row backward (tiles of x and dy prefetched while one is reduced)."""
    bwd_reduction_scratch_bytes: int = 16384
    """Shared memory left to a backward program's reductions beside its prefetch buffers (caps the stages)."""
    bwd_tile_bytes: int = 16384
    """Backward tiles whose prefetched loads bring fewer bytes than this get proportionally more programs per
    SM."""
    bwd_long_row: int = 8192
    """Columns above which a whole-row backward block counts as long (its own stages, weight loading and
    programs per SM)."""
    bwd_long_row_stages: int = 1
    """Loop stages of the whole-row backward for long rows."""
    bwd_max_warps: int = 16
    """Most warps of a whole-row backward program."""
    bwd_long_row_weight_per_tile: bool = True
    """Whether long whole rows load the weight per tile instead of holding it (fewer registers)."""
    bwd_long_row_programs_per_sm: int = 1
    """Persistent programs per SM for backward tiles of at least bwd_long_row elements."""
    split_one_pass: bool = True
    """Whether the column-split backward runs in one pass (programs wait for each other's row sums; GPU only)."""
    split_publish_ahead: int = 2
    """Tiles' sums a program of the one-pass split publishes before it waits."""
    split_tile_bytes: int = 32768
    """Bytes of z a column-split tile holds in the one pass (a power of 2 rows, 1 to 8)."""
    split_two_pass_tile_bytes: int = 16384
    """Bytes of z a column-split tile holds in two passes."""
    split_programs_per_sm: int = 2
    """Programs per SM of the column-split backward."""
    split_one_pass_max_chunks: int = 16
    """Most chunks a row may have for the split's one pass."""
    split_one_pass_layer_norm_min_bytes: int = 4
    """LayerNorm takes the split's one pass for inputs of at least this many bytes an element."""
    split_one_pass_layer_norm_max_chunks: int = 2
    """... or, whatever the dtype, for rows of at most this many chunks."""
    split_wait_polls: int = 0
    """Polls of a tile's counter before a one-pass program computes missing chunk sums itself; 0 waits for
    every chunk."""
    partials_programs_per_sm: int = 4
    """Programs per SM summing the parameters' partials (a row per backward program)."""
    partials_tile_elements: int = 2048
    """Partials a program of that sum holds per tile (its column block and writer rows)."""
    partials_warps: int = 4
    """Warps of a program of that sum."""
    fp8_transposed_block_n: int = 64
    """Columns of a program of the FP8 1x128 recipe's transposed-copy launch (its rows: one 128-row block)."""


@dataclass(frozen=True)
class SoftmaxLaunch:
    """Softmax launch knobs (plain, causal, masked): row limits, tiles, warps and the causal
    forms. Each field says what it decides; its reasons: docs/TUNING.md, "SoftmaxLaunch.<field>"."""

    max_fused_cols: int = 32768
    """Longest row held in registers whole (one read); longer rows are streamed."""
    loop_block: int = 4096
    """Columns of a chunk of a streamed row."""
    tile_elements: int = 4096
    """Elements of a (rows x block) tile packing short rows."""
    causal_tile_elements: int = 1024
    """The same for causal rows (smaller tiles: more programs in flight)."""
    max_tile_rows: int = 64
    """Most rows of a causal tile."""
    elems_per_thread: int = 32
    """Elements a thread holds: a program's warps are its tile over 32 times this (at most 32)."""
    causal_prefix_splits: int = 2
    """Causal rows held whole: tiles whose rows all see at most 1/this of the columns compute on that part
    only."""
    causal_class_min_cols: int = 32768
    """Causal rows held whole in blocks of at least this many columns: the forward in two launches, by how much
    of the block a row sees."""
    causal_class_thread_bytes: int = 64
    """Bytes a thread holds in those two launches (their warps by width)."""
    bwd_reload_min_cols: int = 32768
    """Backward rows held whole in blocks of at least this many columns read y and dy twice instead of holding
    both."""


@dataclass(frozen=True)
class WeightedSumLaunch:
    """Weighted-sum launch knobs: 2-D tiles of a (rows x columns) matrix. Each field says what it
    decides; its reasons: docs/TUNING.md, "WeightedSumLaunch.<field>"."""

    tile_bytes: int = 8192
    """Bytes of the input a tile holds."""
    tile_max_cols: int = 2048
    """Widest column block while a tile holds several rows."""
    elems_per_thread: int = 32
    """Elements a thread holds with 16-byte vector accesses (rows 16-element aligned)."""
    unaligned_elems_per_thread: int = 8
    """Elements a thread holds with scalar accesses (rows not so aligned)."""
    fwd_programs_per_sm: int = 8
    """Programs per SM of the forward."""
    bwd_programs_per_sm: int = 4
    """Programs per SM of the backward."""
    fwd_stages: Optional[int] = 2
    """Pipelining stages of the forward's column loop (None: Triton's default)."""
    bwd_stages: Optional[int] = 2
    """Pipelining stages of the backward's row loop (None: Triton's default)."""
    fwd_tile_bytes_4byte: int = 16384
    """tile_bytes of the forward for inputs of 4 bytes an element."""
    fwd_stages_4byte: Optional[int] = None
    """fwd_stages for inputs of 4 bytes an element."""
    reduce_block: int = 1024
    """Rows per program of the kernel adding the forward's column-range partial sums."""
    reduce_warps: int = 4
    """Warps of a program of that kernel."""
    bwd_two_pass_min_bytes: int = 64 << 20
    """Backwards of inputs of at least this many bytes asking for dx and dw take two passes (dx, then dw)."""
    bwd_dw_stages: Optional[int] = 3
    """Pipelining stages of the two-pass backward's dw pass."""


@dataclass(frozen=True)
class CoorDescentLaunch:
    """coor_descent launch knobs: the op is bound by its chain of n_iters row reductions, not
    by bytes. Each field says what it decides; its reasons:
    docs/TUNING.md, "CoorDescentLaunch.<field>"."""

    max_fused_cols: int = 32768
    """Longest row held in registers whole; longer rows are streamed, each iteration reading the row again."""
    loop_block: int = 4096
    """Columns of a chunk of a streamed row (and the most of a backward chunk)."""
    fwd_elems_per_thread: int = 8
    """Elements a forward thread holds (warps = block over 32 times this)."""
    fwd_max_warps: int = 16
    """Most warps of a forward program (one program a row)."""
    bwd_elems_per_thread: int = 8
    """Elements a backward thread holds (one program a chunk)."""
    split_min_block: int = 256
    """Fewest columns of a backward chunk."""
    split_programs_per_sm: int = 1
    """Backward programs per SM the row split aims at."""


@dataclass(frozen=True)
class LaunchConfig:
    """Every op's launch knobs, one frozen config an op. Change one knob of one op with
    :meth:`with_knobs` (or :func:`use_knobs` for a ``with`` block); ``dataclasses.replace``
    works too."""

    layer_norm: LayerNormLaunch = LayerNormLaunch()
    """The norms' knobs (LayerNorm and RMSNorm, with or without the residual)."""
    softmax: SoftmaxLaunch = SoftmaxLaunch()
    """The softmax's knobs (plain, causal, masked)."""
    weighted_sum: WeightedSumLaunch = WeightedSumLaunch()
    """The weighted sum's knobs."""
    coor_descent: CoorDescentLaunch = CoorDescentLaunch()
    """coor_descent's knobs."""
    pdl: bool = os.environ.get("TRITON_LAYERS_PDL", "1") != "0"
    """Programmatic dependent launch for every kernel of ours where the GPU has it (``GPU.has_pdl``;
    :func:`pdl_for`): each waits for the kernel before it, then lets the next launch. Off with
    TRITON_LAYERS_PDL=0 in the environment (read at import: for a debugger or a profiler that must
    see launches as they were) or ``use_config(dataclasses.replace(current(), pdl=False))``."""


    def with_knobs(self, op: str, **knobs: Any) -> "LaunchConfig":
        """This config with the ``knobs`` of one ``op`` changed, e.g.
        ``DEFAULT.with_knobs("layer_norm", loop_block=4096)``. ``op`` is a field of
        :class:`LaunchConfig` (``"layer_norm"``, ``"softmax"``, ``"weighted_sum"``,
        ``"coor_descent"``), each knob a field of that op's config; a name that is neither is a
        ``TypeError`` listing the names there are."""
        ops = [f.name for f in dataclasses.fields(self) if dataclasses.is_dataclass(getattr(self, f.name))]
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
    """DEFAULT with every row limit (each op's knobs named ``*max_fused_cols``) at ``max_cols``
    and every chunk (``loop_block``, ``fwd_one_pass_block``) at ``loop_block`` columns, so that
    rows longer than ``max_cols`` take the chunked paths; the softmax's tiles
    (``tile_elements``, ``causal_tile_elements``) at ``softmax_tile_elements``. Read off the
    fields' names: a knob added under those names is shrunk too."""

    def shrink(cfg, tiles: bool):
        changes = {}
        for f in dataclasses.fields(cfg):
            if f.name.endswith("max_fused_cols"):
                changes[f.name] = max_cols
            elif f.name in ("loop_block", "fwd_one_pass_block"):
                changes[f.name] = loop_block
            elif tiles and f.name in ("tile_elements", "causal_tile_elements"):
                changes[f.name] = softmax_tile_elements
        return dataclasses.replace(cfg, **changes)

    return dataclasses.replace(DEFAULT, **{f.name: shrink(getattr(DEFAULT, f.name), f.name == "softmax")
                                           for f in dataclasses.fields(LaunchConfig)
                                           if dataclasses.is_dataclass(getattr(DEFAULT, f.name))})


# Rows over 16 columns take the chunked paths (8-column chunks), and weighted-sum tiles
# hold 512 bytes (column loops, column splits, several partial rows on small inputs), its
# backward in two passes from 4 KB: small enough for the Triton interpreter on the CPU.
TINY = dataclasses.replace(
    shrunk(16, 8), weighted_sum=dataclasses.replace(DEFAULT.weighted_sum, tile_bytes=512, tile_max_cols=32,
                                                    bwd_two_pass_min_bytes=4096))
"""Every chunked and tiled path at rows of a few dozen elements: for the Triton interpreter
(the CPU tests, ``scripts/sanitize.py --tiny``), not for speed."""


_current = DEFAULT
# What on_change registered: emptied (``.clear()``) whenever the config (or plan_as's GPU)
# changes. Weakly held: a cache that goes away leaves the set by itself.
_on_change: "weakref.WeakSet" = weakref.WeakSet()


def on_change(cache) -> None:
    """Register ``cache`` (anything with ``clear()``, hashable by identity) to be emptied
    whenever the launch config or :func:`plan_as`'s GPU changes, and by
    :func:`changed`: a cache of decisions made under the config (the plan caches of both
    doors, calls/eager.py ``PlanCache``). Held weakly."""
    _on_change.add(cache)


def changed() -> None:
    """Empty every cache registered with :func:`on_change` (the next call of each signature
    plans anew): what a change of the config does, for tools that change what plans read
    some other way."""
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
        changed()


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


def pdl_for(gpu: GPU) -> bool:
    """Whether launches on ``gpu`` use programmatic dependent launch: the current config's
    ``pdl`` and the GPU's ``has_pdl``."""
    return _current.pdl and gpu.has_pdl


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
    changed()
    try:
        yield gpu
    finally:
        _plan_as = saved
        changed()
