"""Training step (forward + backward + AdamW) of a Hugging Face Llama, as users convert it.

The model is ``transformers``' LlamaForCausalLM built from a config (no download): hidden 1024,
8 layers, 16 heads, 4 KV heads, intermediate 2816 (Llama's own rule: 8/3 of the width rounded
up to a multiple of 256), vocab 32000, its default SDPA attention, bf16 weights (fp32 on the
CPU dry run), batch 4 of 2048 tokens, loss = the model's own causal-LM loss (``labels``).
``use_cache=False``: a training step has no use for the KV cache. Implementations, each a fresh
model with the same state_dict, on the same batch:

- ``hf``: the model as transformers builds it;
- ``triton_layers``: the same after ``triton_layers.convert(model)``. The number of modules it
  replaced is printed and is the ``swapped`` column: a convert() that swaps only nn.LayerNorm
  replaces none in a Llama, and then this row times the same model as ``hf``. Compiled, the
  converted norms run as torch ops for Inductor to fuse (``torch_ops_when_compiled``);
- ``triton_layers-kernels`` (compiled modes only; eager it is ``triton_layers``):
  ``convert(model, use_triton=True)``, our kernels kept under compile, so that one run shows
  what handing the norms to Inductor is worth;
- ``liger``: every LlamaRMSNorm swapped for ``liger_kernel.transformers.LigerRMSNorm`` (the
  peer; only where liger_kernel imports). Swapped per module rather than through
  ``apply_liger_kernel_to_llama``, which also patches transformers' LlamaRMSNorm class for every
  model built after it (the ``hf`` ones here included).

Modes ``eager`` and ``compile`` (``torch.compile`` default) by default; ``--llama-modes`` adds
``cudagraphs`` (``torch.compile(mode="reduce-overhead")``): three more compiles. The loop is
``benchmarks/train_loop.py``'s (every variant built and compiled once, then ROUNDS interleaved
rounds of ``steps_per_round`` steps of each in turn; its docstring says what each column
means); rows go to ``llama_step.csv``.

Results: BENCHMARKS.md, each GPU's "Training step ... of a Hugging Face Llama" table, with
the first reference point in the H100 notes under it.

Needs transformers. Time on one H100, estimated: 3-4 minutes (about 90 s on 2026-11-23 with a
warm cache, plus ~30 s for the kernels variant), nearly all of it compiling the compiled variants (the hf and triton_layers graphs are the same while convert() swaps
nothing, so the second one hits Inductor's cache); about 2 minutes more with cudagraphs.
``--quick``: a tiny config (seconds; the CPU dry run of the tests uses it).
Run: python -m benchmarks.bench_llama_step [--quick] [--no-compile] [--llama-modes eager,compile,cudagraphs] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from typing import Callable, Optional

import torch
from torch import nn

from benchmarks import harness, report, train_loop

OP = "llama_step"
# A part of python -m benchmarks (benchmarks/parts.py): convert() puts RMSNorms into the Llama.
PART = {"order": 70, "kernel_ops": ("norm",)}
OURS = "triton_layers"
DEFAULT_MODES = ("eager", "compile")
USE_TRITON = None  # convert()'s use_triton for our layers: auto, the kernels on CUDA
KERNELS = f"{OURS}-kernels"  # convert(use_triton=KERNELS_USE_TRITON): our kernels under compile too
KERNELS_USE_TRITON = True


@dataclasses.dataclass(frozen=True)
class LlamaSize:
    """A LlamaConfig's sizes, a batch, and how many steps a round times."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    seq_len: int
    steps_per_round: int


CONFIGS = {
    # the config (~156M parameters). Estimated, not yet measured: ~1.3 GB a variant for weights,
    # gradients and AdamW state, a step's peak ~8 GB in eager (fp32 logits of 8192 x 32000 among it)
    "llama-1024x8": LlamaSize(1024, 8, 16, 4, 2816, 32000, batch=4, seq_len=2048, steps_per_round=4),
    "tiny": LlamaSize(64, 2, 4, 2, 176, 512, batch=2, seq_len=32, steps_per_round=1),  # --quick
}
ROUNDS = {False: 9, True: 2}  # quick -> rounds
PROFILED_STEPS = {False: 3, True: 1}


def _transformers():
    """The transformers module, or a clear error saying this bench needs it."""
    try:
        import transformers
    except ImportError as exc:
        raise RuntimeError(f"{OP} needs Hugging Face transformers (pip install transformers, or "
                           f"pip install -e '.[bench]'): {exc}") from exc
    return transformers


@functools.lru_cache(maxsize=None)
def liger_rms_norm() -> Optional[type]:
    """Liger's LigerRMSNorm class, or None where liger_kernel does not import (said on stderr
    when it is installed but fails to import)."""
    try:
        from liger_kernel.transformers import LigerRMSNorm
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "liger_kernel":
            print(f"    {OP}: no liger rows, liger_kernel does not import: {exc}", file=sys.stderr)
        return None
    except Exception as exc:  # e.g. a transformers it does not know, or no GPU backend
        print(f"    {OP}: no liger rows, liger_kernel does not import: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None
    return LigerRMSNorm


def config_name(opts: argparse.Namespace) -> str:
    return "tiny" if opts.quick else "llama-1024x8"


def modes(opts: argparse.Namespace) -> list[str]:
    """--no-compile: eager only; else --llama-modes, by default eager and compile."""
    if opts.no_compile:
        return ["eager"]
    chosen = getattr(opts, "llama_modes", None)
    names = [m.strip() for m in chosen.split(",") if m.strip()] if chosen else list(DEFAULT_MODES)
    unknown = [m for m in names if m not in train_loop.MODES]
    if unknown or not names:
        raise ValueError(f"--llama-modes: unknown {unknown or 'empty list'}; choose from {','.join(train_loop.MODES)}")
    return names


def impls() -> list[str]:
    return ["hf", OURS] + (["liger"] if liger_rms_norm() is not None else [])


def variants(opts: argparse.Namespace) -> list[tuple[str, str]]:
    """The (mode, impl) pairs, in the order each round runs them; KERNELS in compiled modes only."""
    return [(mode, impl) for mode in modes(opts)
            for impl in impls() + ([KERNELS] if mode != "eager" else [])]


def cases(opts: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(config, mode, impl) of a run, in order (one progress step each)."""
    return [(config_name(opts), mode, impl) for mode, impl in variants(opts)]


def _dtype(device: torch.device) -> torch.dtype:
    """bf16 weights on the GPU; fp32 on the CPU dry run (CPU bf16 matmuls are slow)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _label(size: LlamaSize, dtype: torch.dtype) -> str:
    return (f"B{size.batch} T{size.seq_len} d{size.hidden} L{size.layers} h{size.heads} kv{size.kv_heads} "
            f"ffn{size.intermediate} V{size.vocab} {harness.dtype_name(dtype)}")


def build_llama(size: LlamaSize, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A LlamaForCausalLM of ``size`` on ``device``, weights in ``dtype``, freshly initialised
    (``from_config`` with ``dtype``, as ``from_pretrained(dtype=...)`` builds it: the rotary
    frequencies stay fp32)."""
    transformers = _transformers()
    config = transformers.LlamaConfig(
        hidden_size=size.hidden, num_hidden_layers=size.layers, num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads, intermediate_size=size.intermediate, vocab_size=size.vocab,
        max_position_embeddings=size.seq_len, use_cache=False)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    got = next(model.parameters()).dtype
    if got != dtype:  # a transformers that knows only torch_dtype= ignores dtype=
        raise RuntimeError(f"{OP}: from_config(dtype={dtype}) built {got} weights with transformers "
                           f"{transformers.__version__}; it needs one that takes dtype= (4.56 or later)")
    return model


def swap_modules(model: nn.Module, old: type, make: Callable[[nn.Module], nn.Module]) -> int:
    """Replace (in place) every submodule of type ``old`` by ``make(it)``; the number replaced."""
    count = 0
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, old):
                setattr(parent, name, make(child))
                count += 1
    return count


def to_liger(norm: nn.Module) -> nn.Module:
    """A LigerRMSNorm computing what the LlamaRMSNorm ``norm`` computes (Liger's "llama" casting,
    as apply_liger_kernel_to_llama sets it), with its weight."""
    weight = norm.weight
    liger = liger_rms_norm()(weight.shape[0], eps=norm.variance_epsilon, casting_mode="llama")
    liger = liger.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        liger.weight.copy_(weight)
    return liger


def ours_in(model: nn.Module) -> int:
    """How many of ``model``'s modules are triton_layers modules."""
    return sum(type(m).__module__.split(".")[0] == "triton_layers" for m in model.modules())


def convert_ours(model: nn.Module, use_triton: Optional[bool] = None) -> int:
    """``triton_layers.convert(model, use_triton=use_triton)`` in place; the number of modules it
    replaced, said on stdout with the norms it left (a Llama's are LlamaRMSNorm)."""
    import triton_layers

    before = ours_in(model)
    triton_layers.convert(model, use_triton=use_triton)
    count = ours_in(model) - before
    left = sum(type(m).__name__.endswith("RMSNorm") and type(m).__module__.startswith("transformers")
               for m in model.modules())
    same = "; the triton_layers rows run the same model as hf" if count == 0 else ""
    print(f"    {OP}: triton_layers.convert() replaced {count} modules, left {left} transformers RMSNorm{same}",
          flush=True)
    return count


def setup(name: str, swapped: dict[str, int]) -> train_loop.Setup:
    """Config ``name`` for the loop: one state_dict and one batch for every variant. Records into
    ``swapped`` how many modules each impl's conversion replaced."""
    size = CONFIGS[name]
    device = harness.device()
    dtype = _dtype(device)
    _transformers()
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in build_llama(size, device, dtype).state_dict().items()}
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq_len), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)

    def model(impl: str) -> nn.Module:
        built = build_llama(size, device, dtype)
        built.load_state_dict(state)
        if impl == OURS:
            swapped[impl] = convert_ours(built, USE_TRITON)
        elif impl == KERNELS:
            swapped[impl] = convert_ours(built, KERNELS_USE_TRITON)
        elif impl == "liger":
            swapped[impl] = swap_modules(built, LlamaRMSNorm, to_liger)
        else:
            swapped[impl] = 0
        return built

    # the model shifts the labels itself: every token but the first is a target
    return train_loop.Setup(_label(size, dtype), size.batch, size.seq_len, size.steps_per_round, model,
                            lambda forward: forward(input_ids=tokens, labels=tokens).loss)


def run(opts: argparse.Namespace, copy_gbps: float = float("nan"),
        progress: harness.Progress = harness.no_progress) -> list[train_loop.StepResult]:
    """The rows of this run's config, after those of other configs already in the results folder's
    llama_step.csv (``copy_gbps`` unused)."""
    _transformers()  # fail before anything is built
    name = config_name(opts)
    label = _label(CONFIGS[name], _dtype(harness.device()))

    def run_config(name: str) -> list[train_loop.StepResult]:
        swapped: dict[str, int] = {}
        rows = train_loop.measure(setup(name, swapped), variants(opts), ROUNDS[opts.quick],
                                  PROFILED_STEPS[opts.quick], f"{OP} {name}", progress)
        return [dataclasses.replace(r, swapped=swapped.get(r.impl, float("nan"))) for r in rows]

    return train_loop.run_configs(os.path.join(harness.results_dir(opts), f"{OP}.csv"), {name: label}, run_config)


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """This bench's own option (also on ``python -m benchmarks``)."""
    parser.add_argument("--llama-modes", default=None,
                        help=f"llama_step modes, comma-separated, of {','.join(train_loop.MODES)} "
                             f"(default: {','.join(DEFAULT_MODES)})")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    parser = add_args(harness.add_common_args(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)))
    opts = parser.parse_args(argv)
    harness.require_cuda()
    try:
        _transformers()
    except RuntimeError as exc:  # the message says what to install
        sys.exit(str(exc))
    results = run(opts)
    harness.emit(["## Llama training step", ""] + report.llama_table([dataclasses.asdict(r) for r in results]))
    harness.write_csv(results, os.path.join(harness.results_dir(opts), f"{OP}.csv"))


if __name__ == "__main__":
    main()
