"""Train a small CoLT5-style byte-level language model built from all four triton_layers layers.

Run:  python examples/train_colt5_lm.py              (GPU kernels if there is a GPU, else the
                                                      CPU reference path: about 2 minutes)
      python examples/train_colt5_lm.py --compare    (also train the same model built from
                                                      plain torch layers, and compare)
      python examples/train_colt5_lm.py --help

The model (decoder-only, pre-norm). Every block is:

    x = x + Attention(LayerNorm(x))                       light: every token, CausalSoftmax
    h = LayerNorm(x)
    x = x + LightFF(h)                                    light: every token, a small MLP
    r = CoordinateDescentRouter(h, num_tokens=k)          picks k tokens per sequence
    x = x + route_back(HeavyFF(r.routed_tokens) * r.scores * sigmoid(WeightedSum(r.routed_tokens)))

so the heavy feed-forward (4x wider) runs on only k of the T tokens (CoLT5's conditional
computation); the router's scores (1 in value, with the soft top-k's gradient) and a
learned per-token gate (a WeightedSum: one scalar per token) weight what it adds back.
TritonLayerNorm is every normalization, including the final one.

Where each layer is: TritonLayerNorm, CausalSoftmax, CoordinateDescentRouter and
WeightedSum are made by :func:`triton_layers_factory`; :func:`torch_factory` makes the
plain-torch equivalents (``nn.LayerNorm``, a masked softmax, a torch coordinate-descent
router, ``x @ w + b``) with the same parameter names and shapes, so one state_dict loads
into both and ``--compare`` trains both from the same initial weights.

A caveat of CoLT5 routing in a decoder: the router picks the top k tokens of the whole
sequence, so whether token t goes through the heavy branch depends on the router scores
of later tokens. Attention and the feed-forwards are causal, but the routing decision is
not; CoLT5 itself routes in the encoder. Generation runs the model on the prefix so far,
where the router chooses among the tokens already there. ``main()`` measures how much the
one-pass loss could owe to that look-ahead: it prints the held-out loss of a few sequences
scored in one pass and scored from prefixes only (:func:`prefix_loss`, as in generation).
In our CPU runs they differ by at most about 0.02 nats/byte.

Importing this file trains nothing; ``main()`` does (the benchmarks import the model).
"""

import argparse
import copy
import gzip
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from triton_layers import (  # noqa: E402
    CausalSoftmax,
    CoordinateDescentRouter,
    RouterReturn,
    TritonLayerNorm,
    WeightedSum,
)
from triton_layers._checks import use_kernels  # noqa: E402

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt.gz")


# --------------------------------------------------------------------------- config


@dataclass
class LMConfig:
    """Model shape. ``heavy_tokens`` of every ``seq_len`` tokens go through the heavy branch
    (shorter inputs route the same fraction, at least one token)."""

    vocab_size: int = 256
    seq_len: int = 128
    dim: int = 128
    heads: int = 4
    depth: int = 2
    heavy_tokens: int = 32
    light_mult: int = 2  # light feed-forward hidden width = light_mult * dim
    heavy_mult: int = 4  # heavy feed-forward hidden width = heavy_mult * dim
    router_iters: int = 20  # coordinate descent iterations of the router


# Per size: the model and the defaults of the training run. "tiny" is the CPU default
# (about 2 minutes on 2 cores); "small" the GPU default (well under a minute on one GPU).
SIZES: Dict[str, Tuple[LMConfig, dict]] = {
    "tiny": (LMConfig(seq_len=128, dim=128, heads=4, depth=2, heavy_tokens=32),
             {"batch_size": 16, "steps": 600, "lr": 3e-3}),
    "small": (LMConfig(seq_len=256, dim=384, heads=6, depth=4, heavy_tokens=64),
              {"batch_size": 32, "steps": 1000, "lr": 1e-3}),
}


# --------------------------------------------------------------------------- layers


class Layers(NamedTuple):
    """How to make the four swappable layers; everything else in the model is plain torch."""

    norm: Callable[[int], nn.Module]  # dim -> LayerNorm without bias
    causal_softmax: Callable[[float], nn.Module]  # scale -> causal softmax over the last dim
    router: Callable[[int, int], nn.Module]  # (dim, n_iters) -> CoLT5 router
    weighted_sum: Callable[[int], nn.Module]  # dim -> (..., dim) -> (...) with weight (dim,), bias (1,)


def triton_layers_factory(use_triton: Optional[bool] = None) -> Layers:
    """The triton_layers modules; ``use_triton`` (None = auto) goes to each."""
    return Layers(
        norm=lambda dim: TritonLayerNorm(dim, bias=False, use_triton=use_triton),
        causal_softmax=lambda scale: CausalSoftmax(causal=True, scale=scale, use_triton=use_triton),
        router=lambda dim, n_iters: CoordinateDescentRouter(dim, n_iters=n_iters, use_triton=use_triton),
        weighted_sum=lambda dim: WeightedSum(dim, bias=True, use_triton=use_triton),
    )


class TorchCausalSoftmax(nn.Module):
    """``softmax(scale * scores)`` with the upper triangle masked out, in plain torch."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, scores: Tensor) -> Tensor:
        """Probabilities over the last dim of ``scores`` (..., n_q, n_k), bottom-right aligned mask."""
        n_q, n_k = scores.shape[-2:]
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1 + n_k - n_q)
        return (scores * self.scale).masked_fill(future, float("-inf")).softmax(dim=-1)


class TorchWeightedSum(nn.Module):
    """``x @ weight + bias``: WeightedSum's parameters (weight (dim,), bias (1,)) in plain torch."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        linear = nn.Linear(dim, 1)  # the same initialisation as WeightedSum
        self.weight = nn.Parameter(linear.weight.detach().reshape(dim))
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        """(..., dim) -> (...)."""
        return x @ self.weight.to(x.dtype) + self.bias.to(x.dtype)


def torch_coor_descent(s: Tensor, k: float, n_iters: int, eps: float, eps_init: float, eps_decay: float) -> Tensor:
    """CoLT5's soft top-k of each row of ``s`` by coordinate descent with eps-scaling.

    Solves max <s, p> + e * entropy(p) subject to 0 <= p <= 1, sum(p) = k, by alternating
    the dual variables a (one per row: the sum constraint) and b (one per entry: p <= 1),
    while shrinking the temperature e from ``eps_init`` to ``eps``.
    """
    s = s.float()
    log_k = math.log(k)
    e = max(eps_init, eps)
    a = torch.zeros_like(s[..., :1])
    b = -s
    for _ in range(n_iters):
        a = e * (log_k - ((s + b) / e).logsumexp(dim=-1, keepdim=True))
        b = -F.relu(s + a)
        e = max(e * eps_decay, eps)
    return ((s + a + b) / e).exp()


class TorchRouter(nn.Module):
    """CoordinateDescentRouter's default configuration (one routing token, straight-through
    scores, k = num_tokens * 9/8) in plain torch; same ``routing_token`` parameter."""

    def __init__(self, dim: int, n_iters: int = 20, fetch_k_ratio: float = 9 / 8, eps: float = 0.03,
                 eps_decay: float = 0.7, eps_init: float = 4.0) -> None:
        super().__init__()
        self.n_iters, self.fetch_k_ratio = n_iters, fetch_k_ratio
        self.eps, self.eps_decay, self.eps_init = eps, eps_decay, eps_init
        self.routing_token = nn.Parameter(torch.randn(1, dim))

    def forward(self, x: Tensor, *, num_tokens: int) -> RouterReturn:
        """Route ``num_tokens`` tokens of each sequence of ``x`` (b, n, d), as the triton_layers router."""
        b, n, _ = x.shape
        if n <= num_tokens:  # every token is routed
            return RouterReturn(None, x.new_ones(b, n), x, None)
        s = (x @ self.routing_token.to(x.dtype).t()).squeeze(-1)  # (b, n)
        soft = torch_coor_descent(s, min(num_tokens * self.fetch_k_ratio, n), self.n_iters,
                                  self.eps, self.eps_init, self.eps_decay).to(s.dtype)
        # Entries with s + a >= 0 score exactly 1 (and have zero gradient); when there are
        # more than num_tokens of them, topk's order among equal values picks (both impls).
        scores, indices = soft.topk(num_tokens, dim=-1)
        scores = scores + (1.0 - scores).detach()  # straight-through: 1 in value
        routed = x.gather(1, indices.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return RouterReturn(indices, scores, routed, None)

    def route_back(self, src: Tensor, routed_tokens: Tensor, indices: Tensor) -> Tensor:
        """``src`` with ``routed_tokens`` written at ``indices`` (out of place)."""
        return src.scatter(1, indices.unsqueeze(-1).expand_as(routed_tokens), routed_tokens)


def torch_factory() -> Layers:
    """Plain torch layers with the same parameter names and shapes as triton_layers_factory()."""
    return Layers(
        norm=lambda dim: nn.LayerNorm(dim, bias=False),
        causal_softmax=TorchCausalSoftmax,
        router=lambda dim, n_iters: TorchRouter(dim, n_iters=n_iters),
        weighted_sum=TorchWeightedSum,
    )


# --------------------------------------------------------------------------- model


class FeedForward(nn.Sequential):
    """Linear -> GELU -> Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class Attention(nn.Module):
    """Multi-head causal self-attention whose softmax is the given causal softmax layer."""

    def __init__(self, dim: int, heads: int, layers: Layers) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.softmax = layers.causal_softmax((dim // heads) ** -0.5)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(b, n, dim) -> (b, n, dim); position i attends to positions <= i."""
        b, n, d = x.shape
        # (b, n, 3d) -> three (b, heads, n, head_dim)
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        probs = self.softmax(q @ k.transpose(-1, -2))  # (b, heads, n, n), zero above the diagonal
        return self.out((probs @ v).transpose(1, 2).reshape(b, n, d))


class CoLT5Block(nn.Module):
    """Light attention and feed-forward for every token, a heavy feed-forward for routed ones."""

    def __init__(self, config: LMConfig, layers: Layers) -> None:
        super().__init__()
        dim = config.dim
        self.seq_len, self.heavy_tokens = config.seq_len, config.heavy_tokens
        self.attn_norm = layers.norm(dim)
        self.attn = Attention(dim, config.heads, layers)
        self.ff_norm = layers.norm(dim)
        self.light_ff = FeedForward(dim, config.light_mult * dim)
        self.router = layers.router(dim, config.router_iters)
        self.heavy_ff = FeedForward(dim, config.heavy_mult * dim)
        self.heavy_gate = layers.weighted_sum(dim)  # one learned scalar per routed token

    def forward(self, x: Tensor) -> Tensor:
        """(b, n, dim) -> (b, n, dim)."""
        x = x + self.attn(self.attn_norm(x))
        h = self.ff_norm(x)
        x = x + self.light_ff(h)

        # Route the same fraction of any input length (generation feeds shorter prefixes).
        num_tokens = max(1, self.heavy_tokens * x.shape[1] // self.seq_len)
        routed = self.router(h, num_tokens=num_tokens)
        tokens = routed.routed_tokens  # (b, num_tokens, dim): h at routed.indices
        weight = routed.scores * torch.sigmoid(self.heavy_gate(tokens))  # (b, num_tokens)
        heavy = (self.heavy_ff(tokens) * weight.unsqueeze(-1)).to(x.dtype)
        if routed.indices is None:  # the sequence is no longer than num_tokens: all routed
            return x + heavy
        return x + self.router.route_back(torch.zeros_like(x), heavy, routed.indices)


class CoLT5LM(nn.Module):
    """Byte embeddings + learned positions -> CoLT5 blocks -> LayerNorm -> logits."""

    def __init__(self, config: LMConfig, layers: Layers) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos = nn.Parameter(torch.zeros(config.seq_len, config.dim))
        self.blocks = nn.ModuleList(CoLT5Block(config, layers) for _ in range(config.depth))
        self.norm = layers.norm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens`` LongTensor (batch, n <= seq_len) -> logits (batch, n, vocab_size)."""
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long:
            raise TypeError(f"tokens must be a LongTensor, got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, seq), got {tuple(tokens.shape)}")
        if not 0 < tokens.shape[1] <= self.config.seq_len:
            raise ValueError(f"sequence length {tokens.shape[1]} must be in 1..seq_len={self.config.seq_len}")
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model(config: LMConfig, impl: str = "triton", use_triton: Optional[bool] = None) -> nn.Module:
    """The LM from triton_layers (``impl="triton"``, ``use_triton`` passed to every layer)
    or from plain torch layers (``impl="torch"``); both have the same state_dict keys and
    shapes. ``model(tokens (B, T) long) -> logits (B, T, vocab_size)``."""
    if impl == "triton":
        return CoLT5LM(config, triton_layers_factory(use_triton))
    if impl == "torch":
        return CoLT5LM(config, torch_factory())
    raise ValueError(f"impl must be 'triton' or 'torch', got {impl!r}")


def lm_loss(model: nn.Module, tokens: Tensor, targets: Tensor) -> Tensor:
    """Mean next-byte cross-entropy (nats) of ``model`` on ``tokens`` against ``targets``."""
    logits = model(tokens)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


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
                        help="auto: kernels on CUDA (and on CPU under TRITON_INTERPRET=1), else the "
                             "torch reference; true/false force the kernels / the reference")
    parser.add_argument("--compare", action="store_true",
                        help="also train the plain-torch model from the same weights and batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: 1 when training on the CPU, where this "
                             "model's small ops gain little from more and stall when the cores are busy)")
    parser.add_argument("--out", default="colt5_lm_out", help="folder for checkpoint, PNG and sample")
    parser.add_argument("--sample-len", type=int, default=300, help="bytes to generate after training")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    parser.add_argument("--prompt", default="ROMEO:\n", help="text the sample starts from")
    args = parser.parse_args(argv)
    args.use_triton = {"auto": None, "true": True, "false": False}[args.use_triton]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    try:  # a clear message now rather than a ValueError from the first layer
        use_kernels(torch.empty(0, device=device), args.use_triton)
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


def _path_name(device: torch.device, use_triton: Optional[bool]) -> str:
    if not use_kernels(torch.empty(0, device=device), use_triton):
        return "pure-torch reference"
    return "Triton kernels" + (" (Triton interpreter)" if device.type == "cpu" else "")


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Train, evaluate, checkpoint, reload, sample and plot; ``--compare`` also trains the
    plain-torch model. Returns a summary dict (config, losses, tokens/s, file paths, sample).

    For its duration it sets torch's CPU thread count (``--threads``) and, on CUDA, TF32
    matmuls (both impls alike); both are restored on return."""
    args = _parse(argv)
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
