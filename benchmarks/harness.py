"""Common benchmark harness: a bench file declares its cases, ``run_cases`` measures them.

A bench file (``bench_layernorm.py``, ...) is a module with

- ``OP``: its name (the CSV is ``<OP>.csv``);
- ``cases(opts)``: the case keys of a run, in order (``dtype_shape_cases``: dtype x shape);
- ``implementations(opts)``: ours and the peers, name -> callable;
- ``build(key, device) -> Case``: allocates one case's inputs and says what to time: its
  ``Direction`` s (``fwd_bwd`` makes the usual forward + backward pair), each a bytes model
  and a ``make(impl)`` that returns the call to time.

``run_cases`` is the one loop: for every case, every implementation and every direction
it times the call, then frees the case. It plays the role of ``triton.testing.perf_report``
(x values = cases, lines = implementations) and of Liger's ``run_benchmarks``.

Every figure is the op's minimal bytes (its bytes model: each input read once, each
output written once) over the median time from ``triton.testing.do_bench``, and the
same as a percentage of a device-to-device copy measured in the same run. Peers run in
the same process on the same inputs. GPU only.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
from types import ModuleType
from typing import Callable, Iterable, Optional

import torch
import triton

NAN = float("nan")


@dataclasses.dataclass
class Result:
    """One measurement: a CSV row (``write_csv``) and a table cell (``print_table``)."""

    op: str
    shape: str
    dtype: str
    direction: str
    impl: str
    us: float  # median microseconds; nan if the peer failed
    gbps: float  # bytes model / time
    pct_copy: float  # gbps / copy bandwidth of this run
    peak_mib: float = float("nan")  # peak extra memory, where measured


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


# Called with a label when a benchmark case starts (run_all draws a progress bar with it).
Progress = Callable[[str], None]


def no_progress(label: str) -> None:
    """The Progress of a script run alone: it prints its tables at the end instead."""


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every benchmark takes (the single scripts and ``python -m benchmarks``)."""
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"), help="CSV folder")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile peers")
    return parser


def parse_args(description: str, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """A single benchmark script's options."""
    return add_common_args(argparse.ArgumentParser(description=description)).parse_args(argv)


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


# --------------------------------------------------------------------------- the cases


def backward_call(y: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    """The backward of an output ``y`` with ``dy`` (graph kept for the next call)."""
    return lambda: y.backward(dy, retain_graph=True)


def fwd_bwd(call: Callable[[Callable], torch.Tensor], dy: torch.Tensor, inputs: list,
            fwd_bytes: int, bwd_bytes: int) -> list[Direction]:
    """The forward ``call(impl)`` and the backward of its output with ``dy`` (the gradients
    of ``inputs`` reset before each backward); the backward's make runs the forward once."""
    return [
        Direction("fwd", fwd_bytes, lambda impl: (lambda: call(impl))),
        Direction("bwd", bwd_bytes, lambda impl: backward_call(call(impl), dy), grad_to_none=inputs),
    ]


def _reset(grads: Optional[list]) -> None:
    for t in grads or ():
        t.grad = None


def run_cases(bench: ModuleType, opts: argparse.Namespace, copy_gbps: float,
              progress: Progress = no_progress) -> list[Result]:
    """Time every implementation of ``bench`` at every case and direction; returns the Results.

    A peer that fails a direction (e.g. an unsupported shape) gets a nan row there and for
    its later directions of that case (a backward cannot run without its forward)."""
    impls = bench.implementations(opts)
    results: list[Result] = []
    for key in bench.cases(opts):
        case = bench.build(key, device())
        progress(f"{bench.OP} {case.shape} {dtype_name(case.dtype)}")
        for name, impl in impls.items():
            failed = False
            for k, direction in enumerate(case.directions):
                check = case.check if k == 0 else None
                res = measure(bench.OP, case, direction, name, lambda: direction.make(impl), copy_gbps,
                              opts.quick, skip=failed, check=check)
                failed = failed or res.us != res.us
                results.append(res)
            for direction in case.directions:
                _reset(direction.grad_to_none)
        del case
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def measure(op: str, case: Case, direction: Direction, impl: str, make: Callable[[], Callable[[], object]],
            copy_gbps: float, quick: bool = False, skip: bool = False,
            check: Optional[Callable[[str, object], None]] = None) -> Result:
    """One Result: the time of ``make()``'s call and, if asked, its peak memory."""
    fn = None if skip else try_peer(make)
    if fn is None:
        return Result(op, case.shape, dtype_name(case.dtype), direction.name, impl, NAN, NAN, NAN)
    if check is not None:
        with torch.no_grad():
            check(impl, fn())
    us = time_us(fn, direction.grad_to_none, quick)
    gbps = direction.nbytes / us / 1e3
    res = Result(op, case.shape, dtype_name(case.dtype), direction.name, impl, us, gbps, 100 * gbps / copy_gbps)
    if direction.memory:
        _reset(direction.grad_to_none)
        res.peak_mib = peak_memory_mib(fn)
    return res


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


def print_table(results: Iterable[Result], impls: list[str], title: str, copy_gbps: float) -> str:
    """Markdown table: one line per (shape, dtype, direction), one column per impl."""
    results = list(results)
    lines = [f"## {title}", "", f"copy bandwidth measured in this run: {copy_gbps:.0f} GB/s", ""]
    lines.append("| shape | dtype | dir | " + " | ".join(impls) + " |")
    lines.append("|---|---|---|" + "---|" * len(impls))
    keys = []
    for r in results:
        key = (r.shape, r.dtype, r.direction)
        if key not in keys:
            keys.append(key)
    for key in keys:
        cells = []
        for impl in impls:
            match = [r for r in results if (r.shape, r.dtype, r.direction) == key and r.impl == impl]
            if not match or match[0].us != match[0].us:
                cells.append("")
            elif match[0].gbps == match[0].gbps:
                cells.append(f"{match[0].us:.0f} us, {match[0].gbps:.0f} ({match[0].pct_copy:.0f}%)")
            else:
                cells.append(f"{match[0].us:.0f} us")
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
    """``main()`` of a single bench file: measure the copy bandwidth, run its cases, print the
    table (and ``after(opts, results)``'s extra tables), write ``<out>/<OP>.csv``."""
    opts = parse_args(bench.__doc__, argv)
    copy = copy_bandwidth_gbps(require_cuda())
    results = run_cases(bench, opts, copy)
    impls = list(dict.fromkeys(r.impl for r in results))
    print_table(results, impls, f"{bench.OP} on {device_name()}", copy)
    if after is not None:
        after(opts, results)
    write_csv(results, os.path.join(opts.out, f"{bench.OP}.csv"))


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=False)``, the compile peer everywhere.

    Each benchmarked shape is a recompile; the limit is raised so that the peer stays
    compiled across a whole sweep instead of silently falling back to eager after 8.
    """
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    if hasattr(torch._dynamo.config, "accumulated_recompile_limit"):
        torch._dynamo.config.accumulated_recompile_limit = 4096
    return torch.compile(fn, dynamic=False)
