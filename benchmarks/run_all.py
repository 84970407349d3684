"""Every benchmark in one process, then the plots and a summary. Needs a CUDA GPU.

    python -m benchmarks [--quick] [--out DIR] [--ops layernorm,softmax,...] [--no-compile]

Runs the op benchmarks (every bench file that declares a ``PART``, benchmarks/parts.py: ours
against torch, torch.compile, Liger and colt5-attention where installed), the end-to-end
training step of the example model (examples/colt5_lm.py, train_step) and of a Hugging
Face Llama converted by triton_layers.convert() (llama_step: needs transformers), with one
progress bar. Each op
cell has two times: the eager call (``us``: host-bound for kernels under ~150 us) and the
GPU time of the same call (``gpu_us``: CUDA-graph replay, or the profiler's kernel sum
where the call cannot be captured); GB/s, % of copy and peer ratios come from ``gpu_us``.
Writes into DIR (default benchmarks/results/<gpu>: h100, h200, ... from the device name):
one CSV per part as soon as it finishes, env.json (GPU, versions, date, copy bandwidth,
wall time per part), the PNG plots (benchmarks/plots.py) and summary.md
(benchmarks/report.py). To redraw or retable from the CSVs alone:
``python -m benchmarks.plots DIR`` and ``python -m benchmarks.report DIR [--update BENCHMARKS.md]``.

Needs: a CUDA GPU (exits at once without one). Time, estimated for one H100 or H200 before a
GPU run of this version (the last full pass, before gpu_us, took 5.5 min for the four ops on
an H200; env.json and summary.md record each part's wall time): about 16-20 minutes for a
full pass: layernorm ~1.5, norms ~3-4 (28 cases: RMSNorm and the fused add + RMSNorm at
layernorm's 12 each, the fused add + LayerNorm at 4), each other op ~1-2, train_step ~4 and
llama_step ~3-4 minutes, most of it torch.compile
compiling the peers (one compile per shape and direction) and the compiled training-step
variants; ``--quick`` about 5-6 minutes. A run can be split over several commands into one
--out folder (e.g. ``--ops layernorm,norms``, then ``--ops softmax,coor_descent``,
then ``--ops train_step,llama_step``): the CSVs add up and env.json keeps the earlier parts'
times and errors.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
from typing import Optional

from benchmarks import parts

# Every bench file that declares a PART, in its order (benchmarks/parts.py): a new one joins --ops by itself.
PARTS = parts.names()
PEER_DISTRIBUTIONS = ("liger-kernel", "colt5-attention")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The harness's options (--quick, --dtypes, --out, --no-compile) plus --ops, --no-plots and the
    training steps' own (--train-configs, --llama-modes)."""
    from benchmarks import bench_llama_step, harness

    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--ops", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    parser.add_argument("--no-plots", action="store_true", help="CSVs and summary only (no matplotlib)")
    parser.add_argument("--train-configs", default=None,
                        help="train_step configs to run (default: all of benchmarks/bench_train_step.py's)")
    bench_llama_step.add_args(parser)
    opts = parser.parse_args(argv)
    opts.ops = [op.strip() for op in opts.ops.split(",") if op.strip()]
    unknown = [op for op in opts.ops if op not in PARTS]
    if unknown or not opts.ops:
        parser.error(f"--ops: unknown {unknown or 'empty list'}; choose from {','.join(PARTS)}")
    if "llama_step" in opts.ops:
        try:
            bench_llama_step.modes(opts)
        except ValueError as exc:
            parser.error(str(exc))
    return opts


class ProgressBar:
    """The harness.Progress of a whole run: tqdm if installed, else one printed line per case.

    Called with a label as each case starts; ``reach(n)`` moves the bar to n finished cases
    (at the end of a part, also when it failed part-way)."""

    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=total, unit="case", dynamic_ncols=True) if tqdm is not None else None
        self.total, self.done, self.open, self.start = total, 0, False, time.time()

    def __call__(self, label: str) -> None:
        if self.open:
            self.reach(self.done + 1)
        self.open = True
        if self.bar is not None:
            self.bar.set_description(label)
        else:
            print(f"[{self.done + 1}/{self.total}, {time.time() - self.start:.0f} s] {label}", flush=True)

    def reach(self, done: int) -> None:
        """Count ``done`` cases as finished."""
        self.open = False
        if self.bar is not None and done > self.done:
            self.bar.update(done - self.done)
        self.done = max(done, self.done)

    def close(self) -> None:
        """Finish the bar."""
        if self.bar is not None:
            self.bar.close()


def environment(opts: argparse.Namespace, argv: list[str], copy_gbps: float) -> dict:
    """What BENCHMARKS.md names: GPU, versions (ours, peers), date, copy bandwidth, command."""
    import torch
    import triton

    env = {"gpu": "cpu (dry run)", "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(),
           "date": datetime.date.today().isoformat(), "copy_gbps": round(copy_gbps, 1), "quick": opts.quick,
           "command": " ".join(["python -m benchmarks"] + argv), "peers": {}, "wall_s": {}, "errors": {}}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    for dist in PEER_DISTRIBUTIONS:
        try:
            env["peers"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env["peers"][dist] = "not installed"
    return env


def merge_previous(env: dict, out: str, parts: list[str]) -> None:
    """Keep what an earlier run on the same GPU wrote into ``out`` for the parts not run now
    (a full pass split over two commands, e.g. ``--ops coor_descent,train_step`` after the others)."""
    try:
        with open(os.path.join(out, "env.json")) as f:
            previous = json.load(f)
    except (OSError, ValueError):
        return
    if previous.get("gpu") != env["gpu"]:
        return
    kept = [part for part in previous.get("wall_s", {}) if part not in parts]
    if not kept:
        return
    for key in ("wall_s", "errors"):
        env[key].update({part: v for part, v in previous.get(key, {}).items() if part in kept})
    env["command"] = f"{previous.get('command')}; {env['command']}"


def run_parts(opts: argparse.Namespace, env: dict) -> None:
    """Run each selected part, writing its CSV and env.json as it finishes; a part that raises is
    recorded in env['errors'] and the others still run."""
    import torch
    import torch._dynamo

    from benchmarks import harness

    modules = {op: importlib.import_module(parts.part(op).module) for op in opts.ops}
    counts = {op: len(module.cases(opts)) for op, module in modules.items()}
    out = harness.results_dir(opts)
    bar = ProgressBar(sum(counts.values()))
    finished = 0
    try:
        for op, module in modules.items():
            start = time.time()
            try:
                # an op's bench declares its cases (harness.run_cases); the training step runs its own
                run = getattr(module, "run", None) or (lambda *args: harness.run_cases(module, *args))
                harness.write_csv(run(opts, env["copy_gbps"], bar), os.path.join(out, f"{op}.csv"))
            except Exception as exc:  # keep the other parts: the GPU session is short
                traceback.print_exc()
                env["errors"][op] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            env["wall_s"][op] = round(time.time() - start, 1)
            finished += counts[op]
            bar.reach(finished)
            with open(os.path.join(out, "env.json"), "w") as f:
                json.dump(env, f, indent=1)
            torch._dynamo.reset()  # the compiled peers of this part are not used again
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    finally:
        bar.close()


def main(argv: Optional[list[str]] = None) -> int:
    """Parse, run every selected part, draw the plots, write summary.md; 1 if a part failed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = parse_args(argv)
    from benchmarks import harness, report

    harness.require_cuda()
    out = harness.results_dir(opts)
    os.makedirs(out, exist_ok=True)
    start = time.time()
    env = environment(opts, argv, harness.copy_bandwidth_gbps(harness.device()))
    merge_previous(env, out, opts.ops)
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, copy {env['copy_gbps']:.0f} GB/s; "
          f"writing to {out}", flush=True)
    run_parts(opts, env)
    if not opts.no_plots:
        try:
            from benchmarks import plots

            plots.plot_all(out)
        except ImportError as exc:
            print(f"plots skipped ({exc}); draw them later with python -m benchmarks.plots {out}")
    summary = report.write_summary(out)
    print(f"done in {time.time() - start:.0f} s: {summary}")
    for op, message in env["errors"].items():
        print(f"FAILED {op}: {message}", file=sys.stderr)
    return 1 if env["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
