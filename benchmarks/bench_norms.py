"""RMSNorm, and RMSNorm or LayerNorm with the fused residual add, forward and backward,
against torch, torch.compile and Liger.

Three ops, one table each (the ``op`` column of norms.csv):

- ``rmsnorm``: y = rms_norm(x) * w. Bytes: forward reads x, writes y (2*M*D*s); backward
  reads x (h) and dy, writes dx (3*M*D*s). Peers: torch eager ``F.rms_norm``, its
  torch.compile, Liger's LigerRMSNormFunction.
- ``add_rmsnorm``: h = x + r, y = rms_norm(h) * w, returning (y, h), the residual stream
  of a pre-norm transformer. Bytes: forward reads x and r, writes y and h (4*M*D*s);
  backward reads dy, dh and h, writes dx, which is also the residual's gradient (4*M*D*s).
  Peers: torch eager and torch.compile of ``h = x + r; F.rms_norm(h)``, Liger's
  LigerFusedAddRMSNormFunction.
- ``add_layernorm``: the same with ``layer_norm(h) * w + b``, the same bytes; peers torch
  eager and torch.compile of ``h = x + r; F.layer_norm(h)`` (Liger has no such op). At the
  quick shapes only, in every run: it shares add_rmsnorm's kernels and launch limits, and
  its compiles would add a minute to the part.

The D-sized weight and bias are left out of the bytes. Run: python -m benchmarks.bench_norms
(--quick, --dtypes, --out, --no-compile as the other benchmarks; GPU only), or as the
``norms`` part of ``python -m benchmarks``.

``--sweep-row-limits`` instead times only ours, under the default and under each other
choice of the norms' row limits (triton_layers/launch_config.py, ``ROW_LIMITS`` below: the rows up to
which the backward, and the forward and backward with a residual, keep a row whole), at
every shape of SHAPES (``--quick`` too) where that choice changes the path, so that one run
decides them; it writes norms_row_limits.csv.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

import torch
import torch.nn.functional as F

from benchmarks import harness
from benchmarks.sanitizing import around, fwd_bwd, rand
from triton_layers import functional as TF
from triton_layers import launch_config, reference

OP = "norms"
# What python -m benchmarks, its report, plots and benchmarks.dev.registers make of this part (benchmarks/parts.py):
# three ops, told apart by norms.csv's op column; targets (RMSNorm backward >= 80% of copy, fused
# add + norm forward >= 85%; their backward has no target of its own there: the report's default applies).
PART = {
    "order": 20,
    "ops": {
        "rmsnorm": {
            "title": "RMSNorm (weight; backward = dx, dweight)",
            "note": "bytes: fwd 2MDs, bwd 3MDs; targets: fwd 90%, bwd 80% of copy, faster than Liger and compile",
            "measure": "bandwidth", "kernel_ops": ("norm",), "targets": {"bwd": 80.0}},
        "add_rmsnorm": {
            "title": "Fused residual add + RMSNorm: h = x + r, y = rms_norm(h) * w, returns (y, h)",
            "note": "bytes: fwd 4MDs (reads x, r; writes y, h), bwd 4MDs (reads dy, dh, h; writes dx, also r's "
                    "gradient); targets: fwd 85% of copy (bwd has none of its own: listed under 90%), faster "
                    "than Liger and compile",
            "measure": "bandwidth", "kernel_ops": ("residual_norm",), "targets": {"fwd": 85.0}},
        "add_layernorm": {
            "title": "Fused residual add + LayerNorm: h = x + r, y = layer_norm(h) * w + b, returns (y, h)",
            "note": "bytes as add_rmsnorm (4MDs each way); at the quick shapes only; targets as add_rmsnorm, "
                    "faster than compile (Liger has no such op)",
            "measure": "bandwidth", "kernel_ops": ("residual_norm",), "targets": {"fwd": 85.0}},
    },
    "cpu_shapes": [(3, 40)],
}
SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 131072)]
QUICK_SHAPES = [(16384, 4096), (4096, 16384)]
EPS = 1e-6
OURS = "triton_layers"


def _torch_rms_norm(x, w):
    return F.rms_norm(x, x.shape[-1:], w, EPS)


def _torch_add_rms_norm(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, EPS), h


def _torch_add_layer_norm(x, r, w, b):
    h = x + r
    return F.layer_norm(h, h.shape[-1:], w, b, EPS), h


# Each op's arguments: rmsnorm f(x, w), add_rmsnorm f(x, r, w), add_layernorm f(x, r, w, b).
TORCH = {"rmsnorm": _torch_rms_norm, "add_rmsnorm": _torch_add_rms_norm, "add_layernorm": _torch_add_layer_norm}
OURS_BY_OP = {
    "rmsnorm": lambda x, w: TF.rms_norm(x, w, EPS),
    "add_rmsnorm": lambda x, r, w: TF.rms_norm(x, w, EPS, residual=r),
    "add_layernorm": lambda x, r, w, b: TF.layer_norm(x, w, b, EPS, residual=r),
}


def _liger() -> Optional[dict]:
    """Liger's two functions (positional arguments: eps, offset, casting mode, in place), or None."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    return {
        "rmsnorm": lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False),
        "add_rmsnorm": lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False),
    }


def sanitize_cases(C) -> dict:
    """``scripts/sanitize.py``'s cases of the fused residual add (``benchmarks/sanitizing.py``) under the
    launch config ``C``, both norms: its own row limits, RMSNorm's backward rows kept whole to
    bwd_rms_max_fused_cols; x and residual of two dtypes (dx and dresidual stored apart) or one (one
    tensor), strided rows."""
    out = {}
    ln = C.layer_norm
    for n in sorted({1, 7, *around(ln.bwd_residual_max_fused_cols), *around(ln.fwd_residual_max_fused_cols),
                     *around(ln.bwd_rms_max_fused_cols), 2 * ln.loop_block + 5}):
        for rows, dtype, r_dtype, kind, sliced in [(3, torch.float32, torch.float32, "rms", False),
                                                   (5, torch.bfloat16, torch.float32, "layer", True)]:
            def res(n=n, rows=rows, dtype=dtype, r_dtype=r_dtype, kind=kind, sliced=sliced):
                x, r = rand(rows, n, dtype=dtype, sliced=sliced, scale=2.0), rand(rows, n, dtype=r_dtype)
                w, b = 1 + 0.5 * rand(n), 0.5 * rand(n)

                def ours(x, r, w, b):  # y and h in one output: gradients reach both
                    if kind == "rms":
                        y, h = TF.rms_norm(x, w, 1e-6, residual=r, use_triton=True)
                    else:
                        y, h = TF.layer_norm(x, w, b, residual=r, use_triton=True)
                    # in x's dtype: the loose bound follows the output's dtype
                    return (y.float() + h.float()).to(x.dtype)

                def exact(x, r, w, b):
                    y, h = reference.norm(x, w, None if kind == "rms" else b, 1e-6 if kind == "rms" else 1e-5,
                                          rms=kind == "rms", residual=r)
                    return y + h
                return fwd_bwd(ours, exact, [x, r, w, b], [True, True, True, kind != "rms"])
            out[f"{kind}_norm residual n={n} rows={rows} {str(dtype)[6:]}+{str(r_dtype)[6:]}"
                f"{' sliced' if sliced else ''}"] = res
    return {"residual_norm": out}


def kernel_inputs(shape: tuple[int, int], dtype: torch.dtype, t) -> list:
    """``benchmarks.dev.registers``' kernel forms of one case: (label, kernel op, its description
    inputs), leaves drawn by ``t(*shape, dtype=)`` (meta tensors)."""
    m, d = shape
    flags = (False, False, False)  # stable, unit_offset, cast_before_weight
    found = [("rmsnorm", "norm", (t(m, d, dtype=dtype), t(d, dtype=dtype), None, EPS, True, *flags, dtype))]
    for kind in ("rmsnorm", "layernorm"):  # (x, residual, weight, bias, eps, rms, *flags, out_dtype, residual_dtype)
        found.append((f"add_{kind}", "residual_norm",
                      (t(m, d, dtype=dtype), t(m, d, dtype=dtype), t(d, dtype=dtype),
                       t(d, dtype=dtype) if kind == "layernorm" else None, EPS, kind == "rmsnorm", *flags, dtype,
                       dtype)))
    return found


def cases(opts: argparse.Namespace) -> list[tuple[str, torch.dtype, tuple[int, int]]]:
    """The (op, dtype, (rows, row length)) triples a run measures, op by op; add_layernorm
    at the quick shapes only."""
    every = harness.dtype_shape_cases(opts, SHAPES, QUICK_SHAPES)
    quick = harness.dtype_shape_cases(opts, QUICK_SHAPES, QUICK_SHAPES)
    return ([("rmsnorm", *key) for key in every] + [("add_rmsnorm", *key) for key in every]
            + [("add_layernorm", *key) for key in quick])


def implementations(opts: argparse.Namespace) -> dict:
    """Ours and the peers, name -> {op: f} (the op's arguments as in TORCH)."""
    impls = {OURS: OURS_BY_OP, "torch": TORCH}
    if not opts.no_compile:
        impls["compile"] = {op: harness.compiled(fn) for op, fn in TORCH.items()}
    liger = _liger()
    if liger is not None:
        impls["liger"] = liger
    return impls


def build(key: tuple[str, torch.dtype, tuple[int, int]], device: torch.device) -> harness.Case:
    """x (M, D) and a weight away from 1, with dy; with the residual r (and a bias away from 0
    for add_layernorm) and dh for the fused ops; forward and backward."""
    op, dtype, (m, d) = key
    x = torch.randn(m, d, device=device, dtype=dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
    dy = torch.randn_like(x)
    nbytes = m * d * harness.element_size(dtype)
    if op == "rmsnorm":
        directions = harness.fwd_bwd(lambda f: f(x, w), dy, [x, w], 2 * nbytes, 3 * nbytes)
    else:
        inputs = [x, torch.randn_like(x).requires_grad_(), w]
        if op == "add_layernorm":
            inputs.append((0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_())
        directions = harness.fwd_bwd(lambda f: f(*inputs), (dy, torch.randn_like(x)), inputs,
                                     4 * nbytes, 4 * nbytes)
    return harness.Case(f"{m}x{d}", dtype, directions, op=op)


# --sweep-row-limits: name -> (the op it changes, the LayerNormLaunch knob, its value).
# H100 run of 2026-11-23 (norms_row_limits.csv): keeping the fused add forward's rows of 32,768
# whole ran at 97% of copy against 63-65% chunked, and became the default (the sweep keeps the
# old 16,384 as the alternative). RMSNorm's backward kept whole at 16,384 gained 5% in bf16 then;
# once its kernel stopped spilling (ordering, layer_norm.py) tune_norm_backward.py measured
# 74-84% of copy against 54-63% split, plain and with the residual, and RMSNorm's own limit
# (bwd_rms_max_fused_cols, both) became 16,384 (the sweep keeps 8,192 as the alternative).
# LayerNorm's fused add backward lost at 4,096 (46% against 61%): that default stays.
ROW_LIMITS = {
    "bwd<=8192": ("rmsnorm", "bwd_rms_max_fused_cols", 8192),
    "bwd<=32768": ("rmsnorm", "bwd_rms_max_fused_cols", 32768),
    "res-bwd<=8192": ("add_rmsnorm", "bwd_rms_max_fused_cols", 8192),
    "res-fwd<=16384": ("add_rmsnorm", "fwd_residual_max_fused_cols", 16384),
    "ln-res-bwd<=4096": ("add_layernorm", "bwd_residual_max_fused_cols", 4096),
    "ln-res-bwd<=16384": ("add_layernorm", "bwd_residual_max_fused_cols", 16384),
}
DEFAULT_LIMITS = "default"


def _changes_path(op: str, n_cols: int, name: str) -> bool:
    """Whether ROW_LIMITS[name] sends op's rows of n_cols columns down another path than the default."""
    limit_op, knob, value = ROW_LIMITS[name]
    default = getattr(launch_config.DEFAULT.layer_norm, knob)
    return op == limit_op and min(default, value) < n_cols <= max(default, value)


class RowLimits:
    """--sweep-row-limits: ours only, at each (op, dtype, shape) of SHAPES that some ROW_LIMITS
    choice moves to another path, under the default and under each such choice (a bench of its
    own)."""

    OP = "norms_row_limits"

    @staticmethod
    def cases(opts: argparse.Namespace) -> list:
        out = []
        for dtype in harness.dtypes(opts):
            for op in dict.fromkeys(op for op, _, _ in ROW_LIMITS.values()):
                for shape in SHAPES:
                    moved = [name for name in ROW_LIMITS if _changes_path(op, shape[1], name)]
                    out += [((op, dtype, shape), name) for name in ([DEFAULT_LIMITS] + moved if moved else [])]
        return out

    @staticmethod
    def implementations(opts: argparse.Namespace) -> dict:
        return {OURS: OURS_BY_OP}

    @staticmethod
    def build(key: tuple, device: torch.device) -> harness.Case:
        case_key, name = key
        knobs = {} if name == DEFAULT_LIMITS else {ROW_LIMITS[name][1]: ROW_LIMITS[name][2]}
        config = launch_config.DEFAULT.with_knobs("layer_norm", **knobs)
        return harness.under_config(build(case_key, device), config, name)


SWEEP_FLAG = "--sweep-row-limits"


def main(argv: Optional[list[str]] = None) -> None:
    """This file run alone; ``--sweep-row-limits`` (this script's own option, taken out
    before the harness parses the rest) runs RowLimits instead."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if SWEEP_FLAG in argv:
        harness.run_alone(RowLimits, argv=[a for a in argv if a != SWEEP_FLAG])
    else:
        harness.run_alone(sys.modules[__name__], argv=argv)


if __name__ == "__main__":
    main()
