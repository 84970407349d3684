"""Common benchmark harness: a bench file declares its cases, ``run_cases`` measures them.

A bench file (``bench_layernorm.py``, ...) is a module with

- ``OP``: its name (the CSV is ``<OP>.csv``);
- ``cases(opts)``: the case keys of a run, in order (``dtype_shape_cases``: dtype x shape);
- ``implementations(opts)``: ours and the peers, name -> callable;
- ``build(key, device) -> Case``: allocates one case's inputs and says what to time: its
  ``Direction`` s (``fwd_bwd`` makes the usual forward + backward pair), each a bytes model
  and a ``make(impl)`` that returns the call to time.
- ``PART`` (a literal dict), to be a part of ``python -m benchmarks``: its order, its ops with
  their report titles, notes, measure and kernel ops (``benchmarks/parts.py``), from which the
  run's ``--ops``, the report, the plots and ``benchmarks.dev.registers`` take it.

A bench of several ops (``bench_norms.py``: RMSNorm, and the fused add + RMSNorm or
LayerNorm) names the op of each case (``Case.op``: the rows' op, ``OP`` names the CSV), and
an implementation is then op -> callable: it times the cases of the ops it has.
A launch-config sweep is a bench whose cases each run under one config (``under_config``).

``run_cases`` is the one loop: for every case, every implementation and every direction
it times the eager call and the GPU time of the same call, then frees the case. It plays
the role of ``triton.testing.perf_report`` (x values = cases, lines = implementations) and
of Liger's ``run_benchmarks``.

Each measurement has two times (see ``Result``): ``us``, the eager call as the host issues
it (``do_bench`` median: host-bound when the kernels take less than ~150 us), and
``gpu_us``, the GPU time of the same call: a CUDA graph of the call replayed under the same
``do_bench`` protocol, or, where the call cannot be captured (a peer that syncs), the sum of
its kernel times from ``torch.profiler``; ``gpu_method`` says which. The bytes model over
``gpu_us`` gives GB/s and the % of a device-to-device copy measured in the same run.
GPU only; the CPU dry run of the tests patches the timers.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import os
import statistics
import sys
from types import ModuleType
from typing import Callable, Iterable, Optional

import torch
import triton

from triton_layers import launch_config

NAN = float("nan")
L2_FLUSH_BYTES = 256 * 2**20  # as do_bench's cache flush
FLUSH_LABEL = "harness:l2-flush"


@dataclasses.dataclass
class Result:
    """One measurement: a CSV row (``write_csv``) and a table cell (``print_table``)."""

    op: str
    shape: str
    dtype: str
    direction: str
    impl: str
    us: float  # eager call, median microseconds (do_bench); nan if the peer failed
    gpu_us: float  # GPU time of the same call (see gpu_method); nan if not measured
    gpu_method: str  # "graph" (CUDA-graph replay), "profiler" (kernel-time sum) or "" (none)
    gbps: float  # bytes model / gpu_us
    pct_copy: float  # gbps / copy bandwidth of this run
    peak_mib: float = NAN  # peak extra memory, where measured
    # with --repeats N > 1: gpu_us is the median of N GPU timings (the implementations taking
    # turns, run_cases), these their min and max; nan with one timing
    gpu_us_min: float = NAN
    gpu_us_max: float = NAN


@dataclasses.dataclass
class Direction:
    """One thing to time at a case: ``make(impl)`` returns the call (run after a fresh make)."""

    name: str  # the CSV's direction: fwd, bwd, fwd+bwd
    nbytes: int  # the bytes model: minimal bytes read and written
    make: Callable[[Callable], Callable[[], object]]
    grad_to_none: list = dataclasses.field(default_factory=list)  # gradients reset before each call
    memory: bool = False  # also record the call's peak extra memory


@dataclasses.dataclass
class Case:
    """One shape and dtype of a bench: its inputs live in the ``directions``' closures."""

    shape: str  # as in the CSV, e.g. 32768x1024
    dtype: torch.dtype
    directions: list[Direction]
    # Called as check(impl, output of the first direction's call, run under no_grad): warns on a
    # wrong answer (the timing goes on).
    check: Optional[Callable[[str, object], None]] = None
    # The op of the case's rows where the bench times several (its implementations are then
    # op -> callable); "" for the bench's OP.
    op: str = ""


# Called with a label when a benchmark case starts (run_all draws a progress bar with it).
Progress = Callable[[str], None]


def no_progress(label: str) -> None:
    """The Progress of a script run alone: it prints its tables at the end instead."""


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every benchmark takes (the single scripts and ``python -m benchmarks``)."""
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--out", default=None,
                        help="folder for the CSVs (default: benchmarks/results/<gpu>, e.g. h100, h200, "
                             "from the device name)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile peers")
    parser.add_argument("--only", default=None,
                        help="comma-separated op names (the CSV's op column): time these tables alone (a part too "
                             "long for one sitting, run in pieces)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="GPU timings per cell, the implementations of a case taking turns (ABBA): the "
                             "median and the min-max in the CSV (calls of a few us differ between timings by "
                             "more than between implementations)")
    return parser


def parse_args(description: str, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """A single benchmark script's options."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_common_args(parser).parse_args(argv)


def results_dir(opts: argparse.Namespace) -> str:
    """``--out``, else benchmarks/results/<gpu> (h100, h200, ... from the CUDA device name)."""
    if opts.out:
        return opts.out
    from benchmarks.report import gpu_folder

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", gpu_folder(device_name()))


def dtypes(opts: argparse.Namespace) -> list[torch.dtype]:
    """The torch dtypes named by ``opts.dtypes`` (comma-separated), e.g. bfloat16,float32."""
    return [getattr(torch, name.strip()) for name in opts.dtypes.split(",") if name.strip()]


def dtype_shape_cases(opts: argparse.Namespace, shapes: list, quick_shapes: list) -> list[tuple[torch.dtype, tuple]]:
    """Every (dtype, shape) pair of a run, dtype-major: the shapes, or the quick ones."""
    return [(dtype, shape) for dtype in dtypes(opts) for shape in (quick_shapes if opts.quick else shapes)]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, as in the CSVs."""
    return str(dtype).replace("torch.", "")


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of a floating dtype (the s of the bytes models)."""
    return torch.finfo(dtype).bits // 8


def device() -> torch.device:
    """Where the benchmarks allocate their tensors (a function so a CPU dry run can patch it)."""
    return torch.device("cuda")


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU (none is visible to torch here)")
    return torch.device("cuda")


def device_name() -> str:
    """The CUDA device's name for table titles ("cpu" on the CPU dry run)."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else str(device())


def gpu_timeline() -> bool:
    """Whether there is a GPU timeline to measure (gpu_us); False on the CPU dry run."""
    return device().type == "cuda"


# --------------------------------------------------------------------------- the cases


def backward_call(y, dy, inputs: list) -> Callable[[], object]:
    """The backward of an output ``y`` with ``dy``, or of a tuple of outputs with a tuple of
    their gradients, to the gradients of ``inputs`` (graph kept for the next call).

    ``torch.autograd.grad``, not ``backward``: a leaf's ``.grad`` takes a gradient tensor as it
    is only when nothing else holds it, and the fused add + norm (ours, torch's ``x + r``,
    Liger's) hands one tensor to both x and the residual, so ``backward`` timed a copy of it
    (2 of the backward's 4 M*D bytes) that no model pays: there x and the residual are not
    leaves, and their gradients flow on through the graph."""
    return lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True)


def fwd_bwd(call: Callable[[Callable], object], dy, inputs: list,
            fwd_bytes: int, bwd_bytes: int) -> list[Direction]:
    """The forward ``call(impl)`` and the backward of its output with ``dy`` (of its outputs
    with a tuple of gradients: the fused add + norm's (y, h)) to the gradients of ``inputs``;
    the backward's make runs the forward once."""
    return [
        Direction("fwd", fwd_bytes, lambda impl: (lambda: call(impl))),
        Direction("bwd", bwd_bytes, lambda impl: backward_call(call(impl), dy, inputs)),
    ]


def under_config(case: Case, config: launch_config.LaunchConfig, label: str) -> Case:
    """``case`` with each direction's call, and the forward a backward's make runs, under the
    launch ``config`` (``launch_config.use_config`` around each), its shape followed by ``label``:
    a case of a launch-config sweep (``bench_norms --sweep-row-limits``, ``benchmarks/dev/tuning.py``)."""

    def configured(make: Callable[[Callable], Callable[[], object]]) -> Callable[[Callable], Callable[[], object]]:
        def made(impl: Callable) -> Callable[[], object]:
            with launch_config.use_config(config):
                fn = make(impl)

            def call() -> object:
                with launch_config.use_config(config):
                    return fn()
            return call
        return made

    directions = [dataclasses.replace(d, make=configured(d.make)) for d in case.directions]
    return dataclasses.replace(case, shape=f"{case.shape} {label}", directions=directions)


def _reset(grads: Optional[list]) -> None:
    for t in grads or ():
        t.grad = None


def run_cases(bench: ModuleType, opts: argparse.Namespace, copy_gbps: float,
              progress: Progress = no_progress) -> list[Result]:
    """Time every implementation of ``bench`` at every case and direction; returns the Results.

    A peer that fails a direction (e.g. an unsupported shape) gets a nan row there and for
    its later directions of that case (a backward cannot run without its forward). Where
    implementations are op -> callable, a case runs those that have its op (``Case.op``).
    With ``opts.repeats`` > 1, each cell's GPU time is taken that many times, in rounds over the
    case's cells (:func:`repeat_gpu_times`)."""
    impls = bench.implementations(opts)
    only = set(opts.only.split(",")) if getattr(opts, "only", None) else None
    results: list[Result] = []
    for key in bench.cases(opts):
        case = bench.build(key, device())
        op = case.op or bench.OP
        if only is not None and op not in only:
            continue
        progress(f"{op} {case.shape} {dtype_name(case.dtype)}")
        cells = []  # (Result, make, direction) of this case
        for name, impl in impls.items():
            if isinstance(impl, dict):  # one callable per op: a peer without this op has no row
                if op not in impl:
                    continue
                impl = impl[op]
            failed = False
            for k, direction in enumerate(case.directions):
                check = case.check if k == 0 else None
                make = (lambda direction=direction, impl=impl: direction.make(impl))
                res = measure(op, case, direction, name, make, copy_gbps, opts.quick, skip=failed, check=check)
                failed = failed or res.us != res.us
                cells.append((res, make, direction))
            for direction in case.directions:
                _reset(direction.grad_to_none)
        results += repeat_gpu_times(cells, getattr(opts, "repeats", 1), copy_gbps)
        del case, cells
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def repeat_gpu_times(cells: list[tuple[Result, Callable[[], Callable[[], object]], "Direction"]], repeats: int,
                     copy_gbps: float) -> list[Result]:
    """The cells' Results, each with ``repeats`` GPU timings in all: after the first (``measure``'s),
    ``repeats - 1`` rounds over the cells that have a GPU time, in reverse order every other round
    (A B B A ...: no cell always runs right after another), quick timings. Each Result's GPU time
    becomes the median, with the min and max, and its GB/s and % of copy follow the median."""
    timed = [c for c in cells if c[0].gpu_us == c[0].gpu_us]
    if repeats <= 1 or not timed:
        return [c[0] for c in cells]
    times = {id(res): [res.gpu_us] for res, _, _ in timed}
    for k in range(1, repeats):
        for res, make, direction in (timed if k % 2 == 0 else timed[::-1]):
            times[id(res)].append(gpu_time_us(make, direction.grad_to_none, quick=True)[0])
            _reset(direction.grad_to_none)
    out = []
    for res, _, direction in cells:
        t = [x for x in times.get(id(res), ()) if x == x]
        if t:
            mid = statistics.median(t)
            gbps = direction.nbytes / mid / 1e3 if mid > 0 else NAN
            res = dataclasses.replace(res, gpu_us=mid, gbps=gbps, pct_copy=100 * gbps / copy_gbps,
                                      gpu_us_min=min(t), gpu_us_max=max(t))
        out.append(res)
    return out


def measure(op: str, case: Case, direction: Direction, impl: str, make: Callable[[], Callable[[], object]],
            copy_gbps: float, quick: bool = False, skip: bool = False,
            check: Optional[Callable[[str, object], None]] = None) -> Result:
    """One Result: the eager time of ``make()``'s call, its GPU time and, if asked, its peak memory."""
    fn = None if skip else try_peer(make)
    if fn is None:
        return Result(op, case.shape, dtype_name(case.dtype), direction.name, impl, NAN, NAN, "", NAN, NAN)
    if check is not None:
        with torch.no_grad():
            check(impl, fn())
    us = time_us(fn, direction.grad_to_none, quick)
    peak = NAN
    if direction.memory:
        _reset(direction.grad_to_none)
        peak = peak_memory_mib(fn)
    del fn  # the GPU timing makes its own call (a backward: its own forward output)
    _reset(direction.grad_to_none)
    gpu_us, method = gpu_time_us(make, direction.grad_to_none, quick)
    gbps = direction.nbytes / gpu_us / 1e3 if gpu_us > 0 else NAN
    return Result(op, case.shape, dtype_name(case.dtype), direction.name, impl, us, gpu_us, method, gbps,
                  100 * gbps / copy_gbps, peak)


def try_peer(make: Callable[[], Callable[[], object]]) -> Optional[Callable[[], object]]:
    """Build a peer's callable and run it once; None if it fails (e.g. unsupported shape)."""
    try:
        fn = make()
        fn()
        torch.cuda.synchronize()
        return fn
    except Exception as exc:  # a peer refusing a shape is a result, not a crash
        print(f"    peer failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}",
              file=sys.stderr)
        torch.cuda.synchronize()
        return None


# --------------------------------------------------------------------------- timing


def time_us(fn: Callable[[], object], grad_to_none: Optional[list] = None, quick: bool = False) -> float:
    """Median time of ``fn`` in microseconds (CUDA events via do_bench, L2 flushed before each call)."""
    ms = triton.testing.do_bench(
        fn, warmup=10 if quick else 25, rep=30 if quick else 100,
        grad_to_none=grad_to_none, return_mode="median",
    )
    return ms * 1e3


def gpu_time_us(make: Callable[[], Callable[[], object]], grad_to_none: Optional[list] = None,
                quick: bool = False) -> tuple[float, str]:
    """(GPU microseconds, method) of the call ``make()`` returns: "graph" (``graph_replay_us``),
    else "profiler" (``profiled_kernel_us``) when the call cannot be captured, else (nan, "")."""
    if not gpu_timeline():
        return NAN, ""
    if _capture.usable:
        try:
            return graph_replay_us(make, grad_to_none, quick), "graph"
        except Exception as exc:  # e.g. a peer that syncs inside the call
            print(f"    not capturable in a CUDA graph ({type(exc).__name__}: {str(exc).splitlines()[0][:100]}): "
                  "profiler kernel time instead", file=sys.stderr)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    try:
        return profiled_kernel_us(make, grad_to_none, quick), "profiler"
    except Exception as exc:
        print(f"    profiler failed too ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})", file=sys.stderr)
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return NAN, ""


class _capture:
    """Whether CUDA-graph captures are still safe in this process (see ``_end_failed_capture``)."""

    usable = True


def _end_failed_capture(pool) -> None:
    """The allocator's side of a capture whose ``capture_end`` failed: torch leaves the capture
    listed as underway (the next ``empty_cache`` then fails an internal assert) and its pool
    held. End allocating to the pool and release it (private torch calls, where they exist);
    if the allocator is still unhealthy, take no more captures in this process."""
    device = torch.cuda.current_device()
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    with contextlib.suppress(Exception):
        end(device, pool)
    with contextlib.suppress(Exception):
        release(device, pool)
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as exc:
        _capture.usable = False
        print(f"    the allocator did not recover from a failed capture ({type(exc).__name__}); "
              "profiler kernel times from here on", file=sys.stderr)


def graph_replay_us(make: Callable[[], Callable[[], object]], grad_to_none: Optional[list] = None,
                    quick: bool = False) -> float:
    """The call captured in a CUDA graph, its replay timed as ``time_us`` times the eager call.

    The call is made, warmed up and captured on a side stream (so a backward's forward ran on
    the capture stream and its backward is captured there too); gradients are reset before
    the capture, so a replay allocates-and-writes them as the timed eager call does. A call
    that synchronizes with the host raises before any capture begins (the first warm-up call
    runs under the sync debug mode "error"); one that fails during the capture is cleaned up
    after (``_end_failed_capture``)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn = make()
        _reset(grad_to_none)
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        for _ in range(2):
            _reset(grad_to_none)
            fn()
        _reset(grad_to_none)
        torch.cuda.synchronize()
        graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
        graph.capture_begin(pool=pool)
        try:
            fn()
        finally:
            try:
                graph.capture_end()
            except Exception:
                _end_failed_capture(pool)
                raise
    torch.cuda.current_stream().wait_stream(stream)
    try:
        return time_us(graph.replay, quick=quick)
    finally:
        _reset(grad_to_none)
        del graph, fn


def profiled_kernel_us(make: Callable[[], Callable[[], object]], grad_to_none: Optional[list] = None,
                       quick: bool = False) -> float:
    """Mean GPU time per call of the call ``make()`` returns: the summed durations of its
    kernels (and memcpy/memset) in ``torch.profiler`` over several calls, each after an L2
    flush as in ``time_us`` (the flush's own kernels are left out); host gaps do not count."""
    fn = make()
    calls = 5 if quick else 20
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device())
    for _ in range(2):
        _reset(grad_to_none)
        fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            with torch.profiler.record_function(FLUSH_LABEL):
                flush.zero_()
            _reset(grad_to_none)
            fn()
        torch.cuda.synchronize()
    _reset(grad_to_none)
    return device_activity(prof.events(), exclude=FLUSH_LABEL)[0] / calls


# Activity types of GPU work in a profile (torch >= 2.12 names them; older: all but annotations).
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
# Host calls that launch GPU work (a kernel or a whole CUDA graph).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch")


def _is_gpu_work(event) -> bool:
    if event.device_type == torch.autograd.DeviceType.CPU or getattr(event, "is_user_annotation", False):
        return False
    kind = getattr(event, "activity_type", None)
    return kind in GPU_WORK if kind else True


def _is_kernel(event) -> bool:
    kind = getattr(event, "activity_type", None)
    return kind == "kernel" if kind else not event.name.startswith(("Memcpy", "Memset"))


def device_activity(events: Iterable, exclude: str = "") -> tuple[float, int, int]:
    """(GPU microseconds, kernels, host launch calls) in a profile's ``events`` (``prof.events()``).

    GPU microseconds sum the kernels, memcpys and memsets (not annotations); the work launched
    inside ``record_function(exclude)`` ranges is subtracted from that time. Kernels counts
    kernel events (a CUDA graph's kernels each count); host launch calls count the runtime calls
    that launch a kernel or a graph (a graph replay is one)."""
    us, kernels, launches, excluded = 0.0, 0, 0, 0.0
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU:
            if exclude and event.name == exclude:
                excluded += event.device_time_total
            elif event.name in LAUNCH_CALLS:
                launches += 1
        elif _is_gpu_work(event):
            us += event.time_range.elapsed_us()
            kernels += _is_kernel(event)
    return us - excluded, kernels, launches


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy: bytes read + written per second, in GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / us / 1e3


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Peak memory allocated while ``fn`` runs, above what was allocated before, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


# --------------------------------------------------------------------------- output


def _cell(r: Result) -> str:
    if r.gpu_us == r.gpu_us:
        star = "*" if r.gpu_method == "profiler" else ""
        eager = f"; eager {r.us:.0f}" if r.us == r.us else ""
        return f"{r.gpu_us:.0f}{star} us, {r.gbps:.0f} ({r.pct_copy:.0f}%){eager}"
    return f"eager {r.us:.0f} us" if r.us == r.us else ""


def print_table(results: Iterable[Result], impls: list[str], title: str, copy_gbps: float) -> str:
    """Markdown table: one line per (shape, dtype, direction), one column per impl."""
    results = list(results)
    lines = [f"## {title}", "", f"copy bandwidth measured in this run: {copy_gbps:.0f} GB/s; each cell: GPU time "
             "(CUDA-graph replay; * = profiler kernel sum), GB/s (% of copy); eager call time", ""]
    lines.append("| shape | dtype | dir | " + " | ".join(impls) + " |")
    lines.append("|---|---|---|" + "---|" * len(impls))
    index = {(r.shape, r.dtype, r.direction, r.impl): r for r in results}
    for key in dict.fromkeys((r.shape, r.dtype, r.direction) for r in results):
        cells = [_cell(index[key + (impl,)]) if key + (impl,) in index else "" for impl in impls]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return emit(lines)


def emit(lines: list[str]) -> str:
    """Print a table's lines and return them as one text."""
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_csv(results: Iterable, path: str) -> None:
    """Write dataclass rows (Results) as CSV under a header of their field names (makes the folder)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    results = list(results)
    row_type = type(results[0]) if results else Result  # any dataclass rows (train_step has its own)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([field.name for field in dataclasses.fields(row_type)])
        for r in results:
            writer.writerow(dataclasses.astuple(r))


def run_alone(bench: ModuleType, after: Optional[Callable[[argparse.Namespace, list], object]] = None,
              argv: Optional[list[str]] = None) -> None:
    """``main()`` of a single bench file: measure the copy bandwidth, run its cases, print a
    table per op (and ``after(opts, results)``'s extra tables), write ``<out>/<OP>.csv``."""
    opts = parse_args(bench.__doc__, argv)
    copy = copy_bandwidth_gbps(require_cuda())
    results = run_cases(bench, opts, copy)
    for op in dict.fromkeys(r.op for r in results):
        rows = [r for r in results if r.op == op]
        print_table(rows, list(dict.fromkeys(r.impl for r in rows)), f"{op} on {device_name()}", copy)
    if after is not None:
        after(opts, results)
    write_csv(results, os.path.join(results_dir(opts), f"{bench.OP}.csv"))


def raise_recompile_limits() -> None:
    """Let dynamo recompile one function many times (every shape of a sweep, every variant of a
    training step) instead of silently falling back to eager after 8."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    if hasattr(torch._dynamo.config, "accumulated_recompile_limit"):
        torch._dynamo.config.accumulated_recompile_limit = 4096


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=False)``, the compile peer everywhere (each benchmarked shape
    is a recompile)."""
    raise_recompile_limits()
    return torch.compile(fn, dynamic=False)
