"""Fine-tune a Hugging Face Llama-family model with ``transformers.Trainer``, converted and not.

Run:  python examples/train_hf_trainer.py                      (a small Llama built from a
                                                                config, 300 steps: a GPU)
      python examples/train_hf_trainer.py --model PATH_OR_NAME  (a pretrained Llama-family model)
      python examples/train_hf_trainer.py --tiny --steps 20     (CPU-sized, a minute or so)

The same model (one set of weights) is trained twice on the bundled text (tiny Shakespeare),
with the same seed, batches and ``TrainingArguments`` (``bf16=True`` on a GPU: autocast over
fp32 weights, as users run the Trainer): once as transformers builds it (``hf``) and once after
``triton_layers.convert(model)`` (``triton_layers``), whose norms keep the replaced modules'
numerics and dtypes under autocast. Printed and written to ``--out``: both loss curves in one
plot (``hf_trainer_loss.png``, with matplotlib), each run's tokens/s and peak GPU memory
(``hf_trainer.json``; none on a CPU). While training, a line every tenth of the steps. The losses should follow one curve: the conversion changes the speed,
not the training.

Tokens: a pretrained model's own tokenizer; the default config-built model reads bytes
(vocabulary 256), so nothing is downloaded. Importing this file trains nothing; ``main()`` does.
"""
from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import sys
import time
from typing import Optional, Sequence

import torch

if __package__ in (None, ""):  # run as a script (python examples/train_hf_trainer.py): the repo root
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt.gz")
SIZES = {  # the config-built model: (hidden, layers, heads, kv heads, intermediate)
    "small": (512, 8, 8, 4, 1408),
    "tiny": (32, 2, 4, 2, 64),
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a pretrained Llama-family model (name or path); default: a small one from a config")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--tiny", action="store_true", help="a tiny config-built model and short sequences (CPU)")
    p.add_argument("--out", default="hf-trainer-results")
    return p.parse_args(argv)


def build_model(opts: argparse.Namespace):
    """(model, tokenize): the pretrained model and its tokenizer, or a config-built Llama on bytes."""
    import transformers

    if opts.model:
        tokenizer = transformers.AutoTokenizer.from_pretrained(opts.model)
        model = transformers.AutoModelForCausalLM.from_pretrained(opts.model, torch_dtype=torch.float32)
        return model, lambda text: tokenizer(text, return_tensors="pt").input_ids[0]
    hidden, layers, heads, kv_heads, intermediate = SIZES["tiny" if opts.tiny else "small"]
    config = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=256,
                                      max_position_embeddings=max(opts.seq_len, 64), bos_token_id=0, eos_token_id=1,
                                      pad_token_id=0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config), lambda text: torch.tensor(list(text.encode("utf-8")))


class Chunks(torch.utils.data.Dataset):
    """The token stream cut into ``seq_len`` chunks; each is its own labels (the model shifts)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return len(self.tokens) // self.seq_len

    def __getitem__(self, i: int) -> dict:
        ids = self.tokens[i * self.seq_len:(i + 1) * self.seq_len]
        return {"input_ids": ids, "labels": ids.clone()}


def train(model, data: Chunks, opts: argparse.Namespace, name: str) -> dict:
    """One Trainer run: its loss curve, tokens/s and peak GPU memory."""
    import transformers

    cuda = torch.cuda.is_available()
    args = transformers.TrainingArguments(
        output_dir=os.path.join(opts.out, name), max_steps=opts.steps, per_device_train_batch_size=opts.batch,
        learning_rate=opts.lr, warmup_steps=min(20, opts.steps // 10), logging_steps=1, save_strategy="no",
        report_to=[], seed=0, data_seed=0, bf16=cuda, use_cpu=not cuda, dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    # (the loss is logged every step for the curve: a line every tenth of the steps, not the
    # Trainer's printed dict of every step)
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    trainer.add_callback(_Progress(name, opts.steps))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    losses = [(r["step"], r["loss"]) for r in trainer.state.log_history if "loss" in r]
    return {"losses": losses, "tokens_per_s": opts.steps * opts.batch * opts.seq_len / seconds,
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None, "seconds": seconds}


def _Progress(name: str, steps: int):
    """A Trainer callback printing the loss every tenth of ``steps`` (and at the last)."""
    import transformers

    every = max(1, steps // 10)

    class Progress(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and (state.global_step % every == 0 or state.global_step == steps):
                print(f"{name}: step {state.global_step}/{steps}, loss {logs['loss']:.4f}", flush=True)

    return Progress()


def plot(results: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        steps, losses = zip(*r["losses"])
        ax.plot(steps, losses, label=f"{name} ({r['tokens_per_s']:,.0f} tokens/s)", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Optional[Sequence[str]] = None) -> dict:
    import triton_layers

    opts = parse_args(argv)
    if opts.tiny:
        opts.seq_len, opts.batch = min(opts.seq_len, 32), min(opts.batch, 4)
    os.makedirs(opts.out, exist_ok=True)
    model, tokenize = build_model(opts)
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        text = f.read()
    data = Chunks(tokenize(text[: 400 * opts.seq_len * 4]), opts.seq_len)
    converted, summary = triton_layers.convert(copy.deepcopy(model), return_summary=True)
    print(f"convert(): {summary}")
    results = {"hf": train(model, data, opts, "hf"), "triton_layers": train(converted, data, opts, "triton_layers")}
    print(f"{'run':14} {'first loss':>10} {'last loss':>10} {'tokens/s':>12} {'peak MiB':>9}")
    for name, r in results.items():
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"  # (no GPU: no peak memory)
        print(f"{name:14} {r['losses'][0][1]:10.4f} {r['losses'][-1][1]:10.4f} {r['tokens_per_s']:12,.0f} "
              f"{peak:>9}")
    with open(os.path.join(opts.out, "hf_trainer.json"), "w") as f:
        json.dump({"args": vars(opts), "convert": str(summary), **results}, f, indent=1)
    if plot(results, os.path.join(opts.out, "hf_trainer_loss.png")):
        print(f"plot: {os.path.join(opts.out, 'hf_trainer_loss.png')}")
    return results


if __name__ == "__main__":
    main()
