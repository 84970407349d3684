"""CoordinateDescentRouter: CoLT5's soft top-k token router on the coor_descent kernels.

A drop-in for colt5-attention's ``CoordinateDescentRouter``: same constructor, forward
signature, return value and parameter name (``routing_token``), so its state_dicts load
strictly. Differences (fixes): ``random_route=True`` works without a mask; any
``n_iters >= 1`` works (no checkpoint segments to divide); with several routing tokens
``routed_tokens[b, r] = x[b, indices[b, r]]`` (colt5 gathers from the wrong batch
element when the batch has more than one); with ``route_block_size`` the tokens are
gathered at the returned (whole-sequence) indices, per-batch routing tokens are used
for every block, and ``route_back`` accepts a routing-token dim and the ``indices=None``
the router returns for sequences no longer than ``num_tokens``.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Union

import torch
import torch.nn.functional as torch_F
from torch import Tensor, nn

from .. import functional as F
from .._checks import INPUT_DTYPES, check_tensor
from ._config import check_flag, check_int, check_number, check_use_triton


class RouterReturn(NamedTuple):
    """What :class:`CoordinateDescentRouter` returns (field names as colt5-attention's).

    indices: (b, [r,] num_tokens) positions chosen in the sequence, or None when the
        sequence is not longer than ``num_tokens`` (then every token is routed, in order,
        and ``routed_tokens`` is x itself: (b, [r,] n, d)). As in colt5-attention;
        :meth:`CoordinateDescentRouter.route_back` accepts the None.
    scores: (b, [r,] num_tokens) their soft top-k scores (1 in value with straight-through).
    routed_tokens: (b, [r,] num_tokens, d) the chosen tokens, ``x[b, indices[b, ...]]``.
    routed_mask: (b, [r,] num_tokens) the mask at the chosen positions, or None.
    """

    indices: Optional[Tensor]
    scores: Tensor
    routed_tokens: Tensor
    routed_mask: Optional[Tensor]


def _batch_index(indices: Tensor) -> Tensor:
    """arange(b) shaped to broadcast against ``indices`` (b, ...)."""
    b = indices.shape[0]
    return torch.arange(b, device=indices.device).reshape(b, *([1] * (indices.dim() - 1)))


class CoordinateDescentRouter(nn.Module):
    """Route the ``num_tokens`` highest-scoring tokens of each sequence (CoLT5).

    Scores are ``s = x @ routing_token`` (cosine similarity times ``cosine_sim_scale``
    with ``cosine_sim_routing``), turned into soft top-k scores by
    :func:`triton_layers.functional.coor_descent` with ``k = min(num_tokens *
    fetch_k_ratio, n)``; the top ``num_tokens`` are returned. With ``straight_through``
    the returned scores are 1 in value (0 at masked positions) but carry the soft
    scores' gradient.

    Args:
        dim: token width d.
        straight_through: return 1-valued scores with the soft scores' gradient.
        n_iters, eps, eps_decay, eps_init: coordinate descent settings (eps-scaling).
        fetch_k_ratio: k is ``num_tokens`` times this (>= 1).
        num_routing_tokens: r routes per sequence; outputs get a dim r when r > 1.
        learned_routing_tokens: no ``routing_token`` parameter; pass ``routing_tokens``
            (b, d) or (b, r, d) to forward instead.
        use_triton: ``None`` auto, ``True``/``False`` force the kernels / the reference.
        cosine_sim_routing, cosine_sim_scale: score by scaled cosine similarity.
        route_block_size: route ``num_tokens / num_blocks`` tokens from each block of this
            many positions (the sequence is cut to a multiple of it).
        triton_checkpoint_segments: accepted for compatibility with colt5-attention and
            ignored (the kernels keep two scalars per iteration, no checkpoints needed).
        device, dtype: of the ``routing_token`` parameter.
    """

    def __init__(
        self,
        dim: int,
        straight_through: bool = True,
        n_iters: int = 20,
        fetch_k_ratio: float = 9 / 8,
        eps: float = 0.03,
        eps_decay: float = 0.7,
        eps_init: float = 4.0,
        num_routing_tokens: int = 1,
        learned_routing_tokens: bool = False,
        use_triton: Optional[bool] = None,
        cosine_sim_routing: bool = False,
        cosine_sim_scale: float = 8,
        route_block_size: Optional[int] = None,
        triton_checkpoint_segments: Optional[int] = None,
        device: Optional[Union[torch.device, str]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim", minimum=1)
        self.straight_through = check_flag(straight_through, "straight_through")
        self.n_iters = check_int(n_iters, "n_iters", minimum=1)
        self.fetch_k_ratio = check_number(fetch_k_ratio, "fetch_k_ratio", minimum=1)
        self.eps = check_number(eps, "eps", positive=True)
        self.eps_decay = check_number(eps_decay, "eps_decay", positive=True)
        self.eps_init = check_number(eps_init, "eps_init", positive=True, allow_none=True)
        self.num_routing_tokens = check_int(num_routing_tokens, "num_routing_tokens", minimum=1)
        self.is_one_routing_token = self.num_routing_tokens == 1
        learned_routing_tokens = check_flag(learned_routing_tokens, "learned_routing_tokens")
        self.use_triton = check_use_triton(use_triton)
        self.cosine_sim_routing = check_flag(cosine_sim_routing, "cosine_sim_routing")
        self.cosine_sim_scale = check_number(cosine_sim_scale, "cosine_sim_scale", positive=True)
        self.route_block_size = None if route_block_size is None else check_int(
            route_block_size, "route_block_size", minimum=1
        )
        self.triton_checkpoint_segments = triton_checkpoint_segments
        if learned_routing_tokens:
            self.register_parameter("routing_token", None)
        else:
            shape = (self.num_routing_tokens, self.dim)
            self.routing_token = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Routing tokens from a standard normal (as colt5-attention)."""
        if self.routing_token is not None:
            nn.init.normal_(self.routing_token)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_routing_tokens={self.num_routing_tokens}, "
            f"learned_routing_tokens={self.routing_token is None}, n_iters={self.n_iters}, "
            f"fetch_k_ratio={self.fetch_k_ratio}, eps={self.eps}, eps_init={self.eps_init}, "
            f"eps_decay={self.eps_decay}, straight_through={self.straight_through}, "
            f"cosine_sim_routing={self.cosine_sim_routing}, route_block_size={self.route_block_size}"
        )

    def route_back(self, src: Tensor, routed_tokens: Tensor, indices: Optional[Tensor]) -> Tensor:
        """Write ``routed_tokens`` back into ``src`` (b, n, d) at ``indices``, in place; returns ``src``.

        Takes what the router returned in every case: ``indices`` is None when the
        sequence was not longer than ``num_tokens`` (every token routed, in order), and
        then token j of each route goes back to position j, as with ``indices =
        arange(n)``. (colt5-attention's ``route_back`` needs indices; its callers test
        for None and skip it.) Where several routes chose one position (always so with
        ``num_routing_tokens > 1`` and None), the position gets one of their tokens; which one is not
        specified (indexed assignment with repeated indices).
        """
        if indices is None:
            n = routed_tokens.shape[-2]
            if routed_tokens.dim() < 3 or n != src.shape[1]:
                raise ValueError(
                    f"indices=None routes every token back in order: routed_tokens must be (b, [r,] n, d) "
                    f"with n = {src.shape[1]} as src {tuple(src.shape)}, got {tuple(routed_tokens.shape)}"
                )
            indices = torch.arange(n, device=src.device).expand(routed_tokens.shape[:-1])
        src[_batch_index(indices), indices] = routed_tokens
        return src

    def _scores(self, x: Tensor, routing_tokens: Optional[Tensor], num_blocks: int) -> Tensor:
        """s (b', r, n) for x (b', n, d)."""
        if self.routing_token is not None:
            tokens = self.routing_token
            pattern = "bnd,rd->brn"
        else:
            if routing_tokens is None:
                raise ValueError("learned_routing_tokens=True: pass routing_tokens (b, d) or (b, r, d) to forward")
            tokens = routing_tokens.unsqueeze(1) if routing_tokens.dim() == 2 else routing_tokens
            if tokens.dim() != 3 or tokens.shape[-1] != x.shape[-1]:
                raise ValueError(
                    f"routing_tokens must be (b, d) or (b, r, d) with d = {x.shape[-1]}, "
                    f"got {tuple(routing_tokens.shape)}"
                )
            if tokens.shape[1] != self.num_routing_tokens:
                raise ValueError(
                    f"routing_tokens has {tokens.shape[1]} routes, the router was built with "
                    f"num_routing_tokens={self.num_routing_tokens}"
                )
            tokens = tokens.repeat_interleave(num_blocks, dim=0)  # one copy per block
            pattern = "bnd,brd->brn"
        if self.cosine_sim_routing:
            x, tokens = torch_F.normalize(x, dim=-1), torch_F.normalize(tokens, dim=-1)
        s = torch.einsum(pattern, x, tokens)
        if self.cosine_sim_routing:
            s = s * self.cosine_sim_scale
        return s

    def forward(
        self,
        x: Tensor,
        *,
        num_tokens: int,
        mask: Optional[Tensor] = None,
        random_route: bool = False,
        routing_tokens: Optional[Tensor] = None,
        keep_one_route_dim: bool = False,
    ) -> RouterReturn:
        """Route ``num_tokens`` tokens of each sequence of ``x`` (b, n, d).

        ``mask`` (b, n) bool, True = valid. ``random_route`` replaces the scores by
        random ones (a negative control). ``keep_one_route_dim`` keeps a route dim of
        size 1 when there is one routing token. Returns a :class:`RouterReturn`.
        """
        self._check_call(x, num_tokens, mask, routing_tokens)
        b, n, d = x.shape
        has_route_dim = keep_one_route_dim or not self.is_one_routing_token
        if n <= num_tokens:  # nothing to choose: every token is routed
            return self._route_all(x, mask, has_route_dim)
        x, mask, num_blocks, width, num_tokens = self._blocks(x, mask, num_tokens)
        scores, flat_mask = self._soft_top_k(x, mask, routing_tokens, num_blocks, width, num_tokens, random_route)
        selected_scores, indices = self._select(scores, flat_mask, num_tokens)
        selected_scores, indices = _to_sequence(selected_scores, indices, b, self.num_routing_tokens, num_blocks, width,
                                                num_tokens)
        if not has_route_dim:
            selected_scores, indices = selected_scores.squeeze(1), indices.squeeze(1)
        batch = _batch_index(indices)
        return RouterReturn(indices, selected_scores, x[batch, indices], None if mask is None else mask[batch, indices])

    def _check_call(self, x: Tensor, num_tokens: int, mask: Optional[Tensor], routing_tokens: Optional[Tensor]) -> None:
        """forward's checks: x (b, n, dim), the routing tokens' dtype, the mask, num_tokens."""
        check_tensor(x, "x", INPUT_DTYPES)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be (batch, seq, dim={self.dim}), got shape {tuple(x.shape)}")
        tokens = self.routing_token if self.routing_token is not None else routing_tokens
        if tokens is not None and tokens.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            # Else einsum fails with a bare "expected scalar type"; under autocast it casts both.
            raise TypeError(f"x has dtype {x.dtype} but the routing tokens have dtype {tokens.dtype}")
        if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2])):
            raise ValueError(f"mask must be bool of shape {tuple(x.shape[:2])}, got {mask.dtype} {tuple(mask.shape)}")
        check_int(num_tokens, "num_tokens", minimum=1)

    def _route_all(self, x: Tensor, mask: Optional[Tensor], has_route_dim: bool) -> RouterReturn:
        """Every token routed, with score 1 (a sequence no longer than the tokens asked)."""
        b, n, d = x.shape
        if has_route_dim:
            r = self.num_routing_tokens
            x = x.unsqueeze(1).expand(b, r, n, d)
            mask = None if mask is None else mask.unsqueeze(1).expand(b, r, n)
            shape = (b, r, n)
        else:
            shape = (b, n)
        return RouterReturn(None, torch.ones(shape, device=x.device, dtype=x.dtype), x, mask)

    def _blocks(self, x: Tensor, mask: Optional[Tensor], num_tokens: int) -> tuple:
        """The sequence cut into ``route_block_size`` blocks (the tail dropped) and the tokens per
        block: ``(x, mask, num_blocks, width, num_tokens)``; one block of the whole sequence
        without a block size."""
        n = x.shape[1]
        if self.route_block_size is None:
            return x, mask, 1, n, num_tokens
        width = self.route_block_size
        num_blocks = n // width
        if num_blocks == 0:
            raise ValueError(f"route_block_size={width} is longer than the sequence ({n})")
        x = x[:, : num_blocks * width]
        mask = None if mask is None else mask[:, : num_blocks * width]
        num_tokens = math.ceil(num_tokens / num_blocks)
        if num_tokens > width:
            raise ValueError(f"{num_tokens} tokens per block of {width} positions: too many")
        return x, mask, num_blocks, width, num_tokens

    def _soft_top_k(self, x: Tensor, mask: Optional[Tensor], routing_tokens: Optional[Tensor], num_blocks: int,
                    width: int, num_tokens: int, random_route: bool) -> tuple[Tensor, Optional[Tensor]]:
        """Each (batch, block, routing token) row's soft top-k scores by coor_descent (random ones
        with ``random_route``), and the rows' mask: ``(b * blocks * r, width)`` each."""
        b, _, d = x.shape
        r = self.num_routing_tokens
        s = self._scores(x.reshape(b * num_blocks, width, d), routing_tokens, num_blocks).reshape(b * num_blocks * r,
                                                                                                   width)
        flat_mask = None
        if mask is not None:
            flat_mask = mask.reshape(b * num_blocks, 1, width).expand(-1, r, -1).reshape(-1, width)
        scores = F.coor_descent(
            s, n_iters=self.n_iters, k=min(num_tokens * self.fetch_k_ratio, width),
            eps=self.eps, eps_init=self.eps_init, eps_decay=self.eps_decay, mask=flat_mask,
            use_triton=self.use_triton,
        )
        if random_route:
            scores = torch.randn_like(scores)
            if flat_mask is not None:
                scores = scores.masked_fill(~flat_mask, -torch.finfo(scores.dtype).max)
        return scores, flat_mask

    def _select(self, scores: Tensor, flat_mask: Optional[Tensor], num_tokens: int) -> tuple[Tensor, Tensor]:
        """Each row's ``num_tokens`` best scores and their positions; straight through, a selected
        score is 1 in the forward with the soft score's gradient (0 at a masked position)."""
        selected_scores, indices = scores.topk(num_tokens, dim=-1)
        if self.straight_through:
            selected_scores = selected_scores + (1.0 - selected_scores).detach()
            if flat_mask is not None:
                selected_scores = selected_scores.masked_fill(~flat_mask.gather(-1, indices), 0.0)
        return selected_scores, indices


def _to_sequence(selected_scores: Tensor, indices: Tensor, b: int, r: int, num_blocks: int, width: int,
                 num_tokens: int) -> tuple[Tensor, Tensor]:
    """(b * blocks * r, t) rows of scores and positions within their block as (b, r, blocks * t),
    the positions into the whole sequence."""
    selected_scores = selected_scores.reshape(b, num_blocks, r, num_tokens).transpose(1, 2)
    indices = indices.reshape(b, num_blocks, r, num_tokens).transpose(1, 2)
    if num_blocks > 1:
        offsets = torch.arange(num_blocks, device=indices.device) * width
        indices = indices + offsets.reshape(num_blocks, 1)
    return selected_scores.reshape(b, r, num_blocks * num_tokens), indices.reshape(b, r, num_blocks * num_tokens)
