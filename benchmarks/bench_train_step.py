"""End-to-end training step of the example CoLT5 LM: forward + backward + AdamW step.

The model is the example's (``examples.colt5_lm``: ``build_model``, ``lm_loss``) at two
GPU-sized configs (CONFIGS: today's B16 T1024 d512 and a larger B8 T2048 d1024), bf16
autocast on CUDA. Each config is built from one state_dict in every (mode, impl):

- impl ``torch`` (the plain torch layers) and ``triton_layers`` (ours);
- mode ``eager``, ``compile`` (``torch.compile`` default of the model) and ``cudagraphs``
  (``torch.compile(mode="reduce-overhead")``: the same, replayed as CUDA graphs).

The AdamW step (foreach) is eager in every variant. Each variant is built, compiled and
warmed up once, its peak memory taken on one more step; then the variants are timed
interleaved: ROUNDS rounds, each timing ``steps_per_round`` steps of every variant in turn
(so host drift hits all alike). Reported per variant: the median over the rounds of the
round's time per step, with its min-max; tokens/s from the median; ``peak_mib``: the memory
allocated above what was allocated before the variant was built, at the peak of a step
(parameters, gradients, AdamW state, activations; a cudagraphs variant's graph memory);
``gpu_busy_pct``: the kernel time of a few profiled steps (torch.profiler) over the step
time; ``launches_per_step``: kernel events per step in that profile (a CUDA graph's kernels
each count) and ``launch_calls_per_step``: host calls launching a kernel or a graph;
``loss``: the first step's loss (same weights and batch everywhere: they should agree).
About 3-4 minutes on one H100, most of it compiling the 8 compiled variants.
Run: python -m benchmarks.bench_train_step [--quick] [--no-compile] [--train-configs small] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import time
from typing import Callable, Optional

import torch

from benchmarks import harness, report
from examples import colt5_lm

OURS = "triton_layers"
IMPLS = {"torch": "torch", OURS: "triton"}  # our name -> build_model's impl
MODES = ("eager", "compile", "cudagraphs")
LR = 3e-4
USE_TRITON = None  # our layers' use_triton: auto, the kernels on CUDA (the CPU dry run sets False)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A model config of examples.colt5_lm at a batch size, and how many steps a round times."""

    batch: int
    model: dict  # LMConfig fields
    steps_per_round: int


CONFIGS = {
    "small": TrainConfig(16, dict(seq_len=1024, dim=512, heads=8, depth=4, heavy_tokens=256), 5),
    # ~4x the work of small; torch eager peaks near 25 GB, all six variants together well under 80 GB
    "large": TrainConfig(8, dict(seq_len=2048, dim=1024, heads=16, depth=4, heavy_tokens=512), 2),
}
ROUNDS = {False: 7, True: 5}  # quick -> rounds
WARMUP = {"eager": 2, "compile": 3, "cudagraphs": 3}  # steps before timing (compiling, recording graphs)
PROFILED_STEPS = {False: 3, True: 1}


@dataclasses.dataclass
class StepResult:
    """One (config, mode, impl): a row of train_step.csv."""

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


@dataclasses.dataclass
class Variant:
    """A built, compiled and warmed-up (mode, impl) of one config, and its round times."""

    mode: str
    impl: str
    step: Optional[Callable[[], torch.Tensor]]  # None if building or warming up failed
    loss: float = float("nan")
    peak_mib: float = float("nan")
    times_ms: list = dataclasses.field(default_factory=list)
    profile: tuple = (float("nan"), float("nan"), float("nan"))  # busy %, kernels, launch calls per step


def configs(opts: argparse.Namespace) -> list[str]:
    """The configs a run measures: --train-configs, else small only with --quick, else all."""
    chosen = getattr(opts, "train_configs", None)
    names = [c.strip() for c in chosen.split(",") if c.strip()] if chosen else (
        ["small"] if opts.quick else list(CONFIGS))
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise ValueError(f"--train-configs: unknown {unknown}; choose from {','.join(CONFIGS)}")
    return names


def variants(opts: argparse.Namespace) -> list[tuple[str, str]]:
    """The (mode, impl) pairs of a config, in the order each round runs them."""
    modes = ["eager"] if opts.no_compile else list(MODES)
    return [(mode, impl) for mode in modes for impl in IMPLS]


def cases(opts: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(config, mode, impl) of a run, in order (one progress step each)."""
    return [(config, mode, impl) for config in configs(opts) for mode, impl in variants(opts)]


def compile_model(model: torch.nn.Module, mode: str) -> Callable:
    """The model's forward in ``mode``: itself, torch.compile default, or reduce-overhead."""
    if mode == "eager":
        return model
    harness.raise_recompile_limits()  # each variant of a config recompiles the same forward
    return torch.compile(model, mode="reduce-overhead" if mode == "cudagraphs" else None)


def _label(config: TrainConfig, cuda: bool) -> str:
    m = config.model
    return (f"B{config.batch} T{m['seq_len']} d{m['dim']} h{m['heads']} L{m['depth']} heavy{m['heavy_tokens']}"
            + (" bf16-autocast" if cuda else ""))


def _build(mode: str, impl: str, lm_config, state: dict, tokens: torch.Tensor) -> Variant:
    """Build, compile and warm up one variant; measure its first loss and peak memory."""
    device = tokens.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    model = colt5_lm.build_model(lm_config, impl=IMPLS[impl], use_triton=USE_TRITON if impl == OURS else None)
    model = model.to(device)
    model.load_state_dict(state)
    forward = compile_model(model, mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> torch.Tensor:
        if mode == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = colt5_lm.lm_loss(forward, inputs, targets)
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


def _time_round(variant: Variant, steps: int, cuda: bool) -> None:
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


def _profile(variant: Variant, steps: int) -> tuple[float, float, float]:
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


def _failed(what: str, exc: Exception) -> None:
    print(f"    {what} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
          file=sys.stderr)


def run_config(name: str, opts: argparse.Namespace, progress: harness.Progress) -> list[StepResult]:
    """Build every variant of one config, time them interleaved, profile them; one row each."""
    config = CONFIGS[name]
    device = harness.device()
    cuda = device.type == "cuda"
    lm_config = colt5_lm.LMConfig(**config.model)
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in colt5_lm.build_model(lm_config, impl="torch").state_dict().items()}
    tokens = torch.randint(0, lm_config.vocab_size, (config.batch, lm_config.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    built = []
    for mode, impl in variants(opts):
        progress(f"train_step {name} {mode} {impl}")
        try:
            built.append(_build(mode, impl, lm_config, state, tokens))
        except Exception as exc:  # e.g. out of memory or a compile error: keep the other variants
            _failed(f"{name} {mode} {impl}", exc)
            built.append(Variant(mode, impl, None))
    rounds = ROUNDS[opts.quick]
    for _ in range(rounds):  # interleaved: every variant once per round, in the same order
        for variant in built:
            if variant.step is not None:
                try:
                    _time_round(variant, config.steps_per_round, cuda)
                except Exception as exc:
                    _failed(f"{name} {variant.mode} {variant.impl}", exc)
                    variant.step, variant.times_ms = None, []
    if cuda:
        for variant in built:
            if variant.step is not None and variant.times_ms:
                try:
                    variant.profile = _profile(variant, PROFILED_STEPS[opts.quick])
                except Exception as exc:  # the timings stand without the profile
                    _failed(f"profiling {name} {variant.mode} {variant.impl}", exc)
    rows = []
    for v in built:
        ms = statistics.median(v.times_ms) if v.times_ms else float("nan")
        low, high = (min(v.times_ms), max(v.times_ms)) if v.times_ms else (float("nan"),) * 2
        rows.append(StepResult(_label(config, cuda), v.mode, v.impl, config.batch, lm_config.seq_len, rounds,
                               config.steps_per_round, ms, low, high, config.batch * lm_config.seq_len / (ms / 1e3),
                               v.peak_mib, *v.profile, v.loss))
    return rows


INT_COLUMNS = ("batch", "seq_len", "rounds", "steps_per_round")


def earlier_rows(path: str, now: set[str]) -> list[StepResult]:
    """The rows of an existing train_step.csv at ``path`` whose config is not in ``now``: a run
    split over commands (--train-configs small, then large) keeps the configs of both."""
    if not os.path.exists(path):
        return []
    names = [field.name for field in dataclasses.fields(StepResult)]
    rows = [r for r in report.read_csv(path) if set(names) <= set(r) and r["config"] not in now]
    return [StepResult(**{n: int(r[n]) if n in INT_COLUMNS else r[n] for n in names}) for r in rows]


def run(opts: argparse.Namespace, copy_gbps: float = float("nan"),
        progress: harness.Progress = harness.no_progress) -> list[StepResult]:
    """The rows of every config run now, after those of other configs already in the results
    folder's train_step.csv (``copy_gbps`` unused). The compiled graphs and memory of one config
    are released before the next."""
    cuda = harness.device().type == "cuda"
    now = {_label(CONFIGS[name], cuda) for name in configs(opts)}
    results = earlier_rows(os.path.join(harness.results_dir(opts), "train_step.csv"), now)
    for name in configs(opts):
        results += run_config(name, opts, progress)
        torch._dynamo.reset()  # drop the compiled graphs and the CUDA-graph pools they hold
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def main(argv: Optional[list[str]] = None) -> None:
    parser = harness.add_common_args(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--train-configs", default=None, help=f"comma-separated subset of {','.join(CONFIGS)}")
    opts = parser.parse_args(argv)
    harness.require_cuda()
    results = run(opts)
    harness.emit(["## training step", ""] + report.train_table([dataclasses.asdict(r) for r in results]))
    harness.write_csv(results, os.path.join(harness.results_dir(opts), "train_step.csv"))


if __name__ == "__main__":
    main()
