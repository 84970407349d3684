"""Run every kernel, forward and backward, at odd sizes and at the row-length limits.

The driver that ``scripts/sanitize.sh`` runs under ``compute-sanitizer`` (memcheck,
racecheck, initcheck): each case is small (a few rows), so the instrumented run takes
minutes. The sizes come from the launch config (``triton_layers/launch_config.py``): one below, at and one
above each limit where a kernel changes path (rows in registers vs in chunks, one tile
vs several, one column range vs split columns), plus 1 and odd sizes, sliced (strided)
inputs, masks, and partial gradients. Each op's bench file declares its cases
(``sanitize_cases``, ``benchmarks/sanitizing.py``), named ``<kernel op>: <case>`` here. Every
result is also checked against the reference in float64 (loosely: this is a memory checker's
driver, the tests check accuracy); the exit status is 1 if any case is off, so the driver is
useful without the sanitizer too.

    python3 scripts/sanitize.py                 # on a GPU
    python3 scripts/sanitize.py --tiny          # on the CPU (Triton interpreter), limits shrunk
    python3 scripts/sanitize.py --list          # the case names
    python3 scripts/sanitize.py -k softmax      # the cases whose name contains "softmax"
    python3 scripts/sanitize.py --tiny --every 6  # every sixth case (the CPU test: CI's time)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

if not torch.cuda.is_available():  # before triton_layers defines its kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import parts  # noqa: E402
from benchmarks.sanitizing import DEVICE  # noqa: E402
from triton_layers import launch_config as L  # noqa: E402


def cases(C: L.LaunchConfig) -> dict[str, Callable[[], float]]:
    """``<kernel op>: <case>`` -> a thunk running the case and returning its worst error as a
    fraction of its bound: each op part's ``sanitize_cases(C)``, in the parts' order."""
    out: dict[str, Callable[[], float]] = {}
    for own in parts.provided("sanitize_cases"):
        for op, named in own(C).items():
            out.update({f"{op}: {name}": thunk for name, thunk in named.items()})
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
