"""Building our kernels for a GPU on a machine without one: what the compiler accepts, and
what a kernel form costs in registers, spills and shared memory.

Triton compiles for a named target (``GPUTarget("cuda", 90, 32)``) without a GPU, and its
wheel bundles ``ptxas``, whose ``-v`` reports registers and spill bytes a thread. The
launches to build come from the ops' own plans (:meth:`Op.record_launches`): each recorded
``(kernel, arguments, keyword arguments)`` gives the kernel's signature (tensors as pointers to
their dtype, None and the constexprs as constexprs, other numbers as scalars) and its
options (``num_warps``, ``num_stages``), and the specialization Triton's launcher would
give it: integers divisible by 16 and 16-byte-aligned pointers marked as such (without those
marks a build can spill where the launched kernel does not: the figures are in
docs/journal/2026-11-28-architecture-measurements.md). Meta tensors count as aligned,
as fresh allocations are.

Used by ``tests/test_compile_analysis.py`` (every planned form must build) and
``benchmarks/dev/registers.py`` (registers and spills at the benchmark shapes). Run in a process
without ``TRITON_INTERPRET=1``: the interpreter replaces the kernels with Python.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any, NamedTuple

import torch

_POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int8: "*i8",
            torch.uint8: "*u8", torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1",
            torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5"}
OPTIONS = ("num_warps", "num_stages", "launch_pdl")


class Form(NamedTuple):
    """One kernel form: what a build of it depends on (hashable: launches that share it build once)."""

    kernel: Any
    signature: tuple  # (argument name, type) for every argument, "constexpr" for constexprs
    constexprs: tuple  # (name, value), sorted
    options: tuple  # (name, value) of OPTIONS
    divisible: tuple  # names of the arguments Triton marks divisible by 16

    @property
    def name(self) -> str:
        return self.kernel.__name__


def form(kernel, args: tuple, kwargs: dict) -> Form:
    """The form a recorded launch ``kernel[grid](*args, **kwargs)`` builds."""
    options = {k: kwargs[k] for k in OPTIONS if k in kwargs}
    const = {k: v for k, v in kwargs.items() if k not in options}
    types, divisible = {}, []
    for name, value in zip(kernel.arg_names, args):
        if value is None:
            const[name] = None
        elif isinstance(value, torch.Tensor):
            types[name] = _POINTER[value.dtype]
            if value.device.type == "meta" or value.data_ptr() % 16 == 0:
                divisible.append(name)
        elif isinstance(value, bool):
            types[name] = "i1"
        elif isinstance(value, int):
            types[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                divisible.append(name)
        else:
            types[name] = "fp32"
    signature = tuple((name, "constexpr" if name in const else types[name]) for name in kernel.arg_names)
    return Form(kernel, signature, tuple(sorted(const.items(), key=lambda kv: kv[0])), tuple(options.items()),
                tuple(divisible))


def forms(launches: list) -> list[Form]:
    """The distinct forms of recorded launches, in order of first appearance."""
    return list(dict.fromkeys(form(*launch) for launch in launches))


def build(f: Form, capability: int = 90):
    """``f`` compiled by Triton for an sm_``capability`` GPU (a ``CompiledKernel``: its ``asm``
    holds the PTX, its ``metadata.shared`` the shared memory a program uses)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    index = f.kernel.arg_names.index
    source = ASTSource(fn=f.kernel, signature=dict(f.signature), constexprs={(index(k),): v for k, v in f.constexprs},
                       attrs={(index(k),): [["tt.divisibility", 16]] for k in f.divisible})
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=dict(f.options))


class Usage(NamedTuple):
    registers: int
    spill_stores: int  # bytes a thread
    spill_loads: int


def usage(compiled, capability: int = 90) -> Usage:
    """Registers and spill bytes a thread of a build, from Triton's bundled ``ptxas -v``."""
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        arch = re.search(r"\.target\s+(sm_\w+)", ptx).group(1)
        out = subprocess.run([_ptxas(capability), "-v", f"--gpu-name={arch}", path, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores", text)
    loads = re.search(r"(\d+) bytes spill loads", text)
    return Usage(int(regs.group(1)) if regs else -1, int(stores.group(1)) if stores else 0,
                 int(loads.group(1)) if loads else 0)


def _ptxas(capability: int) -> str:
    """The ptxas Triton compiles with (its API moved between versions)."""
    from triton.backends.nvidia import compiler

    if hasattr(compiler, "get_ptxas"):
        try:
            return compiler.get_ptxas(capability).path
        except TypeError:  # Triton versions whose get_ptxas takes no argument
            return compiler.get_ptxas().path
    return compiler._path_to_binary("ptxas")[0]
