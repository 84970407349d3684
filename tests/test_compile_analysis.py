"""Offline builds of the kernels for a GPU target, on the CPU: every kernel form the ops' plans
launch compiles (the interpreter forgives what the compiler does not), torch.compile's analysis
of which tensors the norm kernels write sees only their outputs, and the norm backward's
prefetch fits the shared memory of GPUs smaller than an H100 (A100, RTX 4090 / L4): planned as
on them, every norm form with prefetched rows builds within their limit.

Under torch.compile, the kernels launched through wrap_triton are analysed (from their
Triton IR) for the tensors they store to; functionalization then copies every "written"
input back. The analysis takes every pointer a @triton.jit helper returns as derived from
every pointer it was given, so a helper given both the weight and the partials' buffer
made the weight look written: compiling a model with a norm failed ("a leaf Variable that
requires grad is being used in an in-place operation"), seen on an H100. The analysis
needs no GPU, only a GPU target to build the IR for: this runs it on the CPU too.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

M, N = 8, 256
BWD_FLAGS = dict(IS_RMS=True, HAS_WEIGHT=True, STABLE=False, UNIT_OFFSET=False, CAST_BEFORE_WEIGHT=False,
                 HAS_DH=True, STORE_DR=True, COMPUTE_DX=True, COMPUTE_DW=True, COMPUTE_DB=True)


def _t(*shape):
    return torch.randn(shape)


def _analyse() -> dict:
    """kernel configuration -> the arguments torch's analysis says it writes. Runs in a
    process without TRITON_INTERPRET (the analysis reads real @triton.jit kernels), with a
    stand-in driver that only names a GPU target (sm_90) to build their IR for."""
    import triton.runtime
    from torch._higher_order_ops import triton_kernel_wrap as tkw
    from triton.backends.compiler import GPUTarget

    class Target:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

    triton.runtime.driver.set_active(Target())
    from triton_layers.kernels import layer_norm as LN

    def written(kernel, args, constexprs):
        # (USE_PDL False: as the compiled door passes them, KernelCall._traced)
        kwargs = dict(zip(kernel.arg_names, args), **constexprs, USE_PDL=False)
        return sorted(dep.name for dep in tkw.identify_accessed_tensors(kernel, kwargs, {}).read_writes.writes)

    out = {}
    for residual in (False, True):
        for single in (True, False):
            r, h = (_t(M, N), _t(M, N)) if residual else (None, None)
            args = [_t(M, N), r, h, _t(M, N), _t(N), _t(N), _t(2, M), N, N, N, N, M, N, 1e-5, 1, 0]
            flags = dict(IS_RMS=False, HAS_RESIDUAL=residual, HAS_WEIGHT=True, HAS_BIAS=True, STABLE=False,
                         UNIT_OFFSET=False, CAST_BEFORE_WEIGHT=False, BLOCK_M=8 if single else 1,
                         BLOCK_N=256 if single else 64, SINGLE_PASS=single, STORE_STATS=True,
                         AFFINE_FIRST=False)
            out[f"fwd residual={residual} single_pass={single}"] = written(LN._norm_fwd_kernel, args, flags)
            # a call no gradient will flow from writes no statistics
            out[f"fwd no stats residual={residual} single_pass={single}"] = written(
                LN._norm_fwd_kernel, args, dict(flags, STORE_STATS=False))
    for residual in (False, True):
        for ahead in (1, 2):  # (rows published ahead)
            r, h = (_t(M, N), _t(M, N)) if residual else (None, None)
            args = [_t(M, N), r, h, _t(M, N), _t(N), _t(N), _t(2, M), _t(M, 2, 2),
                    torch.zeros(1 + M, dtype=torch.int32), N, N, N, N, M, N, 1e-5, 2, 4]
            out[f"fwd one-pass split residual={residual} ahead={ahead}"] = written(
                LN._norm_fwd_split_kernel, args, dict(
                    IS_RMS=False, HAS_RESIDUAL=residual, HAS_WEIGHT=True, HAS_BIAS=True, UNIT_OFFSET=False,
                    CAST_BEFORE_WEIGHT=False, BLOCK_N=128, CHUNKS_POW2=2, MAX_POLLS=0, AHEAD=ahead,
                    STORE_STATS=True))
    args = [_t(M, N), _t(M, N), _t(M, N), _t(N), _t(2, M), _t(M, N), _t(M, N), _t(2, 4, N), N, N, N, N, N, M, N, 1]
    for per_tile in (False, True):  # (the weight held, or loaded per tile: rows over bwd_long_row)
        out[f"bwd weight_per_tile={per_tile}"] = written(LN._norm_bwd_kernel, args, dict(
            BWD_FLAGS, BLOCK_M=8, BLOCK_N=256, NUM_STAGES=3, WEIGHT_PER_TILE=per_tile))
    sums = _t(M, 2, 2)
    args = [_t(M, N), _t(M, N), _t(N), _t(2, M), sums, N, N, M, N, 2]
    out["bwd row sums"] = written(LN._norm_bwd_row_sums_kernel, args, dict(
        IS_RMS=True, HAS_WEIGHT=True, STABLE=False, UNIT_OFFSET=False, BLOCK_N=128))
    arrivals = torch.zeros(1 + M, dtype=torch.int32)
    args = [_t(M, N), _t(M, N), _t(M, N), _t(N), _t(2, M), sums, arrivals, _t(M, N), _t(M, N), _t(2, 4, N),
            N, N, N, N, N, M, N, 2, 2]
    for one_pass in (False, True):
        out[f"bwd split one_pass={one_pass}"] = written(LN._norm_bwd_split_kernel, args, dict(
            BWD_FLAGS, BLOCK_M=2, BLOCK_N=128, CHUNKS_POW2=2, ONE_PASS=one_pass, PUBLISH_AHEAD=2, MAX_POLLS=0))
    # the FP8 1x128 recipe's transposed copy: z (x or h), the weight, bias and statistics read only
    from triton_layers.kernels import norm_fp8 as FP8

    for rms in (True, False):
        args = [_t(M, N), _t(N), _t(N), _t(2, M), torch.empty(N, M, dtype=torch.float8_e4m3fn), _t(N, 1), N, M, N]
        out[f"fp8 transposed copy rms={rms}"] = written(FP8._norm_fp8_t_tile_kernel, args, dict(
            IS_RMS=rms, HAS_WEIGHT=True, HAS_BIAS=not rms, UNIT_OFFSET=False, CAST_BEFORE_WEIGHT=False, FP8_MAX=448.0,
            IS_E5M2=False, POW2=True, EXACT_CAST=False, BLOCK_M=8, BLOCK_N=64))
    return out


A100_SHARED = 166912  # bytes of shared memory a program may use on an A100 (sm_80)


def _backward_prefetch() -> dict:
    """The stages prefetch_stages gives the whole-row backward at fp32 rows of 8,192 with a
    residual (z, dy and dh: 96 KB a stage) on an A100, and the shared memory its build for
    sm_80 needs at those stages and at the default 3."""
    from benchmarks.dev import offline
    from triton_layers import launch_config
    from triton_layers.kernels import layer_norm as LN
    from triton_layers.kernels._layer_norm_rules import prefetch_stages

    a100 = launch_config.GPU("NVIDIA A100-SXM4-80GB", sm_count=108, shared_memory=A100_SHARED, capability=(8, 0))
    stages = prefetch_stages(3, 8192 * 4 * 3, a100, launch_config.DEFAULT.layer_norm.bwd_reduction_scratch_bytes)
    const = dict(BWD_FLAGS, STORE_DR=False, BLOCK_M=1, BLOCK_N=8192, WEIGHT_PER_TILE=False, USE_PDL=False)
    pointers = {"DY", "DH", "Z", "W", "Stats", "DX", "DR", "Partials"}
    kernel = LN._norm_bwd_kernel
    shared = {}
    for n in (stages, 3):
        constexprs = dict(const, NUM_STAGES=n, num_warps=16)
        args = [torch.empty(1) if name in pointers else 8 for name in kernel.arg_names if name not in constexprs]
        shared[n] = offline.build(offline.form(kernel, args, constexprs), capability=80).metadata.shared
    return {"stages": stages, "shared": shared[stages], "shared at 3": shared[3]}


EXPECTED = {
    **{f"fwd residual={r} single_pass={s}": sorted({"Y", "Stats"} | ({"H"} if r else set()))
       for r in (False, True) for s in (True, False)},
    **{f"fwd no stats residual={r} single_pass={s}": sorted({"Y"} | ({"H"} if r else set()))
       for r in (False, True) for s in (True, False)},
    # the one-pass forward also publishes its row sums and counts arrivals
    **{f"fwd one-pass split residual={r} ahead={a}":
       sorted({"Arrivals", "Sums", "Y", "Stats"} | ({"H"} if r else set())) for r in (False, True) for a in (1, 2)},
    **{f"bwd weight_per_tile={p}": ["DR", "DX", "Partials"] for p in (False, True)},
    "bwd row sums": ["Sums"],
    "bwd split one_pass=False": ["DR", "DX", "Partials"],
    # the one-pass form also publishes its row sums and counts arrivals
    "bwd split one_pass=True": ["Arrivals", "DR", "DX", "Partials", "Sums"],
    **{f"fp8 transposed copy rms={rms}": ["QT", "ScalesT"] for rms in (True, False)},
}


@functools.lru_cache(maxsize=None)
def _offline_builds(part: str):
    """This file run as a script for one ``part`` (see the bottom), in a process without
    TRITON_INTERPRET: its JSON line. One process a part, so that test workers share the
    parts out instead of each building everything."""
    # ("0", not unset: tests/conftest.py, imported for the door cases, would set it on a CPU)
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    proc = subprocess.run([sys.executable, "-m", "tests.test_compile_analysis", part], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_norm_kernels_write_only_their_outputs():
    pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    if not hasattr(tkw, "identify_accessed_tensors"):
        pytest.skip("this torch names its kernel-mutation analysis otherwise")
    assert _offline_builds("analysis") == EXPECTED


def _planned_launches() -> list:
    """Every launch the ops' plans make, forward and backward (:meth:`Op.record_launches`), for
    the door-parity cases (tests/test_doors.py) and a few more, under the default config, the
    tiny one (chunked long-row paths), with the long-row norm forward and backward in one
    pass (GPU-only choices: forced here) and with the causal softmax forward by classes of
    rows. CPU tensors, nothing launched or computed."""
    import contextlib
    from unittest import mock

    from tests.test_doors import CASES, _r
    from triton_layers import launch_config
    from triton_layers.kernels import _layer_norm_rules
    from triton_layers.kernels import ops as K

    extra = {  # rows of several chunks in coor_descent's backward; a softmax without mask
        "coor_descent-chunks": lambda dev: (_r(1, 1000, device=dev), None, None, 50.0, 3, 0.1, 1.0, 0.9),
        "softmax-plain": lambda dev: (_r(4, 40, device=dev, dtype=torch.float16), None, 4, 40, False, 1.0),
    }
    # (the causal softmax forward by classes of rows, from blocks of 64 columns)
    classes = launch_config.DEFAULT.with_knobs("softmax", causal_class_min_cols=64)
    launches = []
    default, tiny = launch_config.DEFAULT, launch_config.TINY
    for config, one_pass in ((default, False), (tiny, False), (tiny, True), (classes, False)):
        with launch_config.use_config(config), contextlib.ExitStack() as forced:
            if one_pass:  # the long-row norm forward and backward in one pass (a decision, forced)
                forced.enter_context(mock.patch.object(_layer_norm_rules, "one_pass_split", lambda *args: True))
                forced.enter_context(mock.patch.object(_layer_norm_rules, "one_pass_forward", lambda *args: True))
            for case, build in {**CASES, **extra}.items():
                launches += getattr(K, case.split("-")[0]).record_launches(*build("cpu"))
    return launches + _fp8_launches()


def _fp8_launches() -> list:
    """The FP8 norms' launches for every recipe, with and without the residual, RMSNorm and
    LayerNorm, on meta tensors (a GPU's forms: the CPU's cast their values by hand); and, e4m3
    only, on rows over a shrunk ``fwd_max_fused_cols`` (the chunked kernel), the dynamic
    per-tensor scale's two launches among them (rows of 4 programs)."""
    from triton_layers import launch_config
    from triton_layers.kernels import ops as K

    launches = []
    w = torch.empty(N, device="meta", dtype=torch.bfloat16)
    scale = torch.empty(1, device="meta")
    long_rows = launch_config.shrunk(128, 128).with_knobs("layer_norm", fp8_tile_elements=256)
    for config, rows, fp8s in ((launch_config.DEFAULT, M, (torch.float8_e4m3fn, torch.float8_e5m2)),
                               (long_rows, 4 * M, (torch.float8_e4m3fn,))):
        x = torch.empty(rows, N, device="meta", dtype=torch.bfloat16)
        with launch_config.use_config(config):
            for rms, residual in ((True, None), (False, x), (True, x)):
                for granularity, static, column_major, transposed in (
                        ("per_tensor", scale, False, False), ("per_tensor", None, False, False),
                        ("per_token", None, False, False), ("per_group", None, True, False),
                        ("per_group", None, False, True)):
                    for fp8 in fp8s:
                        launches += K.norm_fp8.record_launches(
                            x, residual, w, None if rms else w, static, 1e-5, rms, False, False, torch.bfloat16,
                            fp8, granularity, granularity == "per_token",
                            2.0 if granularity == "per_token" else 0.0, column_major, residual is not None,
                            transposed)
    return launches


def _planned_kernel_builds() -> dict:
    """Every distinct form of :func:`_planned_launches` built for sm_90: the kernels built and
    what failed. The Triton interpreter runs Python, and forgave what the compiler does not
    (coor_descent, 2026-11-25: a loop index retyped by a later loop, a variable defined in one
    branch only); this catches that on a machine without a GPU."""
    from benchmarks.dev import offline
    from triton_layers.kernels import ops as K

    built, failed = set(), []
    forms = offline.forms(_planned_launches())
    for form in forms:
        try:
            offline.build(form)
            built.add(form.name)
        except Exception as exc:
            failed.append(f"{form.name} {dict(form.constexprs)} {dict(form.options)}: "
                          f"{type(exc).__name__}: {str(exc)[-400:]}")
    # every kernel of the files that describe the ops (kernels.ops.__all__, the one list of them)
    modules = {sys.modules[getattr(K, name).desc.plan_forward.__module__] for name in (*K.__all__, "norm_fp8")}
    kernels = {name for module in modules for name in dir(module) if name.startswith("_") and name.endswith("_kernel")}
    return {"variants": len(forms), "built": sorted(built), "kernels": sorted(kernels), "failed": failed}


# GPUs with less shared memory a program than an H100's 227 KB: (compute capability, bytes).
SMALLER_GPUS = {"A100": (80, A100_SHARED), "RTX 4090 / L4": (89, 101376)}


def _shared_memory_on_smaller_gpus() -> dict:
    """The norm backward's whole-row forms, those that prefetch rows into shared memory (rows
    of 1,024-8,192 columns, with and without the residual, bf16 and fp32; longer rows take one
    stage or the split kernels), planned as on each of SMALLER_GPUS and built for it: the forms
    whose shared memory exceeds that GPU's limit (a launch there would fail), and how many
    were built."""
    from benchmarks import bench_layernorm, bench_norms
    from benchmarks.dev import offline, registers
    from triton_layers import launch_config
    from triton_layers.kernels import ops as K

    over, built = [], 0
    for gpu, (capability, limit) in SMALLER_GPUS.items():
        forms = []
        smaller = dataclasses.replace(registers.H100, shared_memory=limit, capability=divmod(capability, 10))
        with launch_config.plan_as(smaller):
            for d in (1024, 4096, 8192):
                for dtype in (torch.bfloat16, torch.float32):
                    for _, op, args in [case for bench in (bench_layernorm, bench_norms)
                                        for case in bench.kernel_inputs((64, d), dtype, registers.meta_leaf)]:
                        forms += offline.forms(getattr(K, op).record_launches(*args))
        for form in dict.fromkeys(f for f in forms if f.name == "_norm_bwd_kernel"):
            shared = offline.build(form, capability=capability).metadata.shared
            built += 1
            if shared > limit:
                over.append(f"{gpu}: {form.name} {dict(form.constexprs)}: {shared} bytes > {limit}")
    return {"over": over, "built": built}


def test_norm_kernels_fit_the_shared_memory_of_smaller_gpus():
    got = _offline_builds("smaller gpus")
    assert got["over"] == []
    assert got["built"] >= 40


def test_every_planned_kernel_builds_for_a_gpu():
    got = _offline_builds("planned builds")
    assert got["failed"] == []
    assert got["built"] == got["kernels"]  # every kernel of ours, in at least one form
    assert got["variants"] >= 30


def test_backward_prefetch_fits_an_a100():
    """At fp32 rows of 8,192 with a residual the default 3 stages need more shared memory than
    an A100 gives a program (the launch would fail there); the stages the launcher picks fit."""
    got = _offline_builds("prefetch")
    assert got["stages"] == 2
    assert got["shared"] <= A100_SHARED < got["shared at 3"]


PARTS = {"analysis": lambda: _analyse(), "prefetch": lambda: _backward_prefetch(),
         "planned builds": lambda: _planned_kernel_builds(), "smaller gpus": lambda: _shared_memory_on_smaller_gpus()}

if __name__ == "__main__":
    print(json.dumps(PARTS[sys.argv[1]]()))
