"""torch.compile's analysis of which tensors our norm kernels write sees only their outputs.

Under torch.compile, the kernels launched through wrap_triton are analysed (from their
Triton IR) for the tensors they store to; functionalization then copies every "written"
input back. The analysis takes every pointer a @triton.jit helper returns as derived from
every pointer it was given, so a helper given both the weight and the partials' buffer
made the weight look written: compiling a model with a norm failed ("a leaf Variable that
requires grad is being used in an in-place operation"), seen on an H100. The analysis
needs no GPU, only a GPU target to build the IR for: this runs it on the CPU too.
"""
from __future__ import annotations

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
        kwargs = dict(zip(kernel.arg_names, args), **constexprs)
        return sorted(dep.name for dep in tkw.identify_accessed_tensors(kernel, kwargs, {}).read_writes.writes)

    out = {}
    for residual in (False, True):
        for single in (True, False):
            r, h = (_t(M, N), _t(M, N)) if residual else (None, None)
            args = [_t(M, N), r, h, _t(M, N), _t(N), _t(N), _t(2, M), N, N, N, N, M, N, 1e-5]
            flags = dict(IS_RMS=False, HAS_RESIDUAL=residual, HAS_WEIGHT=True, HAS_BIAS=True, STABLE=False,
                         UNIT_OFFSET=False, CAST_BEFORE_WEIGHT=False, BLOCK_M=8 if single else 1,
                         BLOCK_N=256 if single else 64, SINGLE_PASS=single)
            out[f"fwd residual={residual} single_pass={single}"] = written(LN._norm_fwd_kernel, args, flags)
    args = [_t(M, N), _t(M, N), _t(M, N), _t(N), _t(2, M), _t(M, N), _t(M, N), _t(2, 4, N), N, N, N, N, N, M, N, 1]
    out["bwd"] = written(LN._norm_bwd_kernel, args, dict(BWD_FLAGS, BLOCK_M=8, BLOCK_N=256, NUM_STAGES=3))
    sums = _t(M, 2, 2)
    args = [_t(M, N), _t(M, N), _t(N), _t(2, M), sums, N, N, M, N, 2]
    out["bwd row sums"] = written(LN._norm_bwd_row_sums_kernel, args, dict(
        IS_RMS=True, HAS_WEIGHT=True, STABLE=False, UNIT_OFFSET=False, BLOCK_N=128))
    args = [_t(M, N), _t(M, N), _t(M, N), _t(N), _t(2, M), sums, _t(M, N), _t(M, N), _t(2, 4, N),
            N, N, N, N, N, M, N, 2, 2]
    out["bwd split"] = written(LN._norm_bwd_split_kernel, args, dict(BWD_FLAGS, BLOCK_M=2, BLOCK_N=128, CHUNKS_POW2=2))
    return out


EXPECTED = {
    **{f"fwd residual={r} single_pass={s}": sorted({"Y", "Stats"} | ({"H"} if r else set()))
       for r in (False, True) for s in (True, False)},
    "bwd": ["DR", "DX", "Partials"],
    "bwd row sums": ["Sums"],
    "bwd split": ["DR", "DX", "Partials"],
}


def test_norm_kernels_write_only_their_outputs():
    pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    if not hasattr(tkw, "identify_accessed_tensors"):
        pytest.skip("this torch names its kernel-mutation analysis otherwise")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    proc = subprocess.run([sys.executable, "-m", "tests.test_compile_analysis"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == EXPECTED


if __name__ == "__main__":
    print(json.dumps(_analyse()))
