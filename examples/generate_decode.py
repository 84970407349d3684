"""Decode tokens/s of a Hugging Face Llama-family model after ``triton_layers.convert`` against the
same model unconverted: ``generate()`` with a static KV cache and a compiled forward.

Run:  python examples/generate_decode.py --out generate.json            (a GPU; a few minutes, most of
                                                                        it compiling each variant)
      python examples/generate_decode.py --device cpu --tiny --compile none   (CPU, seconds: a check
                                                                        of the plumbing, not a speed)

The model: ``LlamaForCausalLM`` built from a config (``--hidden 2048``, ``--layers 16``, 32 heads,
8 KV heads, MLP 4x hidden rounded, vocab 32,000: a 1B-class model), random weights, bf16, eval
mode. The converted copy is ``convert(copy.deepcopy(model))``: the same weights, its RMSNorms
ours.

Compile modes (``--compile``), each variant at its best the same way:

- ``hf``: transformers' own: ``cache_implementation="static"`` makes ``generate`` compile the
  forward (its ``CompileConfig``: fullgraph, ``reduce-overhead``, CUDA graphs);
- ``explicit``: ``torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`` by hand
  and transformers' own compile turned off (``disable_compile``);
- ``none``: eager.

For each batch size (``--batch``, default 1 and 32): a prompt of ``--prompt`` random tokens per
row, ``--new-tokens`` greedy tokens (``min_new_tokens`` too: every run decodes the same count).
Each variant generates twice first (the compiles, the CUDA graphs recorded), then ``--rounds``
interleaved timed rounds, unconverted then converted, each ``generate`` call synchronized.
Reported per batch: decode tokens/s (``batch * new_tokens / seconds``; the prompt's prefill is in
the seconds, a few percent at these lengths), the median of the rounds, min-max, the ratio of
the medians (converted over unconverted) with the min-max of the per-round ratios, and whether
the two variants generated the same tokens (the first round's; bf16 logits that differ in a
last bit can pick another token after a few steps, which is not an error).

``--out FILE`` writes the rows as JSON. Set ``TORCH_LOGS=perf_hints`` to see why Inductor skips
CUDA graphs for a variant, if it does.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Optional

import torch

import triton_layers


def build(hidden: int, layers: int, device: torch.device, dtype: torch.dtype, tiny: bool):
    """The unconverted model and its converted copy (same weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    else:
        config = LlamaConfig(hidden_size=hidden, intermediate_size=(hidden * 4 // 256) * 256,
                             num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                             vocab_size=32000, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    converted = triton_layers.convert(copy.deepcopy(model))
    return model, converted


def _generate(model, input_ids: torch.Tensor, new_tokens: int, mode: str) -> torch.Tensor:
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  attention_mask=torch.ones_like(input_ids), pad_token_id=0)
    if mode != "none":
        kwargs["cache_implementation"] = "static"
    with torch.inference_mode():
        return model.generate(input_ids, **kwargs)


def prepare(model, mode: str):
    """The model set up for ``mode`` (the module docstring)."""
    if mode == "explicit":
        model.generation_config.disable_compile = True
        compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

        def forward(*args, **kwargs):
            # (a new CUDA-graph step per call: the static cache's buffers are updated in place,
            # and generate reads each step's logits before the next call)
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*args, **kwargs)
        model.forward = forward
    elif mode == "none":
        model.generation_config.disable_compile = True
    return model


def timed(model, input_ids, new_tokens: int, mode: str) -> tuple[float, torch.Tensor]:
    """Seconds of one ``generate`` call (synchronized) and its tokens."""
    if input_ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = _generate(model, input_ids, new_tokens, mode)
    if input_ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    base, conv = build(args.hidden, args.layers, device, dtype, args.tiny)
    variants = {"unconverted": prepare(base, args.compile), "converted": prepare(conv, args.compile)}
    vocab = base.config.vocab_size
    rows = []
    for batch in args.batch:
        gen = torch.Generator().manual_seed(batch)
        input_ids = torch.randint(1, vocab, (batch, args.prompt), generator=gen).to(device)
        for model in variants.values():  # compiles and CUDA graphs, outside the timing
            for _ in range(args.warmup):
                _generate(model, input_ids, args.new_tokens, args.compile)
        seconds = {name: [] for name in variants}
        tokens = {}
        for r in range(args.rounds):
            for name, model in variants.items():
                s, out = timed(model, input_ids, args.new_tokens, args.compile)
                seconds[name].append(s)
                tokens.setdefault(name, out)
        tps = {name: [batch * args.new_tokens / s for s in ss] for name, ss in seconds.items()}
        ratios = [c / u for c, u in zip(tps["converted"], tps["unconverted"])]
        med = {name: statistics.median(v) for name, v in tps.items()}
        same = torch.equal(tokens["converted"], tokens["unconverted"])
        row = dict(batch=batch, new_tokens=args.new_tokens, compile=args.compile,
                   unconverted_tps=med["unconverted"], converted_tps=med["converted"],
                   unconverted_range=[min(tps["unconverted"]), max(tps["unconverted"])],
                   converted_range=[min(tps["converted"]), max(tps["converted"])],
                   ratio=med["converted"] / med["unconverted"], ratio_range=[min(ratios), max(ratios)],
                   same_tokens=same, rounds=args.rounds,
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else device.type)
        rows.append(row)
        print(f"batch {batch:>3} ({args.compile}): unconverted {row['unconverted_tps']:9.1f} tok/s "
              f"[{row['unconverted_range'][0]:.1f}-{row['unconverted_range'][1]:.1f}], converted "
              f"{row['converted_tps']:9.1f} [{row['converted_range'][0]:.1f}-{row['converted_range'][1]:.1f}]; "
              f"converted/unconverted {row['ratio']:.3f}x [{row['ratio_range'][0]:.3f}-{row['ratio_range'][1]:.3f}]; "
              f"same tokens: {same}", flush=True)
    return rows


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model of hidden 64 (the CPU check)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile", choices=("hf", "explicit", "none"), default="hf")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> list[dict]:
    args = parse(argv)
    rows = run(args)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
