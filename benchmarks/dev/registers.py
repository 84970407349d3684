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

Run: python -m benchmarks.dev.registers [--ops norm,residual_norm,softmax,weighted_sum,coor_descent]
     (or the benchmarks' names, every one python -m benchmarks takes and the ops of their rows:
     --ops layernorm,norms,rmsnorm,train_step,...: the kernel ops each runs, at their benchmarks' shapes)
     [--spills-only]
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Iterator

import torch

from benchmarks import bench_coor_descent, bench_layernorm, bench_norms, bench_softmax, bench_weighted_sum, parts
from benchmarks.dev import offline
from triton_layers.launch_config import GPU, plan_as

# The GPU the forms are planned for: its name as torch.cuda.get_device_name gives it, its SMs
# and the shared memory a program may use (227 KB).
H100 = GPU("NVIDIA H100 80GB HBM3", sm_count=132, shared_memory=232448, capability=(9, 0))
DTYPES = (torch.bfloat16, torch.float32)


def _t(*shape, dtype=torch.float32, grad=True):
    return torch.empty(shape, device="meta", dtype=dtype).requires_grad_(grad)


# op -> (shapes, dtypes, inputs of one case (shape, dtype) -> [(label, description inputs)])
def _norms(shape, dtype):
    m, d = shape
    flags = (False, False, False)  # stable, unit_offset, cast_before_weight
    cases = [("layernorm", (_t(m, d, dtype=dtype), _t(d, dtype=dtype), _t(d, dtype=dtype), 1e-5, False, *flags,
                            dtype))]
    if d in [s[1] for s in bench_norms.SHAPES]:
        cases.append(("rmsnorm", (_t(m, d, dtype=dtype), _t(d, dtype=dtype), None, 1e-6, True, *flags, dtype)))
    return cases


def _residual_norms(shape, dtype):
    m, d = shape
    flags = (False, False, False)
    return [(f"add_{kind}", (_t(m, d, dtype=dtype), _t(m, d, dtype=dtype), _t(d, dtype=dtype),
                             _t(d, dtype=dtype) if kind == "layernorm" else None, 1e-6, kind == "rmsnorm", *flags,
                             dtype, dtype))
            for kind in ("rmsnorm", "layernorm")]


def _softmax(shape, dtype):
    bh, n = shape
    return [(f"softmax{' causal' if causal else ''}", (_t(bh * n, n, dtype=dtype), None, n, n, causal, 1.0))
            for causal in (False, True)]


def _weighted_sum(shape, dtype):
    m, d = shape
    return [("weighted_sum", (_t(m, d, dtype=dtype), _t(d, dtype=dtype), _t(dtype=dtype)))]


def _coor_descent(shape, dtype):
    m, n = shape
    settings = bench_coor_descent.SETTINGS
    return [("coor_descent", (_t(m, n), None, None, n / 8 * 9 / 8, settings["n_iters"], settings["eps"],
                              settings["eps_init"], settings["eps_decay"]))]


OPS: dict[str, tuple[list, tuple, Callable]] = {
    "norm": (sorted(set(bench_layernorm.SHAPES) | set(bench_norms.SHAPES)), DTYPES, _norms),
    "residual_norm": (bench_norms.SHAPES, DTYPES, _residual_norms),
    "softmax": (bench_softmax.SHAPES, DTYPES, _softmax),
    "weighted_sum": (bench_weighted_sum.SHAPES, DTYPES, _weighted_sum),
    "coor_descent": (bench_coor_descent.SHAPES, (torch.float32,), _coor_descent),
}


def rows(ops: list[str], gpu: GPU = H100) -> Iterator[tuple[str, str, offline.Form]]:
    """(case label, shape and dtype, form) of every distinct kernel form of ``ops``' benchmark
    cases, planned on meta tensors as on ``gpu`` (:func:`plan_as`: its SMs, shared memory and
    name make the GPU-only choices: the long-row norm forward's and backward's one pass, the
    prefetch stages, the named rules)."""
    from triton_layers.kernels import ops as K

    seen = set()
    with plan_as(gpu):
        for name in ops:
            shapes, dtypes, cases = OPS[name]
            for shape in shapes:
                for dtype in dtypes:
                    for label, args in cases(shape, dtype):
                        for form in offline.forms(getattr(K, name).record_launches(*args)):
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
    for name in text.split(","):
        for op in BENCHMARK_NAMES.get(name, (name,)):
            if op not in OPS:
                raise KeyError(f"unknown op {name!r}; known: {', '.join(dict.fromkeys([*OPS, *BENCHMARK_NAMES]))}")
            if op not in names:
                names.append(op)
    return names


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(OPS), help="kernel ops, or the benchmarks' names (layernorm, ...)")
    parser.add_argument("--spills-only", action="store_true", help="list only the forms that spill")
    opts = parser.parse_args(argv)
    try:
        ops = op_names(opts.ops)
    except KeyError as err:
        parser.error(err.args[0])
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: the interpreter replaces the kernels with Python")
    print("| case | shape | kernel | registers | spill stores / loads (bytes a thread) | shared (bytes) | knobs |")
    print("|---|---|---|---|---|---|---|")
    for label, shape, form in rows(ops):
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
