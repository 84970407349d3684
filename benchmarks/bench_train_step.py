"""End-to-end training step of the example CoLT5 LM: forward + backward + AdamW step.

The model is the example's (``examples.colt5_lm``: ``build_model``, ``lm_loss``) at a GPU-sized
config (CONFIG, batch BATCH, bf16 autocast on CUDA), built four ways from one state_dict:
``triton_layers`` (our layers, eager), ``torch`` (the plain torch layers, eager),
``torch-compile`` (``torch.compile(dynamic=False)`` of the plain torch model) and, in the
full pass, ``triton_layers-compile`` (the same of ours). The AdamW step (foreach) is eager
in every variant. Each variant runs warm-up steps (compilation happens there), then
timed steps, each between two CUDA events: the median is the step time, batch * seq_len
over it the tokens/s. Peak memory is ``torch.cuda.max_memory_allocated`` during the timed
steps (parameters, gradients, AdamW state and activations). ``loss`` is the first step's
loss: every variant starts from the same weights and batch, so they should agree.
Run: python -m benchmarks.bench_train_step [--quick] [--no-compile] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from types import ModuleType
from typing import Callable

import torch

from benchmarks import harness, report
from examples import colt5_lm
CONFIG = dict(seq_len=1024, dim=512, heads=8, depth=4, heavy_tokens=256)
BATCH = 16
STEPS = {False: (5, 20), True: (3, 5)}  # quick -> (warm-up steps, timed steps)
LR = 3e-4


@dataclasses.dataclass
class StepResult:
    """One variant's training step: a row of train_step.csv."""

    config: str
    impl: str
    batch: int
    seq_len: int
    step_ms: float  # median; nan if the variant failed
    tokens_per_s: float
    peak_mib: float
    loss: float  # first step's loss (same weights and batch for every variant)


def cases(opts: argparse.Namespace) -> list[str]:
    """The variants a run measures, in order."""
    variants = ["triton_layers", "torch"]
    if not opts.no_compile:
        variants.append("torch-compile")
        if not opts.quick:
            variants.append("triton_layers-compile")
    return variants


def _median_step_ms(step: Callable[[], object], n: int, cuda: bool) -> float:
    """Median time of ``step`` over n calls: CUDA events on a GPU, the wall clock otherwise."""
    times = []
    for _ in range(n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _measure(example: ModuleType, variant: str, config, state: dict, tokens: torch.Tensor, quick: bool) -> tuple:
    """(step ms, peak MiB, first loss) of one variant."""
    device = tokens.device
    cuda = device.type == "cuda"
    impl = "triton" if variant.startswith("triton_layers") else "torch"
    model = example.build_model(config, impl=impl).to(device)
    model.load_state_dict(state)
    forward = harness.compiled(model) if variant.endswith("-compile") else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = example.lm_loss(forward, inputs, targets)
        loss.backward()
        optimizer.step()
        return loss

    warmup, timed = STEPS[quick]
    first_loss = step().item()
    for _ in range(warmup - 1):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ms = _median_step_ms(step, timed, cuda)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
    return ms, peak, first_loss


def run(opts: argparse.Namespace, copy_gbps: float = float("nan"),
        progress: harness.Progress = harness.no_progress) -> list[StepResult]:
    """Time a training step of every variant; returns one StepResult each (``copy_gbps`` unused).

    A variant that fails (e.g. out of memory, or a compile error) gets a row of nans and a
    message on stderr, so one failure does not lose the others."""
    example = colt5_lm
    device = harness.device()
    config = example.LMConfig(**CONFIG)
    label = (f"B{BATCH} T{config.seq_len} d{config.dim} h{config.heads} L{config.depth} "
             f"heavy{config.heavy_tokens}" + (" bf16-autocast" if device.type == "cuda" else ""))
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in example.build_model(config, impl="torch").state_dict().items()}
    tokens = torch.randint(0, config.vocab_size, (BATCH, config.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    results = []
    for variant in cases(opts):
        progress(f"train_step {variant}")
        try:
            ms, peak, loss = _measure(example, variant, config, state, tokens, opts.quick)
        except Exception as exc:  # record the failure, keep the other variants
            print(f"    {variant} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
            ms = peak = loss = float("nan")
        tokens_per_s = BATCH * config.seq_len / (ms / 1e3) if ms == ms else float("nan")
        results.append(StepResult(label, variant, BATCH, config.seq_len, ms, tokens_per_s, peak, loss))
        if variant.endswith("-compile"):
            torch._dynamo.reset()  # drop the compiled graphs (and the memory they hold)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main() -> None:
    opts = harness.parse_args(__doc__)
    harness.require_cuda()
    results = run(opts)
    harness.emit(["## training step", ""] + report.train_table([dataclasses.asdict(r) for r in results]))
    harness.write_csv(results, os.path.join(harness.results_dir(opts), "train_step.csv"))


if __name__ == "__main__":
    main()
