"""End-to-end training step of the example CoLT5 LM: forward + backward + AdamW step.

The model is the example's (``examples.colt5_lm``: ``build_model``, ``lm_loss``) at two
GPU-sized configs (CONFIGS: today's B16 T1024 d512 and a larger B8 T2048 d1024), bf16
autocast on CUDA. Each config is built from one state_dict in every (mode, impl):

- impl ``torch`` (the plain torch layers) and ``triton_layers`` (ours);
- mode ``eager``, ``compile`` (``torch.compile`` default of the model) and ``cudagraphs``
  (``torch.compile(mode="reduce-overhead")``: the same, replayed as CUDA graphs).

Each config is a ``train_loop.Setup``; ``benchmarks/train_loop.py`` builds, compiles and warms up
every variant once, times them interleaved (ROUNDS rounds of ``steps_per_round`` steps of each in
turn) and profiles them; its docstring says what each column of train_step.csv means.
About 3-4 minutes on one H100, most of it compiling the 8 compiled variants.
Run: python -m benchmarks.bench_train_step [--quick] [--no-compile] [--train-configs small] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Optional

import torch

from benchmarks import harness, report, train_loop
from examples import colt5_lm

OURS = "triton_layers"
# A part of python -m benchmarks (benchmarks/parts.py): the example model runs every kernel op.
PART = {"order": 60, "kernel_ops": ("norm", "residual_norm", "softmax", "weighted_sum", "coor_descent")}
IMPLS = {"torch": "torch", OURS: "triton"}  # our name -> build_model's impl
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
PROFILED_STEPS = {False: 3, True: 1}


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
    modes = ["eager"] if opts.no_compile else list(train_loop.MODES)
    return [(mode, impl) for mode in modes for impl in IMPLS]


def cases(opts: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(config, mode, impl) of a run, in order (one progress step each)."""
    return [(config, mode, impl) for config in configs(opts) for mode, impl in variants(opts)]


def _label(config: TrainConfig, cuda: bool) -> str:
    m = config.model
    return (f"B{config.batch} T{m['seq_len']} d{m['dim']} h{m['heads']} L{m['depth']} heavy{m['heavy_tokens']}"
            + (" bf16-autocast" if cuda else ""))


def setup(name: str) -> train_loop.Setup:
    """Config ``name`` for the loop: one state_dict and one batch for every variant, bf16 autocast on CUDA."""
    config = CONFIGS[name]
    device = harness.device()
    lm_config = colt5_lm.LMConfig(**config.model)
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in colt5_lm.build_model(lm_config, impl="torch").state_dict().items()}
    tokens = torch.randint(0, lm_config.vocab_size, (config.batch, lm_config.seq_len + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def model(impl: str) -> torch.nn.Module:
        built = colt5_lm.build_model(lm_config, impl=IMPLS[impl], use_triton=USE_TRITON if impl == OURS else None)
        built = built.to(device)
        built.load_state_dict(state)
        return built

    return train_loop.Setup(_label(config, device.type == "cuda"), config.batch, lm_config.seq_len,
                            config.steps_per_round, model, lambda forward: colt5_lm.lm_loss(forward, inputs, targets),
                            autocast=torch.bfloat16)


def run(opts: argparse.Namespace, copy_gbps: float = float("nan"),
        progress: harness.Progress = harness.no_progress) -> list[train_loop.StepResult]:
    """The rows of every config run now, after those of other configs already in the results
    folder's train_step.csv (``copy_gbps`` unused)."""
    cuda = harness.device().type == "cuda"
    labels = {name: _label(CONFIGS[name], cuda) for name in configs(opts)}
    return train_loop.run_configs(
        os.path.join(harness.results_dir(opts), "train_step.csv"), labels,
        lambda name: train_loop.measure(setup(name), variants(opts), ROUNDS[opts.quick], PROFILED_STEPS[opts.quick],
                                        f"train_step {name}", progress))


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
