"""Host cost of one eager call at tiny shapes, ours against torch's own op (GPU only).

At these shapes the GPU work is negligible, so an eager call is timed at the host's pace:
Python, argument checks, autograd, the launcher. Each cell is the time per call of N
calls followed by one sync, ours and torch's interleaved (ABAB...) over several rounds so
that the host's drift hits both alike: the median, with the min-max of the rounds. Beside
it, the GPU time of the same call (``harness.gpu_time_us``: replayed from a CUDA graph, or
the profiler's kernel time where it cannot be captured): what is left once the host is
out of the way.

    python -m benchmarks.bench_host --out DIR            # host.csv, and a table
    python -m benchmarks.bench_host --out DIR --profile  # + host_profile.txt (cProfile of ours)
    python -m benchmarks.bench_host --out DIR --backward-on-caller  # host_caller.csv
    python -m benchmarks.bench_host --out DIR --parts    # host_parts.csv: where a LayerNorm call's time goes
    python -m benchmarks.bench_host --out DIR --against OLD --pairs 4  # host_ab.csv: this checkout against OLD

``--against OLD`` (a checkout of another commit, e.g. ``git worktree add OLD <commit>``) runs
the whole measurement in OLD and here by turns, ``--pairs`` times, in ABBA order (the one run
first alternates: the first run after a machine starts is often the slowest), each a process
of its own, and reports per call the change of ours/torch (after over before) in each pair:
the median and the min-max over the pairs. A change whose spread crosses 1.0 is a tie.

Three calls per op: ``fwd`` (inputs that need gradients: the autograd node is built),
``fwd+bwd``, and ``fwd no_grad`` (under ``torch.no_grad()``: serving, where our ops skip the
autograd node altogether).

``--parts`` times the layers of one eager LayerNorm forward (8x256, weight and bias)
one by one, interleaved, beside the fixed costs any eager op of ours pays (an empty
``autograd.Function``, one ``torch.empty_like``, one launch each way): the differences
between successive layers are what each layer adds (:data:`PARTS`).

``--backward-on-caller`` runs every backward on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``), for ours and torch's alike: autograd
hands a CUDA graph's backward to its device's worker thread, and a Python autograd.Function
(ours) pays that thread's GIL on top; the difference between the two tables is that handoff.
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import io
import os
import pstats
import statistics
import time
from typing import Callable, Optional

import torch

from benchmarks import harness, parts
from triton_layers import functional as F

CALLS = 300
ROUNDS = 7
WARMUP = 30  # calls before timing: compiles, caches
MODES = ("fwd", "fwd+bwd", "fwd no_grad")


def _cases(dev) -> dict[str, tuple[list, Callable, Callable]]:
    """op -> (leaf inputs that need gradients, ours, torch's), each a function of the leaves: the
    ``host_cases(r, dev)`` of each op part's bench file (benchmarks/parts.py), in the parts' order."""
    r = lambda *s: torch.randn(*s, device=dev, requires_grad=True)  # noqa: E731
    cases = {}
    for own in parts.provided("host_cases"):
        cases.update(own(r, dev))
    return cases


def _step(fn, leaves, mode: str) -> Callable[[], None]:
    """One call of ``fn`` as ``mode`` (one of MODES) times it."""
    if mode == "fwd":
        return lambda: fn(*leaves)
    if mode == "fwd no_grad":
        def serve():
            with torch.no_grad():
                return fn(*leaves)
        return serve
    dy = torch.randn_like(fn(*leaves))
    return lambda: torch.autograd.grad(fn(*leaves), leaves, dy)


def host_us(step: Callable[[], None], calls: Optional[int] = None) -> float:
    """Host time per call of ``calls`` (default CALLS) calls of ``step`` followed by one sync, in us."""
    calls = CALLS if calls is None else calls
    sync = torch.cuda.synchronize if torch.cuda.is_available() else _nothing  # (CPU: bench_tp_step --quick)
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        step()
    sync()
    return (time.perf_counter() - t) / calls * 1e6


def _nothing() -> None:
    pass


def interleaved(steps: dict[str, Callable[[], None]], rounds: Optional[int] = None, calls: Optional[int] = None,
                warmup: Optional[int] = None) -> dict[str, list[float]]:
    """Each step's host time per call (:func:`host_us` of ``calls`` calls) in each of ``rounds``
    rounds, the steps taking turns within a round (A B A B ...) so that the host's drift hits
    all alike; after ``warmup`` calls of each. (None: CALLS, ROUNDS, WARMUP, read at the call.)"""
    rounds = ROUNDS if rounds is None else rounds
    calls = CALLS if calls is None else calls
    warmup = WARMUP if warmup is None else warmup
    for step in steps.values():
        host_us(step, warmup)
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(host_us(step, calls))
    return times


def measure(dev) -> list[dict]:
    rows = []
    for op, (leaves, ours, theirs) in _cases(dev).items():
        for mode in MODES:
            steps = {"triton_layers": _step(ours, leaves, mode), "torch": _step(theirs, leaves, mode)}
            times = interleaved(steps)
            for impl, step in steps.items():
                t = times[impl]
                rows.append(dict(op=op, mode=mode, impl=impl, rounds=ROUNDS, calls=CALLS,
                                 host_us=round(statistics.median(t), 1), host_us_min=round(min(t), 1),
                                 host_us_max=round(max(t), 1),
                                 graph_us=round(harness.gpu_time_us(lambda step=step: step)[0], 2)))
    return rows


def profile(dev, out: str) -> None:
    """cProfile of our fwd+bwd calls, op by op: where the host time goes."""
    buf = io.StringIO()
    for op, (leaves, ours, _) in _cases(dev).items():
        step = _step(ours, leaves, "fwd+bwd")
        host_us(step, WARMUP)
        prof = cProfile.Profile()
        prof.enable()
        host_us(step, 500)
        prof.disable()
        buf.write(f"\n===== {op}: 500 fwd+bwd calls =====\n")
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
    with open(os.path.join(out, "host_profile.txt"), "w") as f:
        f.write(buf.getvalue())


# (name, what it is, nested) of each part --parts times. The nested ones are the layers of one
# call, outermost first: each one's time less the next one's is what that layer adds; the
# others are references beside them.
PARTS = (
    ("torch F.layer_norm", "torch's op, whole (the reference)", False),
    ("functional.layer_norm", "ours, whole: the call signature's key, its plan looked up, the door", True),
    ("planned door (Op.call_planned)", "device guard, grad-mode choice", True),
    ("autograd.Function.apply", "the autograd node, saving for the backward", True),
    ("forward run (plan made)", "allocations and the launch the plan decided", True),
    ("launch, planned (KernelCall)", "the compiled kernel the plan keeps, its C launch", True),
    ("launch, C launcher alone", "Triton's compiled launcher (argument parsing, cuLaunchKernelEx)", True),
    ("checks and plan (unplanned call)", "what a plan saves: the functional's checks, the launch's geometry, the "
     "whole call through a plan made anew", False),
    ("launch, cached (_FastLaunch)", "specialization key, cache lookup, the C launch (a launch no plan holds)", False),
    ("launch, JITFunction.run", "Triton's own per-call binding (what _FastLaunch skips)", False),
    ("empty autograd.Function", "a Function whose forward allocates one tensor and saves three: the node's floor",
     False),
    ("torch.empty_like", "one output allocated from Python", False),
)


def part_steps(dev) -> dict[str, Callable[[], None]]:
    """Each part of :data:`PARTS` as a call to time, on one LayerNorm problem (8x256)."""
    from triton_layers.calls import doors as _doors, fast_launch as _fast_launch, eager as _eager
    from triton_layers.kernels import ops

    x, w, b = (torch.randn(*s, device=dev, requires_grad=True) for s in ((8, 256), (256,), (256,)))
    flags = (1e-5, False, False, False, False, x.dtype)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    op = ops.norm
    plan = op.plan(x, w, b, *flags)
    op.call_planned(plan, x, w, b, *flags)  # compiles
    kernel_call = plan.forward.kernel
    # (a second launch: the plan's launch keeps the compiled kernel from then on)
    y, stats = plan.run_forward(_fast_launch.direct, plan.forward, xd, wd, bd, *flags)
    tensors = (xd, None, None, y, wd, bd, stats)  # the kernel's tensors, as the forward run passes them
    args, constexprs = (*tensors, *kernel_call.scalars), kernel_call.constexprs
    fast = _fast_launch.direct(kernel_call.kernel)
    fast[kernel_call.grid](*args, **constexprs)

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, *flags):
            out = torch.empty_like(x)
            ctx.save_for_backward(x, w, b)
            return out

        @staticmethod
        def backward(ctx, dy):
            return (dy,) + (None,) * 8

    def unplanned():
        _eager.clear_plans()  # (every op's plan cache: the call checks and plans from scratch)
        F.layer_norm(x, w, b)

    empty_apply = super(torch.autograd.Function, Empty).apply  # as the door calls its own
    steps = {
        "torch F.layer_norm": lambda: torch.nn.functional.layer_norm(x, (256,), w, b),
        "functional.layer_norm": lambda: F.layer_norm(x, w, b),
        "planned door (Op.call_planned)": lambda: op.call_planned(plan, x, w, b, *flags),
        "autograd.Function.apply": lambda: op._planned_apply(plan, x, w, b, *flags),
        "forward run (plan made)": lambda: plan.run_forward(_fast_launch.direct, plan.forward, xd, wd, bd, *flags),
        "launch, planned (KernelCall)": lambda: kernel_call(_fast_launch.direct, *tensors),
        "checks and plan (unplanned call)": unplanned,
        "launch, cached (_FastLaunch)": lambda: fast[kernel_call.grid](*args, **constexprs),
        "launch, JITFunction.run": lambda: kernel_call.kernel[kernel_call.grid](*args, **constexprs),
        "empty autograd.Function": lambda: empty_apply(x, w, b, *flags),
        "torch.empty_like": lambda: torch.empty_like(xd),
    }
    hit = kernel_call._hit  # (a falsy placeholder under the interpreter)
    if hit:
        c_launch, g0, g1, g2, function, prefix, tail = hit
        stream = torch.cuda.current_stream(dev).cuda_stream
        steps["launch, C launcher alone"] = lambda: c_launch(g0, g1, g2, stream, function, *prefix, *tensors, *tail)
    return steps


def measure_parts(dev) -> list[dict]:
    """host_parts.csv: each part's host time per call, all parts interleaved round by round."""
    times = interleaved(part_steps(dev))
    return [dict(part=name, what=what, nested=int(nested), rounds=ROUNDS, calls=CALLS,
                 host_us=round(statistics.median(times[name]), 2), host_us_min=round(min(times[name]), 2),
                 host_us_max=round(max(times[name]), 2))
            for name, what, nested in PARTS if name in times]


def print_table(rows: list[dict]) -> None:
    print(f"host time per eager call (median of {ROUNDS} interleaved rounds of {CALLS} calls, [min-max]); "
          f"graph: the GPU time of the same call (CUDA-graph replay, or the profiler's kernel time)")
    by = {(r["op"], r["mode"], r["impl"]): r for r in rows}
    print(f"{'op':34} {'mode':11} {'ours us':>18} {'torch us':>18} {'ratio':>6} {'graph ours':>10} {'graph torch':>11}")
    for (op, mode, impl), r in by.items():
        if impl != "triton_layers":
            continue
        t = by[(op, mode, "torch")]
        print(f"{op:34} {mode:11} {r['host_us']:7.1f} [{r['host_us_min']:.0f}-{r['host_us_max']:.0f}]"
              f"{t['host_us']:9.1f} [{t['host_us_min']:.0f}-{t['host_us_max']:.0f}] {r['host_us'] / t['host_us']:6.2f}"
              f" {r['graph_us']:10.2f} {t['graph_us']:11.2f}")


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _run_in(checkout: str, out: str) -> dict:
    """One whole measurement (a process of its own) in ``checkout``: host_us by (op, mode, impl)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "benchmarks.bench_host", "--out", out], cwd=checkout, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "host.csv")) as f:
        return {(r["op"], r["mode"], r["impl"]): float(r["host_us"]) for r in csv.DictReader(f)}


def compare(before: str, after: str, pairs: int, out: str) -> list[dict]:
    """``pairs`` ABBA-ordered pairs of whole runs in ``before`` and ``after`` (checkouts): per
    call, the change of ours/torch (after over before) in each pair, its median and min-max;
    beside it the change of ours alone (``ours_*``: torch's call in the same process does not
    correct it for a process or machine that runs everything slower)."""
    changes: dict = {}
    alone: dict = {}
    for i in range(pairs):
        order = [("before", before), ("after", after)]
        runs = dict((name, _run_in(path, os.path.join(out, f"ab_{name}_{i}")))
                    for name, path in (order if i % 2 == 0 else order[::-1]))
        for (op, mode, impl), us in runs["after"].items():
            if impl != "torch":
                ratio = (us / runs["after"][(op, mode, "torch")]) / (
                    runs["before"][(op, mode, impl)] / runs["before"][(op, mode, "torch")])
                changes.setdefault((op, mode), []).append(ratio)
                alone.setdefault((op, mode), []).append(us / runs["before"][(op, mode, impl)])
    return [dict(op=op, mode=mode, pairs=len(c), change=statistics.median(c), change_min=min(c),
                 change_max=max(c), ours_change=statistics.median(alone[op, mode]),
                 ours_change_min=min(alone[op, mode]), ours_change_max=max(alone[op, mode]))
            for (op, mode), c in changes.items()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--profile", action="store_true", help="also write host_profile.txt (cProfile)")
    parser.add_argument("--parts", action="store_true",
                        help="time the layers of one eager LayerNorm call instead; writes host_parts.csv")
    parser.add_argument("--backward-on-caller", action="store_true",
                        help="backward on the calling thread (set_multithreading_enabled(False)); writes host_caller.csv")
    parser.add_argument("--against", metavar="OLD", help="another checkout to compare with (writes host_ab.csv)")
    parser.add_argument("--pairs", type=int, default=4, help="with --against: pairs of whole runs")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_host needs a CUDA GPU")
    if args.against:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rows = compare(os.path.abspath(args.against), here, args.pairs, os.path.abspath(args.out))
        write_csv(os.path.join(args.out, "host_ab.csv"), rows)
        print(f"this checkout over {args.against}, median (min-max) of {args.pairs} ABBA pairs: ours/torch; ours alone")
        for r in rows:
            tie = " (tie)" if r["change_min"] <= 1.0 <= r["change_max"] else ""
            print(f"{r['op']:34} {r['mode']:12} {r['change']:.2f} ({r['change_min']:.2f}-{r['change_max']:.2f}){tie:6}"
                  f"  {r['ours_change']:.2f} ({r['ours_change_min']:.2f}-{r['ours_change_max']:.2f})")
        return
    dev = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)
    if args.parts:
        rows = measure_parts(dev)
        write_csv(os.path.join(args.out, "host_parts.csv"), rows)
        for r in rows:
            print(f"{r['part']:32} {r['host_us']:8.1f} us [{r['host_us_min']:.1f}-{r['host_us_max']:.1f}]  {r['what']}")
        return
    with torch.autograd.set_multithreading_enabled(not args.backward_on_caller):
        rows = measure(dev)
    write_csv(os.path.join(args.out, "host_caller.csv" if args.backward_on_caller else "host.csv"), rows)
    print_table(rows)
    if args.profile:
        profile(dev, args.out)


if __name__ == "__main__":
    main()
