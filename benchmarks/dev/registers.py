"""Registers, spills and shared memory of every kernel form the ops launch at the benchmark
shapes, built for an H100 (sm_90) on this machine: no GPU needed (a dev tool).

For each op at its benchmark's shapes and dtypes, the default launch config plans the forward
and the backward as it would on an H100 (132 SMs, 227 KB of shared memory a program); the
launches are recorded, not made (meta tensors: nothing is allocated), and each distinct
kernel form is compiled with Triton and assembled with its bundled ``ptxas -v``
(:mod:`benchmarks.dev.offline`). A form that spills is where a kernel change or a launch knob
needs a look before GPU time is spent on it: count registers, don't guess. The figures are
this machine's Triton's: another Triton compiles otherwise (the LayerNorm backward at bf16
rows of 1,024: 126 registers a thread with Triton 3.9 here, 96 with Triton 3.6 on the GPU
machines, 2026-11-25), so run it where the kernels will run (it works there too) before
drawing a conclusion from a figure near a limit.

The forms are the bench files' own: each op part's ``kernel_inputs`` (its cases' inputs to the
kernel ops, :func:`rows`), so a new ``bench_<op>.py`` brings its forms without an edit here.

Run: python -m benchmarks.dev.registers [--ops <kernel ops>] [--shapes 64x256,...] [--dtypes float32]
     [--spills-only]
     (--ops: the kernel ops of kernels/ops.py, or the benchmarks' names, every one python -m
     benchmarks takes and the ops of their rows: --ops layernorm,norms,rmsnorm,train_step,...:
     the kernel ops each runs, at their benchmarks' shapes)
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator, Optional

import torch

from benchmarks import parts
from benchmarks.dev import offline
from triton_layers.launch_config import GPU, plan_as

# The GPU the forms are planned for: its name as torch.cuda.get_device_name gives it, its SMs
# and the shared memory a program may use (227 KB).
H100 = GPU("NVIDIA H100 80GB HBM3", sm_count=132, shared_memory=232448, capability=(9, 0))
DTYPES = (torch.bfloat16, torch.float32)


def meta_leaf(*shape, dtype=torch.float32, grad=True):
    """A meta leaf (nothing allocated): what the bench files' ``kernel_inputs`` draw their inputs from."""
    return torch.empty(shape, device="meta", dtype=dtype).requires_grad_(grad)


def _benches() -> list:
    """The bench files that declare their kernel forms: each op part's module with a
    ``kernel_inputs(shape, dtype, t) -> [(label, kernel op, its description inputs)]`` (the
    forms of one benchmark case, leaves from ``t``) beside its ``SHAPES``, in the parts' order."""
    return [sys.modules[fn.__module__] for fn in parts.provided("kernel_inputs")]


def kernel_ops() -> list[str]:
    """The kernel ops the bench files declare forms of, in order, once each."""
    found = [op for bench in _benches() for shape in bench.SHAPES[:1] for dtype in DTYPES
             for _, op, _ in bench.kernel_inputs(shape, dtype, meta_leaf)]
    return list(dict.fromkeys(found))


def rows(ops: list[str], gpu: GPU = H100, shapes: Optional[list] = None,
         dtypes: tuple = DTYPES) -> Iterator[tuple[str, str, offline.Form]]:
    """(case label, shape and dtype, form) of every distinct kernel form of ``ops``' benchmark
    cases (or of ``shapes`` in place of each benchmark's own), planned on meta tensors as on
    ``gpu`` (:func:`plan_as`: its SMs, shared memory and name make the GPU-only choices: the
    long-row norm forward's and backward's one pass, the prefetch stages, the named rules)."""
    from triton_layers.kernels import ops as K

    seen = set()
    with plan_as(gpu):
        for bench in _benches():
            for shape in shapes or bench.SHAPES:
                for dtype in dtypes:
                    for label, op, args in bench.kernel_inputs(shape, dtype, meta_leaf):
                        if op not in ops:
                            continue
                        for form in offline.forms(getattr(K, op).record_launches(*args)):
                            if form not in seen:
                                seen.add(form)
                                yield label, f"{shape[0]}x{shape[1]} {str(dtype)[6:]}", form


def _knobs(form: offline.Form) -> str:
    """The form's constexprs that are not None or False, and its options."""
    shown = [f"{k}={v}" for k, v in form.constexprs if v not in (None, False)]
    return " ".join(shown + [f"{k}={v}" for k, v in form.options])


# The benchmarks' names (python -m benchmarks --ops ...: its parts, and the ops of their rows) as the kernel
# ops they run, as each bench file declares them (its PART's kernel_ops, benchmarks/parts.py).
BENCHMARK_NAMES = {name: parts.kernel_ops(name) for name in (*parts.names(), *parts.op_names())}


def op_names(text: str) -> list[str]:
    """The kernel ops named in ``--ops`` (theirs or the benchmarks' names), in order, once each;
    KeyError naming the unknown ones and the known."""
    names: list[str] = []
    known = kernel_ops()
    for name in text.split(","):
        for op in BENCHMARK_NAMES.get(name, (name,)):
            if op not in known:
                raise KeyError(f"unknown op {name!r}; known: {', '.join(dict.fromkeys([*known, *BENCHMARK_NAMES]))}")
            if op not in names:
                names.append(op)
    return names


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=None, help="kernel ops, or the benchmarks' names (layernorm, ...); "
                        "default: every kernel op")
    parser.add_argument("--shapes", default=None, help="rows x cols, comma-separated (64x256,8x4096), in place "
                        "of each benchmark's own")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated torch dtypes")
    parser.add_argument("--spills-only", action="store_true", help="list only the forms that spill")
    opts = parser.parse_args(argv)
    try:
        ops = op_names(opts.ops or ",".join(kernel_ops()))
        shapes = [tuple(int(n) for n in s.split("x")) for s in opts.shapes.split(",")] if opts.shapes else None
        dtypes = tuple(getattr(torch, d) for d in opts.dtypes.split(","))
    except (KeyError, ValueError, AttributeError) as err:
        parser.error(str(err.args[0]))
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: the interpreter replaces the kernels with Python")
    print("| case | shape | kernel | registers | spill stores / loads (bytes a thread) | shared (bytes) | knobs |")
    print("|---|---|---|---|---|---|---|")
    for label, shape, form in rows(ops, shapes=shapes, dtypes=dtypes):
        try:
            compiled = offline.build(form)
            use = offline.usage(compiled)
        except Exception as exc:
            print(f"| {label} | {shape} | {form.name} | failed: {type(exc).__name__}: {str(exc)[-200:]} | | | |")
            continue
        if opts.spills_only and not (use.spill_stores or use.spill_loads):
            continue
        print(f"| {label} | {shape} | {form.name} | {use.registers} | {use.spill_stores} / {use.spill_loads} | "
              f"{compiled.metadata.shared} | {_knobs(form)} |", flush=True)


if __name__ == "__main__":
    main()
