"""The training-step benchmark loop: variants of one model built from one state_dict, timed
interleaved. Used by ``bench_train_step`` (the example CoLT5 LM) and ``bench_llama_step``
(a Hugging Face Llama).

A bench describes one config as a ``Setup``: how to build a fresh model of an implementation
(``impl``) with the config's weights loaded, and the loss of the config's one batch. For every
(mode, impl) the loop builds the model, compiles it once (mode ``eager``: as it is;
``compile``: ``torch.compile`` default; ``cudagraphs``: ``torch.compile(mode="reduce-overhead")``),
gives it its own AdamW (foreach, eager in every variant) and warms it up (WARMUP steps), taking
the first loss and, on CUDA, the peak memory of one more step. Then the variants are timed
interleaved: ``rounds`` rounds, each timing ``steps_per_round`` steps of every variant in turn,
so host drift hits all alike. A variant that fails (out of memory, a compile error) gets a nan
row and the others go on.

Per variant (a ``StepResult`` row): the median over the rounds of the round's time per step,
with its min-max; tokens/s from the median; ``peak_mib``: the memory allocated above what was
allocated before the variant was built, at the peak of a step (parameters, gradients, AdamW
state, activations; a cudagraphs variant's graph memory); ``gpu_busy_pct``: the kernel time of a
few profiled steps (torch.profiler) over the step time; ``launches_per_step``: kernel events per
step in that profile (a CUDA graph's kernels each count) and ``launch_calls_per_step``: host
calls launching a kernel or a graph; ``loss``: the first step's loss (the same weights and batch
everywhere: they should agree). The report compares step times by the min-max rule
(``report.ratio_text``: a ratio whose spread crosses 1 is a tie).
"""
from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import sys
import time
from typing import Callable, Optional

import torch
from torch import nn

from benchmarks import harness, report

NAN = float("nan")
LR = 3e-4
MODES = ("eager", "compile", "cudagraphs")
WARMUP = {"eager": 2, "compile": 3, "cudagraphs": 3}  # steps before timing (compiling, recording graphs)


@dataclasses.dataclass
class StepResult:
    """One (config, mode, impl): a row of a training-step CSV."""

    config: str
    mode: str
    impl: str
    batch: int
    seq_len: int
    rounds: int
    steps_per_round: int
    step_ms: float  # median over the rounds; nan if the variant failed
    step_ms_min: float
    step_ms_max: float
    tokens_per_s: float
    peak_mib: float
    gpu_busy_pct: float
    launches_per_step: float  # kernel events per step
    launch_calls_per_step: float  # host calls launching a kernel or a graph, per step
    loss: float  # first step's loss
    swapped: float = NAN  # modules the impl's conversion replaced in the model; nan: not a conversion


@dataclasses.dataclass(frozen=True)
class Setup:
    """One config of a training-step benchmark, as the loop needs it."""

    label: str  # the CSV's config column
    batch: int
    seq_len: int  # tokens/s counts batch * seq_len tokens per step
    steps_per_round: int
    model: Callable[[str], nn.Module]  # impl -> a fresh model on the device, the config's weights loaded
    loss: Callable[[Callable], torch.Tensor]  # the model's forward (compiled or not) -> the batch's loss
    autocast: Optional[torch.dtype] = None  # autocast dtype on CUDA; None: the weights' own dtype


@dataclasses.dataclass
class Variant:
    """A built, compiled and warmed-up (mode, impl) of one config, and its round times."""

    mode: str
    impl: str
    step: Optional[Callable[[], torch.Tensor]]  # None if building or warming up failed
    loss: float = NAN
    peak_mib: float = NAN
    times_ms: list = dataclasses.field(default_factory=list)
    profile: tuple = (NAN, NAN, NAN)  # busy %, kernels, launch calls per step

    def step_ms(self) -> tuple[float, float, float]:
        """The median time per step over the rounds, and its min and max (nan where none ran)."""
        if not self.times_ms:
            return NAN, NAN, NAN
        return statistics.median(self.times_ms), min(self.times_ms), max(self.times_ms)


def compile_model(model: nn.Module, mode: str) -> Callable:
    """The model's forward in ``mode``: itself, torch.compile default, or reduce-overhead."""
    if mode == "eager":
        return model
    harness.raise_recompile_limits()  # each variant of a config recompiles the same forward
    return torch.compile(model, mode="reduce-overhead" if mode == "cudagraphs" else None)


def build(setup: Setup, mode: str, impl: str, device: torch.device) -> Variant:
    """Build, compile and warm up one variant; measure its first loss and peak memory."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    model = setup.model(impl)
    forward = compile_model(model, mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    autocast = cuda and setup.autocast is not None

    def step() -> torch.Tensor:
        if mode == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=setup.autocast or torch.bfloat16, enabled=autocast):
            loss = setup.loss(forward)
        loss.backward()
        optimizer.step()
        return loss

    variant = Variant(mode, impl, step, loss=step().item())
    for _ in range(WARMUP[mode] - 1):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        variant.peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    return variant


def paired_ratios(theirs: Variant, ours: Variant) -> tuple[float, float, float]:
    """Their step time over ours in each round (the two timed back to back, so the drift
    between rounds cancels): the median over the rounds, and its min and max (nan where a
    round is missing)."""
    if not theirs.times_ms or len(theirs.times_ms) != len(ours.times_ms):
        return NAN, NAN, NAN
    ratios = [a / b for a, b in zip(theirs.times_ms, ours.times_ms)]
    return statistics.median(ratios), min(ratios), max(ratios)


def time_round(variant: Variant, steps: int, cuda: bool) -> None:
    """Append the time per step of ``steps`` consecutive steps (CUDA events; wall clock on CPU)."""
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            variant.step()
        end.record()
        end.synchronize()
        variant.times_ms.append(start.elapsed_time(end) / steps)
    else:
        t = time.perf_counter()
        for _ in range(steps):
            variant.step()
        variant.times_ms.append((time.perf_counter() - t) * 1e3 / steps)


def profile(variant: Variant, steps: int) -> tuple[float, float, float]:
    """(GPU-busy %, kernels per step, launch calls per step) from torch.profiler over ``steps`` steps."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            variant.step()
        torch.cuda.synchronize()
    gpu_us, kernels, launches = harness.device_activity(prof.events())
    step_us = statistics.median(variant.times_ms) * 1e3
    return 100 * gpu_us / steps / step_us, kernels / steps, launches / steps


def failed(what: str, exc: Exception) -> None:
    """Say on stderr that ``what`` failed, with the first line of why."""
    print(f"    {what} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
          file=sys.stderr)


def build_all(setup: Setup, variants: list[tuple[str, str]], device: torch.device, name: str,
              progress: harness.Progress = harness.no_progress) -> list[Variant]:
    """Every (mode, impl) of ``variants`` built, compiled and warmed up, in this order; one that
    fails (out of memory, a compile error) is said on stderr and kept without a step."""
    built = []
    for mode, impl in variants:
        progress(f"{name} {mode} {impl}")
        try:
            built.append(build(setup, mode, impl, device))
        except Exception as exc:  # keep the other variants
            failed(f"{name} {mode} {impl}", exc)
            built.append(Variant(mode, impl, None))
    return built


def time_interleaved(built: list[Variant], rounds: int, steps: int, cuda: bool, name: str,
                     progress: harness.Progress = harness.no_progress) -> None:
    """``rounds`` rounds, each timing ``steps`` steps of every variant in turn (so host drift
    hits all alike), in reverse order every other round (ABBA: no variant always runs first
    after another's, or last before the next round's); a variant that fails is said on stderr
    and drops out."""
    for r in range(rounds):
        progress(f"{name}: round {r + 1}/{rounds}")
        for variant in (built if r % 2 == 0 else built[::-1]):
            if variant.step is not None:
                try:
                    time_round(variant, steps, cuda)
                except Exception as exc:
                    failed(f"{name} {variant.mode} {variant.impl}", exc)
                    variant.step, variant.times_ms = None, []


def measure(setup: Setup, variants: list[tuple[str, str]], rounds: int, profiled_steps: int, name: str,
            progress: harness.Progress = harness.no_progress) -> list[StepResult]:
    """Build every (mode, impl) of ``variants`` (in this order, which each round keeps), time them
    interleaved over ``rounds`` rounds, profile them on CUDA; one row each. ``name`` labels the
    progress and the failures."""
    device = harness.device()
    cuda = device.type == "cuda"
    built = build_all(setup, variants, device, name, progress)
    time_interleaved(built, rounds, setup.steps_per_round, cuda, name)
    if cuda:
        for variant in built:
            if variant.step is not None and variant.times_ms:
                try:
                    variant.profile = profile(variant, profiled_steps)
                except Exception as exc:  # the timings stand without the profile
                    failed(f"profiling {name} {variant.mode} {variant.impl}", exc)
    rows = []
    for v in built:
        ms, low, high = v.step_ms()
        tokens = setup.batch * setup.seq_len
        rows.append(StepResult(setup.label, v.mode, v.impl, setup.batch, setup.seq_len, rounds,
                               setup.steps_per_round, ms, low, high, tokens / (ms / 1e3), v.peak_mib, *v.profile,
                               v.loss))
    return rows


INT_COLUMNS = ("batch", "seq_len", "rounds", "steps_per_round")


def earlier_rows(path: str, now: set[str]) -> list[StepResult]:
    """The rows of an existing CSV at ``path`` whose config is not in ``now``: a run split over
    commands (one config, then another) keeps the configs of both. Columns a CSV written before
    them lacks (``swapped``) take their defaults."""
    if not os.path.exists(path):
        return []
    fields = dataclasses.fields(StepResult)
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    rows = [r for r in report.read_csv(path) if required <= set(r) and r["config"] not in now]
    return [StepResult(**{f.name: int(r[f.name]) if f.name in INT_COLUMNS else r[f.name]
                          for f in fields if f.name in r}) for r in rows]


def release() -> None:
    """Drop the compiled graphs (and the CUDA-graph pools they hold) and the memory of a config's
    variants before the next."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_configs(path: str, labels: dict[str, str], run_config: Callable[[str], list[StepResult]]) -> list[StepResult]:
    """The rows of every config run now (``labels``: name -> CSV label; ``run_config(name)`` its
    rows), after those of other configs already in the CSV at ``path``; each config's compiled
    graphs and memory are released before the next."""
    results = earlier_rows(path, set(labels.values()))
    for name in labels:
        results += run_config(name)
        release()
    return results
