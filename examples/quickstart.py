"""triton_layers quickstart: every layer in a small model, forward, backward, save and reload.

Run:  python examples/quickstart.py            (GPU if there is one, else the CPU reference path)
      TRITON_INTERPRET=1 python examples/quickstart.py   (CPU through the Triton interpreter: slow)
"""
import io
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton_layers  # noqa: E402
from triton_layers import (  # noqa: E402
    CausalSoftmax,
    CoordinateDescentRouter,
    TritonLayerNorm,
    WeightedSum,
)
from triton_layers import uses_kernels  # noqa: E402


class TinyAttention(nn.Module):
    """Single-head causal self-attention whose softmax is CausalSoftmax."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.softmax = CausalSoftmax(causal=True, scale=dim**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        probs = self.softmax(q @ k.transpose(-1, -2))  # (batch, seq, seq), lower-triangular
        return self.out(probs @ v)


class TinyBlock(nn.Module):
    """Pre-norm block: TritonLayerNorm -> attention, then a router-picked heavy branch."""

    def __init__(self, dim: int, heavy_tokens: int) -> None:
        super().__init__()
        self.norm1 = TritonLayerNorm(dim)
        self.attn = TinyAttention(dim)
        self.norm2 = TritonLayerNorm(dim)
        self.router = CoordinateDescentRouter(dim)
        self.heavy = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.heavy_tokens = heavy_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        routed = self.router(h, num_tokens=self.heavy_tokens)  # picks tokens per sequence
        heavy = self.heavy(routed.routed_tokens) * routed.scores.unsqueeze(-1)
        return x + self.router.route_back(torch.zeros_like(x), heavy, routed.indices)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    dim, seq, batch = 64, 32, 4
    model = nn.Sequential(
        TinyBlock(dim, heavy_tokens=8),
        TritonLayerNorm(dim, bias=False),
        WeightedSum(dim, bias=True),  # one score per token: an attention-pooling head
    ).to(device)

    x = torch.randn(batch, seq, dim, device=device, requires_grad=True)
    scores = model(x)  # (batch, seq)
    loss = scores.float().pow(2).mean()
    loss.backward()
    path = "Triton kernels" if uses_kernels(x, None) else "pure-torch reference"
    interp = " through the Triton interpreter" if device == "cpu" and uses_kernels(x, None) else ""
    print(f"ran on {device} with the {path}{interp}")
    print(f"output {tuple(scores.shape)} {scores.dtype}, loss {loss.item():.4f}, "
          f"|dx| {x.grad.norm().item():.4f}")

    # State dicts round-trip; an nn.LayerNorm(dim) checkpoint loads into TritonLayerNorm(dim),
    # and a bias-free one (nn.LayerNorm(dim, bias=False)) too, with a zero bias.
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    again = nn.Sequential(TinyBlock(dim, heavy_tokens=8), TritonLayerNorm(dim, bias=False), WeightedSum(dim, bias=True))
    again.to(device).load_state_dict(torch.load(buffer), strict=True)
    with torch.no_grad():
        same = torch.equal(again(x), model(x))
    print(f"state_dict saved and reloaded: outputs identical = {same}")
    TritonLayerNorm(dim).load_state_dict(nn.LayerNorm(dim).state_dict(), strict=True)
    TritonLayerNorm(dim).load_state_dict(nn.LayerNorm(dim, bias=False).state_dict(), strict=True)

    # Swap the LayerNorms of an existing torch model in place.
    torch_model = nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim)).to(device)
    before = torch_model(x.detach())
    triton_layers.convert(torch_model)
    print(f"convert(): {type(torch_model[1]).__name__}, max change "
          f"{(torch_model(x.detach()) - before).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
