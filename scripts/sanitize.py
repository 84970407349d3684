"""Run every kernel, forward and backward, at odd sizes and at the row-length limits.

The driver that ``scripts/sanitize.sh`` runs under ``compute-sanitizer`` (memcheck,
racecheck, initcheck): each case is small (a few rows), so the instrumented run takes
minutes. The sizes come from the launch config (``triton_layers/launch_config.py``): one below, at and one
above each limit where a kernel changes path (rows in registers vs in chunks, one tile
vs several, one column range vs split columns), plus 1 and odd sizes, sliced (strided)
inputs, masks, and partial gradients. Every result is also checked against the
reference in float64 by the tests' oracle (``tests/oracle.py``, loosely: this is a memory
checker's driver, the tests check accuracy); the exit status is 1 if any case is off, so
the driver is useful without the sanitizer too.

    python3 scripts/sanitize.py                 # on a GPU
    python3 scripts/sanitize.py --tiny          # on the CPU (Triton interpreter), limits shrunk
    python3 scripts/sanitize.py --list          # the case names
    python3 scripts/sanitize.py -k softmax      # the cases whose name contains "softmax"
    python3 scripts/sanitize.py --tiny --every 3  # every third case (the CPU test: CI's time)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

if not torch.cuda.is_available():  # before triton_layers defines its kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.oracle import check  # noqa: E402
from triton_layers import functional as F  # noqa: E402
from triton_layers import reference  # noqa: E402
from triton_layers import launch_config as L  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape, dtype=torch.float32, sliced: bool = False, scale: float = 1.0) -> torch.Tensor:
    """Random values; ``sliced``: a view whose rows are strided (row stride = n + 3)."""
    if not sliced:
        return (scale * torch.randn(shape, device=DEVICE)).to(dtype)
    wide = (scale * torch.randn(*shape[:-1], shape[-1] + 3, device=DEVICE)).to(dtype)
    return wide[..., 1:1 + shape[-1]]


def fwd_bwd(fn: Callable, ref: Callable, inputs: list, needs_grad: list[bool]) -> float:
    """fn and ref (float64) on the same inputs: the output and each requested gradient,
    within the oracle's loose bound (catches garbage, not ulps); the worst error as a
    fraction of its bound."""
    leaves = {f"input{i}": t.detach().requires_grad_(g) if isinstance(t, torch.Tensor) else t
              for i, (t, g) in enumerate(zip(inputs, needs_grad))}
    worst = check(fn, ref, leaves, loose=True).worst
    if DEVICE == "cuda":
        torch.cuda.synchronize()  # a fault is reported against this case
    return worst


def around(limit: int) -> list[int]:
    return [limit - 1, limit, limit + 1]


def cases(C: L.LaunchConfig) -> dict[str, Callable[[], float]]:
    """name -> a thunk running the case and returning its worst relative error."""
    out: dict[str, Callable[[], float]] = {}
    bf = torch.bfloat16

    # LayerNorm: backward rows in registers up to MAX_FUSED_COLS, chunked beyond (two
    # kernels, several row groups); forward rows in registers up to LN_FWD_MAX_FUSED_COLS,
    # chunked beyond; BLOCK_M rows per tile, several tiles per program.
    for n in [1, 7, 33, *around(C.layer_norm.bwd_max_fused_cols), *around(C.layer_norm.fwd_max_fused_cols),
              2 * C.layer_norm.loop_block + 5]:
        # (67 rows: several row groups and tiles per program; 23 still are with the tiny limits,
        # at a third of the interpreter's time)
        many = 67 if DEVICE == "cuda" else 23
        for rows, dtype, stable, sliced in [(3, torch.float32, False, False), (many, bf, True, True)]:
            def ln(n=n, rows=rows, dtype=dtype, stable=stable, sliced=sliced):
                x = rand(rows, n, dtype=dtype, sliced=sliced, scale=2.0)
                w, b = 1 + 0.5 * rand(n), 0.5 * rand(n)
                return fwd_bwd(lambda x, w, b: F.layer_norm(x, w, b, stable=stable, use_triton=True),
                               lambda x, w, b: reference.layer_norm(x, w, b, 1e-5, stable),
                               [x, w, b], [True, True, True])
            flags = (" stable" if stable else "") + (" sliced" if sliced else "")
            out[f"layer_norm n={n} rows={rows} {str(dtype)[6:]}{flags}"] = ln
        for needs in ([True, False, False], [False, True, True]):
            def ln_partial(n=n, needs=needs):
                x, w, b = rand(5, n), rand(n), rand(n)
                return fwd_bwd(lambda x, w, b: F.layer_norm(x, w, b, use_triton=True),
                               lambda x, w, b: reference.layer_norm(x, w, b, 1e-5, False), [x, w, b], needs)
            out[f"layer_norm n={n} grads={''.join('xwb'[i] for i in range(3) if needs[i])}"] = ln_partial

    # RMSNorm and the fused residual add (both norms; its own row limits, and RMSNorm's backward
    # rows kept whole to bwd_rms_max_fused_cols): x and residual
    # of two dtypes (dx and dresidual stored apart) or one (one tensor), strided rows.
    ln = C.layer_norm
    for n in sorted({1, 7, *around(ln.bwd_residual_max_fused_cols), *around(ln.fwd_residual_max_fused_cols),
                     *around(ln.bwd_rms_max_fused_cols), 2 * ln.loop_block + 5}):
        for rows, dtype, r_dtype, kind, sliced in [(3, torch.float32, torch.float32, "rms", False),
                                                   (5, bf, torch.float32, "layer", True)]:
            def res(n=n, rows=rows, dtype=dtype, r_dtype=r_dtype, kind=kind, sliced=sliced):
                x, r = rand(rows, n, dtype=dtype, sliced=sliced, scale=2.0), rand(rows, n, dtype=r_dtype)
                w, b = 1 + 0.5 * rand(n), 0.5 * rand(n)

                def ours(x, r, w, b):  # y and h in one output: gradients reach both
                    if kind == "rms":
                        y, h = F.rms_norm(x, w, 1e-6, residual=r, use_triton=True)
                    else:
                        y, h = F.layer_norm(x, w, b, residual=r, use_triton=True)
                    # in x's dtype: the oracle's loose bound follows the output's dtype
                    return (y.float() + h.float()).to(x.dtype)

                def exact(x, r, w, b):
                    y, h = reference.norm(x, w, None if kind == "rms" else b, 1e-6 if kind == "rms" else 1e-5,
                                          rms=kind == "rms", residual=r)
                    return y + h
                return fwd_bwd(ours, exact, [x, r, w, b], [True, True, True, kind != "rms"])
            out[f"{kind}_norm residual n={n} rows={rows} {str(dtype)[6:]}+{str(r_dtype)[6:]}"
                f"{' sliced' if sliced else ''}"] = res

    # Softmax: rows in registers (several per tile) up to SOFTMAX_MAX_FUSED_COLS, one
    # program walking LOOP_BLOCK chunks beyond; causal (Nq <, =, > Nk) and padding masks.
    for n_k in [1, 17, *around(C.softmax.max_fused_cols), C.softmax.max_fused_cols + C.softmax.loop_block + 3]:
        for n_q, causal, masked, dtype in [(3, False, False, torch.float32), (5, True, True, torch.float16),
                                           (n_k + 2, True, False, bf)]:
            def sm(n_k=n_k, n_q=min(n_q, 40), causal=causal, masked=masked, dtype=dtype):
                x = rand(2, n_q, n_k, dtype=dtype, scale=3.0)
                mask = None
                if masked:
                    mask = torch.rand(2, n_k, device=DEVICE) < 0.3
                    mask[1] = True  # a batch entry that is all padding
                return fwd_bwd(lambda x: F.softmax(x, causal, 0.7, mask, use_triton=True),
                               lambda x: reference.softmax(x, causal, 0.7, mask), [x], [True])
            out[f"softmax nk={n_k} nq={min(n_q, 40)} {str(dtype)[6:]}{' causal' if causal else ''}"
                f"{' padding' if masked else ''}"] = sm

    # Softmax forms that only long rows take, reached at small ones: C with these softmax
    # knobs and rows of up to 128 columns held whole.
    def softmax_under(knobs: dict, n_q: int, n_k: int, causal: bool, masked: bool, dtype: torch.dtype):
        config = dataclasses.replace(C, softmax=dataclasses.replace(
            C.softmax, max_fused_cols=max(C.softmax.max_fused_cols, 128), **knobs))

        def case():
            x = rand(2, n_q, n_k, dtype=dtype, scale=3.0)
            mask = torch.rand(2, n_k, device=DEVICE) < 0.3 if masked else None
            with L.use_config(config):
                return fwd_bwd(lambda x: F.softmax(x, causal, 0.7, mask, use_triton=True),
                               lambda x: reference.softmax(x, causal, 0.7, mask), [x], [True])
        return case

    # The causal forward by classes of rows (softmax_causal_classes) from 64 columns: the short
    # class alone (Nq > Nk), both, the long class alone (Nq < Nk/2).
    for n_k, n_q in [(40, 48), (64, 40), (100, 12)]:
        out[f"softmax causal by classes nk={n_k} nq={n_q} bfloat16 padding"] = softmax_under(
            dict(causal_class_min_cols=64), n_q, n_k, True, True, bf)
    # The backward reading y and dy twice (softmax_bwd_reload) from 64 columns: plain, causal
    # with padding.
    for n_k, causal in [(50, False), (100, True)]:
        out[f"softmax backward reloaded nk={n_k}{' causal padding' if causal else ''} float32"] = softmax_under(
            dict(bwd_reload_min_cols=64), 40, n_k, causal, causal, torch.float32)

    # WeightedSum: tiles of several rows, column ranges split over programs when rows are
    # few (TILE_MAX_COLS), aligned (16-element) and unaligned rows, partial gradients.
    for rows, n in [(1, 1), (7, 17), (1000, 7), (3, C.weighted_sum.tile_max_cols + 1),
                    (2, 16 * C.weighted_sum.tile_max_cols + 5), (5, 2 * C.weighted_sum.tile_max_cols)]:
        for dtype, sliced, needs in [(torch.float32, False, [True, True, True]), (bf, True, [True, True, True]),
                                     (torch.float32, False, [False, True, False]),
                                     (torch.float32, False, [True, False, False])]:
            def ws(rows=rows, n=n, dtype=dtype, sliced=sliced, needs=needs):
                x, w, b = rand(rows, n, dtype=dtype, sliced=sliced), rand(n), rand()
                return fwd_bwd(lambda x, w, b: F.weighted_sum(x, w, b, use_triton=True), reference.weighted_sum,
                               [x, w, b], needs)
            out[f"weighted_sum {rows}x{n} {str(dtype)[6:]}{' sliced' if sliced else ''} "
                f"grads={''.join('xwb'[i] for i in range(3) if needs[i])}"] = ws

    # coor_descent: rows in registers up to MAX_FUSED_COLS, chunked beyond; the backward
    # splits rows into SPLIT_MIN_BLOCK..LOOP_BLOCK chunks; masks, k per row with a gradient.
    for n in [1, 7, *around(C.coor_descent.max_fused_cols), 3 * C.coor_descent.loop_block + 5]:
        for rows, n_iters, masked, dtype in [(3, 3, True, torch.float32), (2, 1, False, bf)]:
            def cd(n=n, rows=rows, n_iters=n_iters, masked=masked, dtype=dtype):
                s, k = rand(rows, n, dtype=dtype, scale=1.5), torch.rand(rows, device=DEVICE) * n / 4 + 0.5
                mask = None
                if masked:
                    mask = torch.rand(rows, n, device=DEVICE) > 0.3
                    mask[0] = False  # a fully masked row
                kw = dict(n_iters=n_iters, eps=0.1, eps_init=1.0, eps_decay=0.7, mask=mask)
                return fwd_bwd(lambda s, k: F.coor_descent(s, k=k, use_triton=True, **kw),
                               lambda s, k: reference.coor_descent(s, n_iters, k, 0.1, 1.0, 0.7, mask),
                               [s, k], [True, True])
            out[f"coor_descent n={n} rows={rows} iters={n_iters} {str(dtype)[6:]}{' mask' if masked else ''}"] = cd
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="shrink the kernels' limits (for the CPU interpreter)")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    parser.add_argument("-k", default="", help="run only the cases whose name contains this")
    parser.add_argument("--every", type=int, default=1, metavar="N",
                        help="run every Nth case of those selected (each kind of case still runs)")
    args = parser.parse_args(argv)
    config = L.TINY if args.tiny else L.DEFAULT
    with L.use_config(config):
        return _run(cases(config), args)


def _run(todo_all: dict, args) -> int:
    torch.manual_seed(0)
    todo = {name: fn for name, fn in todo_all.items() if args.k in name}
    todo = dict(list(todo.items())[::max(1, args.every)])
    if args.list:
        print("\n".join(todo))
        return 0
    failed = []
    start = time.perf_counter()
    for name, fn in todo.items():
        try:
            err = fn()
            print(f"ok    {name}  (worst error {err:.1e} of its bound)", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case, then fail
            failed.append(name)
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)
    print(f"{len(todo) - len(failed)} passed, {len(failed)} failed ({time.perf_counter() - start:.0f} s on {DEVICE}"
          f"{', tiny limits' if args.tiny else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
