"""Train a small CoLT5-style byte-level language model built from all four triton_layers layers.

Run:  python examples/train_colt5_lm.py              (GPU kernels if there is a GPU, else the
                                                      CPU reference path: about 2 minutes)
      python examples/train_colt5_lm.py --compare    (also train the same model built from
                                                      plain torch layers, and compare)
      python examples/train_colt5_lm.py --help

The model (TritonLayerNorm, CausalSoftmax attention, a CoordinateDescentRouter picking the
tokens of a heavy feed-forward gated by a WeightedSum) and its plain-torch twin are in
examples/colt5_lm.py; this script is the data (tiny Shakespeare, bytes), the training
loop, the checkpoint round trip, sampling, the loss plot and the command line.

``--use-triton auto`` (the default) runs the kernels on CUDA and the pure-torch reference
on the CPU, also when TRITON_INTERPRET=1 is exported; ``--use-triton true`` on the CPU runs
the kernels through the Triton interpreter (a minute and a half a step on a 2-core CPU: a
warning says so first; ``--steps 2 --no-lookahead-check`` for a short look).

The router picks its tokens from the whole sequence, so in one pass whether token t is
routed depends on later tokens (see examples/colt5_lm.py). ``main()`` measures how much
the one-pass loss could owe to that look-ahead: it prints the held-out loss of a few
sequences scored in one pass and scored from prefixes only (:func:`prefix_loss`, as in
generation). In our CPU runs they differ by at most about 0.02 nats/byte.

Importing this file trains nothing; ``main()`` does.
"""

import argparse
import copy
import gzip
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if __package__ in (None, ""):  # run as a script (python examples/train_colt5_lm.py): the repo root
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from examples.colt5_lm import LMConfig, build_model, lm_loss  # noqa: E402
from triton_layers import uses_kernels  # noqa: E402

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt.gz")

# Per size: the model and the defaults of the training run. "tiny" is the CPU default
# (about 2 minutes on 2 cores); "small" the GPU default (well under a minute on one GPU).
SIZES: Dict[str, Tuple[LMConfig, dict]] = {
    "tiny": (LMConfig(seq_len=128, dim=128, heads=4, depth=2, heavy_tokens=32),
             {"batch_size": 16, "steps": 600, "lr": 3e-3}),
    "small": (LMConfig(seq_len=256, dim=384, heads=6, depth=4, heavy_tokens=64),
              {"batch_size": 32, "steps": 1000, "lr": 1e-3}),
}


# --------------------------------------------------------------------------- data


def load_corpus(path: str = CORPUS) -> Tensor:
    """The whole corpus as a uint8 tensor of bytes (the tokens: vocabulary 256)."""
    with gzip.open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def split_corpus(data: Tensor, held_out: float = 0.1) -> Tuple[Tensor, Tensor]:
    """(train, eval): the held-out split is the last ``held_out`` fraction of the bytes."""
    cut = int(len(data) * (1 - held_out))
    return data[:cut], data[cut:]


def get_batch(data: Tensor, batch_size: int, seq_len: int, device, generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    """Random windows of ``data``: (tokens, targets), both (batch_size, seq_len) long on
    ``device``; targets are the tokens shifted by one. ``generator`` is a CPU generator."""
    starts = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)
    window = data[starts[:, None] + torch.arange(seq_len + 1)].long()
    window = window.to(device)
    return window[:, :-1], window[:, 1:]


# --------------------------------------------------------------------------- training


@torch.no_grad()
def evaluate(model: nn.Module, data: Tensor, batches: int, batch_size: int, device, seed: int) -> float:
    """Mean loss over ``batches`` fixed random batches of ``data`` (same ones every call)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    seq_len = model.config.seq_len
    total = sum(lm_loss(model, *get_batch(data, batch_size, seq_len, device, generator)).item()
                for _ in range(batches))
    model.train()
    return total / batches


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Progress:
    """tqdm when it is installed, else a plain line every ``steps // 10`` steps."""

    def __init__(self, steps: int, label: str) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=steps, desc=label, dynamic_ncols=True) if tqdm else None
        self.label, self.every, self.step = label, max(1, steps // 10), 0

    def update(self, loss: float, tokens_per_s: float) -> None:
        self.step += 1
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.3f}, {tokens_per_s:,.0f} tok/s", refresh=False)
            self.bar.update()
        elif self.step % self.every == 0:
            print(f"{self.label} step {self.step}: loss {loss:.3f}, {tokens_per_s:,.0f} tok/s", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(model: nn.Module, train_data: Tensor, eval_data: Tensor, *, steps: int, batch_size: int, lr: float,
          device, seed: int, label: str = "train", eval_every: int = 0, eval_batches: int = 8) -> dict:
    """AdamW with warmup and cosine decay for ``steps`` steps on random batches (seeded).

    Returns ``losses`` (every step), ``eval_points`` [(step, eval loss)], ``tokens_per_s``
    (after the first steps, which include kernel compilation), ``seconds``, and the final
    ``train_loss`` and ``eval_loss`` on the same fixed batches for any model.
    """
    device = torch.device(device)
    seq_len = model.config.seq_len
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 20)  # linear warmup over 5% of the steps, then cosine from 1x to 0.1x
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / warmup) * (0.55 + 0.45 * math.cos(math.pi * min(i / steps, 1.0))))
    generator = torch.Generator().manual_seed(seed)
    skip = min(5, steps - 1)  # steps left out of the throughput (Triton compiles on first calls)
    losses: List[float] = []
    eval_points: List[Tuple[int, float]] = []
    timed_s, timed_tokens = 0.0, 0
    progress = _Progress(steps, label)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        tokens, targets = get_batch(train_data, batch_size, seq_len, device, generator)
        loss = lm_loss(model, tokens, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())  # .item() synchronizes: the step is done
        dt = time.perf_counter() - t0
        if step >= skip:
            timed_s, timed_tokens = timed_s + dt, timed_tokens + tokens.numel()
        progress.update(losses[-1], tokens.numel() / dt)
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            eval_points.append((step + 1, evaluate(model, eval_data, eval_batches // 2, batch_size, device, seed + 1)))
    progress.close()
    _sync(device)
    seconds = time.perf_counter() - start
    train_loss = evaluate(model, train_data, eval_batches, batch_size, device, seed + 2)
    eval_loss = evaluate(model, eval_data, eval_batches, batch_size, device, seed + 1)
    eval_points.append((steps, eval_loss))
    return {"losses": losses, "eval_points": eval_points, "train_loss": train_loss, "eval_loss": eval_loss,
            "tokens_per_s": timed_tokens / timed_s if timed_s else float("nan"), "seconds": seconds}


@torch.no_grad()
def prefix_loss(model: nn.Module, tokens: Tensor, targets: Tensor) -> float:
    """Mean loss with position t scored by a run on ``tokens[:, :t+1]`` alone, as in generation.

    In one pass over a sequence the router chooses among all its positions, so whether a
    token is routed depends on later tokens; scored from prefixes, nothing later is seen.
    The gap to the one-pass loss bounds what the look-ahead is worth (it also includes
    routing among fewer tokens than in training).
    """
    model.eval()
    losses = [F.cross_entropy(model(tokens[:, : t + 1])[:, -1].float(), targets[:, t])
              for t in range(tokens.shape[1])]
    model.train()
    return torch.stack(losses).mean().item()


@torch.no_grad()
def generate(model: nn.Module, prompt: bytes, length: int, temperature: float, seed: int) -> bytes:
    """``length`` bytes after ``prompt``, sampled at ``temperature`` (0 = greedy), each from
    the model run on the last ``seq_len`` bytes so far."""
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.tensor(list(prompt), dtype=torch.long, device=device)[None]
    for _ in range(length):
        logits = model(tokens[:, -model.config.seq_len:])[0, -1].float()
        if temperature <= 0:
            nxt = logits.argmax()[None]
        else:
            nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator)
        tokens = torch.cat([tokens, nxt[None]], dim=1)
    model.train()
    return bytes(tokens[0, len(prompt):].tolist())


def save_plot(runs: Dict[str, dict], path: str, title: str) -> Optional[str]:
    """Loss curves (train: smoothed; held-out: markers) of each run to a PNG; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss-curve PNG (pip install matplotlib)")
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for (name, run), color in zip(runs.items(), ["tab:blue", "tab:orange"]):
        losses = run["losses"]
        width = max(1, len(losses) // 25)  # running mean over the last `width` steps
        smooth = [sum(losses[max(0, i - width + 1): i + 1]) / (i + 1 - max(0, i - width + 1))
                  for i in range(len(losses))]
        steps = range(1, len(losses) + 1)
        ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(steps, smooth, color=color, label=f"{name} train (mean of {width} steps)")
        steps, evals = zip(*run["eval_points"])
        ax.plot(steps, evals, "o--", color=color, markersize=4, label=f"{name} held-out")
    ax.set(xlabel="step", ylabel="cross-entropy (nats / byte)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- command line


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to train (default: cuda if available, else cpu)")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="model size (default: small on a GPU, tiny on a CPU)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: per size)")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: per size)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per size)")
    parser.add_argument("--use-triton", choices=["auto", "true", "false"], default="auto",
                        help="auto: the kernels on CUDA, the torch reference on the CPU (also under "
                             "TRITON_INTERPRET=1); true/false force the kernels (on the CPU: the Triton "
                             "interpreter, ~90 s a step) / the reference")
    parser.add_argument("--compare", action="store_true",
                        help="also train the plain-torch model from the same weights and batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: 1 when training on the CPU, where this "
                             "model's small ops gain little from more and stall when the cores are busy)")
    parser.add_argument("--out", default="colt5_lm_out", help="folder for checkpoint, PNG and sample")
    parser.add_argument("--sample-len", type=int, default=300, help="bytes to generate after training")
    parser.add_argument("--no-lookahead-check", dest="lookahead_check", action="store_false",
                        help="skip the routing look-ahead check (128 runs of the model on prefixes: "
                             "minutes in the Triton interpreter)")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    parser.add_argument("--prompt", default="ROMEO:\n", help="text the sample starts from")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    # auto is decided here, not by the layers: their own auto (use_triton=None) would take the
    # Triton interpreter on the CPU whenever TRITON_INTERPRET=1 is exported (~90 s a step).
    args.use_triton = {"auto": device.type == "cuda", "true": True, "false": False}[args.use_triton]
    try:  # a clear message now rather than a ValueError from the first layer
        uses_kernels(torch.empty(0, device=device), args.use_triton)
    except ValueError as err:
        parser.error(f"--use-triton true: {err}")
    if args.threads is None:
        args.threads = 1 if device.type == "cpu" else torch.get_num_threads()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    args.size = args.size or ("small" if device.type == "cuda" else "tiny")
    defaults = SIZES[args.size][1]
    for name in ("steps", "batch_size", "lr"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if args.steps < 1 or args.batch_size < 1:
        parser.error(f"--steps and --batch-size must be >= 1, got {args.steps} and {args.batch_size}")
    return args


# Seconds per training step of the kernels in the Triton interpreter (CPU): the default
# 'tiny' model at batch 16 on a 2-core machine, 80-104 s measured (torch 2.13, Triton 3.9);
# evaluation, the look-ahead check and sampling add more.
INTERPRETER_S_PER_STEP = 90


def interpreter_warning(args: argparse.Namespace) -> Optional[str]:
    """A warning for a run of the kernels in the Triton interpreter longer than a minute, else None."""
    if not (args.use_triton and torch.device(args.device).type == "cpu"):
        return None
    seconds = args.steps * INTERPRETER_S_PER_STEP
    if seconds <= 60:
        return None
    hours, minutes = divmod(round(seconds / 60), 60)
    took = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    return (f"warning: --use-triton true on the CPU runs every kernel in the Triton interpreter, about "
            f"{INTERPRETER_S_PER_STEP} s a step: {args.steps} steps take about {took}, and evaluation and "
            "sampling more. For a quick run drop --use-triton (auto: the torch reference on the CPU) "
            "or pass a few --steps (and --no-lookahead-check).")


def _path_name(device: torch.device, use_triton: Optional[bool]) -> str:
    if not uses_kernels(torch.empty(0, device=device), use_triton):
        return "pure-torch reference"
    return "Triton kernels" + (" (Triton interpreter)" if device.type == "cpu" else "")


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Train, evaluate, checkpoint, reload, sample and plot; ``--compare`` also trains the
    plain-torch model. Returns a summary dict (config, losses, tokens/s, file paths, sample).

    For its duration it sets torch's CPU thread count (``--threads``) and, on CUDA, TF32
    matmuls (both impls alike); both are restored on return."""
    args = _parse(argv)
    warning = interpreter_warning(args)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    threads, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.device.startswith("cuda") or tf32
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    config = SIZES[args.size][0]
    os.makedirs(args.out, exist_ok=True)
    train_data, eval_data = split_corpus(load_corpus())

    torch.manual_seed(args.seed)
    model = build_model(config, "triton", args.use_triton).to(device)
    initial_state = copy.deepcopy(model.state_dict())
    path = _path_name(device, args.use_triton)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"CoLT5 LM '{args.size}' ({n_params / 1e6:.2f}M parameters: dim {config.dim}, depth {config.depth}, "
          f"heads {config.heads}, {config.heavy_tokens} of {config.seq_len} tokens routed to the heavy branch)")
    print(f"training on {device} with the triton_layers {path}: {args.steps} steps x {args.batch_size} "
          f"sequences of {config.seq_len} bytes; corpus {len(train_data):,} train / {len(eval_data):,} held-out bytes")

    common = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, device=device, seed=args.seed,
                  eval_every=max(1, args.steps // 5))
    runs = {"triton_layers": train(model, train_data, eval_data, label="triton_layers", **common)}
    ours = runs["triton_layers"]
    print(f"loss {ours['losses'][0]:.3f} -> train {ours['train_loss']:.3f}, held-out {ours['eval_loss']:.3f} "
          f"(nats/byte) in {ours['seconds']:.1f} s, {ours['tokens_per_s']:,.0f} tokens/s")

    # Checkpoint: config + state_dict. Reload into a fresh model; outputs must be identical.
    checkpoint = os.path.join(args.out, "colt5_lm.pt")
    torch.save({"config": asdict(config), "state_dict": model.state_dict()}, checkpoint)
    saved = torch.load(checkpoint, map_location=device, weights_only=True)
    fresh = build_model(LMConfig(**saved["config"]), "triton", args.use_triton).to(device)
    fresh.load_state_dict(saved["state_dict"], strict=True)
    probe, probe_targets = get_batch(eval_data, 4, config.seq_len, device, torch.Generator().manual_seed(args.seed))
    model.eval(), fresh.eval()
    with torch.no_grad():
        identical = torch.equal(model(probe), fresh(probe))
        one_pass = lm_loss(fresh, probe, probe_targets).item()
    print(f"checkpoint {checkpoint}: reloaded into a fresh model, outputs identical = {identical}")
    causal = None
    if args.lookahead_check:
        causal = prefix_loss(fresh, probe, probe_targets)
        print(f"routing look-ahead check on 4 held-out sequences: loss {one_pass:.3f} in one pass, "
              f"{causal:.3f} with each byte scored from its prefix only")

    prompt = args.prompt.encode()
    sample = (prompt + generate(fresh, prompt, args.sample_len, args.temperature, args.seed)).decode("utf-8", "replace")
    sample_path = os.path.join(args.out, "sample.txt")
    with open(sample_path, "w", encoding="utf-8") as f:
        f.write(sample)
    print(f"sample (temperature {args.temperature}) from the reloaded model:\n{'-' * 60}\n{sample}\n{'-' * 60}")

    if args.compare:
        torch_model = build_model(config, "torch").to(device)
        torch_model.load_state_dict(initial_state, strict=True)  # the same starting weights
        runs["plain torch"] = train(torch_model, train_data, eval_data, label="plain torch", **common)
        print(f"\n{'':16}{'tokens/s':>12}{'train loss':>12}{'held-out':>12}{'seconds':>10}")
        for name, run in runs.items():
            print(f"{name:16}{run['tokens_per_s']:>12,.0f}{run['train_loss']:>12.3f}{run['eval_loss']:>12.3f}"
                  f"{run['seconds']:>10.1f}")
        print(f"(triton_layers ran the {path}; plain torch: nn.LayerNorm, masked softmax, torch router)")

    plot = save_plot(runs, os.path.join(args.out, "loss_curve.png"),
                     f"CoLT5 LM '{args.size}' on tiny Shakespeare ({device.type})")
    if plot:
        print(f"loss curve: {plot}")
    return {
        "device": str(device), "path": path, "size": args.size, "config": asdict(config), "steps": args.steps,
        "batch_size": args.batch_size, "first_loss": ours["losses"][0], "train_loss": ours["train_loss"],
        "eval_loss": ours["eval_loss"], "tokens_per_s": ours["tokens_per_s"], "seconds": ours["seconds"],
        "losses": ours["losses"], "reload_identical": identical,
        "probe_loss": one_pass, "probe_prefix_loss": causal, "checkpoint": checkpoint, "plot": plot,
        "sample": sample, "sample_path": sample_path,
        "compare": {name: {k: run[k] for k in ("train_loss", "eval_loss", "tokens_per_s", "seconds")}
                    for name, run in runs.items()} if args.compare else None,
    }


if __name__ == "__main__":
    main()
