"""The CoLT5-style byte-level language model of examples/train_colt5_lm.py, built from
all four triton_layers layers or from plain torch layers.

    from examples.colt5_lm import LMConfig, build_model, lm_loss
    model = build_model(LMConfig(), impl="triton")          # or impl="torch"
    loss = lm_loss(model, tokens, targets)                  # tokens, targets: (B, T) long

The model (decoder-only, pre-norm). Every block is:

    a = Attention(LayerNorm(x))                           light: every token, CausalSoftmax
    h, x = LayerNorm(a, residual=x)                       x = x + a, h = LayerNorm(x): one pass
    x = x + LightFF(h)                                    light: every token, a small MLP
    r = CoordinateDescentRouter(h, num_tokens=k)          picks k tokens per sequence
    x = x + route_back(HeavyFF(r.routed_tokens) * r.scores * sigmoid(WeightedSum(r.routed_tokens)))

so the heavy feed-forward (4x wider) runs on only k of the T tokens (CoLT5's conditional
computation); the router's scores (1 in value, with the soft top-k's gradient) and a
learned per-token gate (a WeightedSum: one scalar per token) weight what it adds back.
TritonLayerNorm (without bias) is every normalization, including the final one. The
feed-forward's norm takes the residual stream as ``residual``: it adds the attention
output to the stream and normalizes the sum in one pass (reading both, writing both once),
where the torch twin adds, then normalizes. The stream keeps its own dtype (fp32 under
bf16 autocast), and our norms write autocast's dtype, which the next matmul reads.

Where each layer is: TritonLayerNorm, CausalSoftmax, CoordinateDescentRouter and
WeightedSum are made by :func:`triton_layers_factory`; :func:`torch_factory` makes the
plain-torch equivalents (``nn.LayerNorm``, a masked softmax, a torch coordinate-descent
router, ``x @ w + b``) with the same parameter names and shapes, so one state_dict loads
into both (the training script's ``--compare`` and the benchmarks rely on it).

A caveat of CoLT5 routing in a decoder: the router picks the top k tokens of the whole
sequence, so whether token t goes through the heavy branch depends on the router scores
of later tokens. Attention and the feed-forwards are causal, but the routing decision is
not; CoLT5 itself routes in the encoder. The training script measures how much the
one-pass loss could owe to that look-ahead (its ``prefix_loss``).

This module is the model only: data, training, generation and the command line are in
examples/train_colt5_lm.py; benchmarks/bench_train_step.py and the tests import it.
"""

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from triton_layers import (
    CausalSoftmax,
    CoordinateDescentRouter,
    RouterReturn,
    TritonLayerNorm,
    WeightedSum,
)

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


# --------------------------------------------------------------------------- layers


class Layers(NamedTuple):
    """How to make the four swappable layers; everything else in the model is plain torch."""

    norm: Callable[[int], nn.Module]  # dim -> LayerNorm without bias; forward(x, residual=None)
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


class TorchLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that also takes a residual as TritonLayerNorm does: with one, the
    sum ``h = x + residual`` and ``(LayerNorm(h), h)``, in two torch ops."""

    def forward(self, x: Tensor, residual: Optional[Tensor] = None):  # type: ignore[override]
        """``LayerNorm(x)``, or ``(LayerNorm(h), h)`` with ``h = x + residual``."""
        if residual is None:
            return super().forward(x)
        h = x + residual
        return super().forward(h), h


def torch_factory() -> Layers:
    """Plain torch layers with the same parameter names and shapes as triton_layers_factory()."""
    return Layers(
        norm=lambda dim: TorchLayerNorm(dim, bias=False),
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
        # The residual stream x gains the attention output and is normalized in one pass.
        h, x = self.ff_norm(self.attn(self.attn_norm(x)), residual=x)
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
