"""Common benchmark harness: timing, the copy-bandwidth ceiling, tables and CSV.

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
from typing import Callable, Iterable, Optional

import torch
import triton


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


def run_alone(op: str, description: str, run: Callable[..., list],
              after: Optional[Callable[[argparse.Namespace, list], object]] = None) -> None:
    """``main()`` of a single benchmark script: measure the copy bandwidth, ``run``, print
    the table (and ``after(opts, results)``'s extra tables), write ``<out>/<op>.csv``."""
    opts = parse_args(description)
    copy = copy_bandwidth_gbps(require_cuda())
    results = run(opts, copy)
    impls = list(dict.fromkeys(r.impl for r in results))
    print_table(results, impls, f"{op} on {torch.cuda.get_device_name()}", copy)
    if after is not None:
        after(opts, results)
    write_csv(results, f"{opts.out}/{op}.csv")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, as in the CSVs."""
    return str(dtype).replace("torch.", "")


def device() -> torch.device:
    """Where the benchmarks allocate their tensors (a function so a CPU dry run can patch it)."""
    return torch.device("cuda")


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU")
    return torch.device("cuda")


def time_us(fn: Callable[[], object], grad_to_none: Optional[list] = None, quick: bool = False) -> float:
    """Median time of ``fn`` in microseconds (CUDA events via do_bench)."""
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


def try_peer(make: Callable[[], Callable[[], object]]) -> Optional[Callable[[], object]]:
    """Build a peer's callable and run it once; None if it fails (e.g. unsupported shape)."""
    try:
        fn = make()
        fn()
        torch.cuda.synchronize()
        return fn
    except Exception as exc:  # a peer refusing a shape is a result, not a crash
        print(f"    peer failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
        torch.cuda.synchronize()
        return None


def measure(
    results: list, op: str, shape: str, dtype: torch.dtype, direction: str, impl: str,
    fn: Optional[Callable[[], object]], nbytes: int, copy_gbps: float,
    grad_to_none: Optional[list] = None, quick: bool = False,
) -> Result:
    """Time ``fn`` (or record a failure) and append a Result."""
    us = time_us(fn, grad_to_none, quick) if fn is not None else float("nan")
    gbps = nbytes / us / 1e3 if fn is not None else float("nan")
    res = Result(op, shape, dtype_name(dtype), direction, impl, us, gbps, 100 * gbps / copy_gbps)
    results.append(res)
    return res


def measure_fwd_bwd(
    results: list, op: str, shape: str, dtype: torch.dtype, impl: str,
    forward: Callable[[], torch.Tensor], dy: torch.Tensor, inputs: list,
    fwd_bytes: int, bwd_bytes: int, copy_gbps: float, quick: bool = False,
) -> None:
    """Time ``forward()`` and the backward of its output with ``dy`` (gradients of ``inputs``
    reset each time); a peer whose forward fails gets empty cells for both."""
    fwd = try_peer(lambda: forward)
    measure(results, op, shape, dtype, "fwd", impl, fwd, fwd_bytes, copy_gbps, quick=quick)
    if fwd is None:
        measure(results, op, shape, dtype, "bwd", impl, None, 0, copy_gbps)
        return
    y = forward()
    bwd = try_peer(lambda: (lambda: y.backward(dy, retain_graph=True)))
    measure(results, op, shape, dtype, "bwd", impl, bwd, bwd_bytes, copy_gbps, grad_to_none=inputs, quick=quick)


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Peak memory allocated while ``fn`` runs, above what was allocated before, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


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


def write_csv(results: Iterable[Result], path: str) -> None:
    """Write dataclass rows (Results) as CSV under a header of their field names (makes the folder)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    results = list(results)
    row_type = type(results[0]) if results else Result  # any dataclass rows (train_step has its own)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([field.name for field in dataclasses.fields(row_type)])
        for r in results:
            writer.writerow(dataclasses.astuple(r))


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
