"""CoordinateDescentRouter: against colt5-attention's (same weights) where colt5 is right,
and against the correct definition where it is not (several routing tokens with a batch
of more than one; route_block_size with several blocks; random_route without a mask).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from triton_layers import CoordinateDescentRouter, RouterReturn
from triton_layers import functional as F

from . import bad_inputs as bad
from .conftest import DEVICE, LOW_DTYPES

DIM = 16


def _colt5():
    return pytest.importorskip("colt5_attention.transformer_block")


def _pair(device, **kwargs):
    """Our router and colt5's with the same weights (loaded strictly through its state_dict)."""
    theirs = _colt5().CoordinateDescentRouter(DIM, **kwargs).to(device)
    ours = CoordinateDescentRouter(DIM, device=device, **kwargs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def _inputs(b, n, device, masked=True):
    x = torch.randn(b, n, DIM, device=device)
    mask = torch.rand(b, n, device=device) > 0.25 if masked else None
    return x, mask


def _gathered(x, indices):
    """The correct definition: out[b, ..., j] = x[b, indices[b, ..., j]]."""
    out = torch.empty(*indices.shape, *x.shape[2:], dtype=x.dtype, device=x.device)
    for b in range(indices.shape[0]):
        out[b] = x[b][indices[b]]
    return out


def _assert_same(ours: RouterReturn, theirs: RouterReturn, check_tokens=True):
    """Same routes; with ``check_tokens`` also the same routed tokens and mask."""
    assert ours.indices.shape == theirs.indices.shape
    # Equal scores (exactly 1.0 near the top) may come in another order: compare as sets.
    torch.testing.assert_close(ours.indices.sort(-1).values, theirs.indices.sort(-1).values, rtol=0, atol=0)
    order_o, order_t = ours.indices.argsort(-1), theirs.indices.argsort(-1)
    take = lambda t, o: t.gather(-1, o)  # noqa: E731
    torch.testing.assert_close(take(ours.scores, order_o), take(theirs.scores, order_t), rtol=1e-4, atol=1e-4)
    if check_tokens:
        expand = lambda o, t: o.unsqueeze(-1).expand(*o.shape, t.shape[-1])  # noqa: E731
        torch.testing.assert_close(
            ours.routed_tokens.gather(-2, expand(order_o, ours.routed_tokens)),
            theirs.routed_tokens.gather(-2, expand(order_t, theirs.routed_tokens)),
        )
    assert (ours.routed_mask is None) == (theirs.routed_mask is None)
    if check_tokens and ours.routed_mask is not None:
        assert torch.equal(take(ours.routed_mask, order_o), take(theirs.routed_mask, order_t))


CONFIGS = [
    dict(),
    dict(straight_through=False),
    dict(cosine_sim_routing=True, cosine_sim_scale=6),
    dict(fetch_k_ratio=1.0, n_iters=7, eps=0.1, eps_init=1.0, eps_decay=0.9),
    dict(route_block_size=64),  # a single block: colt5 is right there
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda k: ",".join(k) or "default")
@pytest.mark.parametrize("masked", [False, True])
def test_matches_colt5(device, kwargs, masked):
    ours, theirs = _pair(device, **kwargs)
    x, mask = _inputs(3, 64, device, masked)
    x_o, x_t = x.clone().requires_grad_(), x.clone().requires_grad_()
    r_o = ours(x_o, num_tokens=12, mask=mask)
    r_t = theirs(x_t, num_tokens=12, mask=mask)
    _assert_same(r_o, r_t)
    # Gradients through the (straight-through) scores to the routing token and to x.
    w = torch.randn(r_o.scores.shape, device=device)
    order_o, order_t = r_o.indices.argsort(-1), r_t.indices.argsort(-1)
    (r_o.scores.gather(-1, order_o) * w).sum().backward()
    (r_t.scores.gather(-1, order_t) * w).sum().backward()
    torch.testing.assert_close(ours.routing_token.grad, theirs.routing_token.grad, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(x_o.grad, x_t.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("keep_one_route_dim", [False, True])
def test_multiple_routing_tokens_batch_of_one_matches_colt5(device, keep_one_route_dim):
    # With b = 1 colt5's batch gather happens to be right, so the outputs must agree.
    ours, theirs = _pair(device, num_routing_tokens=3)
    x, mask = _inputs(1, 80, device)
    _assert_same(ours(x, num_tokens=10, mask=mask, keep_one_route_dim=keep_one_route_dim),
                 theirs(x, num_tokens=10, mask=mask, keep_one_route_dim=keep_one_route_dim))
    ours1, theirs1 = _pair(device)
    r_o = ours1(x, num_tokens=10, mask=mask, keep_one_route_dim=keep_one_route_dim)
    r_t = theirs1(x, num_tokens=10, mask=mask, keep_one_route_dim=keep_one_route_dim)
    assert r_o.indices.dim() == (3 if keep_one_route_dim else 2)
    _assert_same(r_o, r_t)


def test_multiple_routing_tokens_batch_gather_is_right(device):
    ours, theirs = _pair(device, num_routing_tokens=3)
    x, mask = _inputs(4, 70, device)
    r_o = ours(x, num_tokens=9, mask=mask)
    r_t = theirs(x, num_tokens=9, mask=mask)
    assert r_o.indices.shape == (4, 3, 9) and r_o.routed_tokens.shape == (4, 3, 9, DIM)
    # colt5 chooses the same indices; only its gather of tokens and mask is wrong.
    _assert_same(r_o, r_t, check_tokens=False)
    assert torch.equal(r_o.routed_tokens, _gathered(x, r_o.indices))
    assert torch.equal(r_o.routed_mask, _gathered(mask.unsqueeze(-1), r_o.indices).squeeze(-1))
    assert not torch.equal(r_o.routed_tokens, r_t.routed_tokens)  # colt5's defect, fixed here
    # Each route is the top-k of its own routing token's soft top-k scores.
    s = torch.einsum("bnd,rd->brn", x, ours.routing_token)
    scores = F.coor_descent(s, n_iters=20, k=9 * 9 / 8, eps=0.03, eps_init=4.0, eps_decay=0.7,
                            mask=mask.unsqueeze(1).expand_as(s))
    torch.testing.assert_close(scores.gather(-1, r_o.indices), scores.topk(9, dim=-1).values)


def test_route_block_size_several_blocks(device):
    # colt5 raises an IndexError here (it gathers block-local rows at whole-sequence indices).
    router = CoordinateDescentRouter(DIM, route_block_size=32, num_routing_tokens=2, device=device)
    x, mask = _inputs(2, 100, device)  # 3 blocks of 32; the last 4 positions are cut
    out = router(x, num_tokens=10, mask=mask)  # ceil(10 / 3) = 4 per block
    assert out.indices.shape == (2, 2, 12)
    single = CoordinateDescentRouter(DIM, num_routing_tokens=2, device=device)
    single.load_state_dict(router.state_dict())
    for blk in range(3):
        part = single(x[:, 32 * blk: 32 * (blk + 1)], num_tokens=4, mask=mask[:, 32 * blk: 32 * (blk + 1)])
        assert torch.equal(out.indices[..., 4 * blk: 4 * (blk + 1)], part.indices + 32 * blk)
        torch.testing.assert_close(out.scores[..., 4 * blk: 4 * (blk + 1)], part.scores)
    assert torch.equal(out.routed_tokens, _gathered(x, out.indices))
    assert torch.equal(out.routed_mask, _gathered(mask.unsqueeze(-1), out.indices).squeeze(-1))


@pytest.mark.parametrize("num_routing_tokens", [1, 2])
def test_learned_routing_tokens(device, num_routing_tokens):
    b = 3 if num_routing_tokens == 1 else 1  # colt5 is right for r > 1 only with b = 1
    ours, theirs = _pair(device, learned_routing_tokens=True, num_routing_tokens=num_routing_tokens)
    assert ours.routing_token is None and len(ours.state_dict()) == 0
    x, mask = _inputs(b, 50, device)
    tokens = torch.randn(b, num_routing_tokens, DIM, device=device)
    if num_routing_tokens == 1:
        tokens = tokens[:, 0]  # (b, d) form
    _assert_same(ours(x, num_tokens=8, mask=mask, routing_tokens=tokens),
                 theirs(x, num_tokens=8, mask=mask, routing_tokens=tokens))
    with pytest.raises(ValueError, match="routing_tokens"):
        ours(x, num_tokens=8)


def test_random_route(device):
    router = CoordinateDescentRouter(DIM, device=device)
    x, mask = _inputs(2, 40, device)
    out = router(x, num_tokens=6, random_route=True)  # colt5 crashes without a mask
    assert out.indices.shape == (2, 6)
    out = router(x, num_tokens=6, mask=mask, random_route=True)
    assert out.routed_mask.all()  # masked positions are never drawn while valid ones remain


@pytest.mark.parametrize("n_iters", [1, 2, 4])
def test_few_iterations(device, n_iters):
    # colt5's Triton path divides n_iters into n_iters // 5 = 0 segments here.
    ours, theirs = _pair(device, n_iters=n_iters)
    ours.triton_checkpoint_segments = None
    ours_seg = CoordinateDescentRouter(DIM, n_iters=n_iters, triton_checkpoint_segments=3, device=device)
    ours_seg.load_state_dict(theirs.state_dict())
    x, mask = _inputs(2, 48, device)
    _assert_same(ours(x, num_tokens=5, mask=mask), theirs(x, num_tokens=5, mask=mask))
    _assert_same(ours_seg(x, num_tokens=5, mask=mask), theirs(x, num_tokens=5, mask=mask))


@pytest.mark.parametrize("num_routing_tokens,keep", [(1, False), (1, True), (3, False)])
def test_short_sequence_routes_everything(device, num_routing_tokens, keep):
    ours, theirs = _pair(device, num_routing_tokens=num_routing_tokens)
    x, mask = _inputs(2, 5, device)
    r_o = ours(x, num_tokens=8, mask=mask, keep_one_route_dim=keep)
    r_t = theirs(x, num_tokens=8, mask=mask, keep_one_route_dim=keep)
    assert r_o.indices is None and r_t.indices is None
    for a, b in zip(r_o[1:], r_t[1:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("num_routing_tokens", [1, 2])
def test_route_back(device, num_routing_tokens):
    router = CoordinateDescentRouter(DIM, num_routing_tokens=num_routing_tokens, device=device)
    x, _ = _inputs(3, 30, device)
    out = router(x, num_tokens=7)
    back = router.route_back(torch.zeros_like(x), out.routed_tokens * 2, out.indices)
    chosen = torch.zeros(3, 30, dtype=torch.bool, device=device)
    chosen[torch.arange(3, device=device).reshape(3, *([1] * (out.indices.dim() - 1))), out.indices] = True
    assert torch.equal(back[chosen], 2 * x[chosen])
    assert (back[~chosen] == 0).all()
    if num_routing_tokens == 1:
        theirs = _colt5().CoordinateDescentRouter(DIM)
        assert torch.equal(theirs.route_back(torch.zeros_like(x), out.routed_tokens * 2, out.indices), back)


@pytest.mark.parametrize("num_routing_tokens,keep", [(1, False), (1, True), (3, False)])
@pytest.mark.parametrize("n", [5, 8, 9])
def test_route_back_takes_what_the_router_returns(device, num_routing_tokens, keep, n):
    # The README's pattern, route_back(src, f(out.routed_tokens), out.indices), for sequences
    # shorter than, as long as and longer than num_tokens: indices is None for the first two.
    router = CoordinateDescentRouter(DIM, num_routing_tokens=num_routing_tokens, n_iters=5, device=device)
    x, _ = _inputs(2, n, device)
    out = router(x, num_tokens=8, keep_one_route_dim=keep)
    back = router.route_back(torch.zeros_like(x), out.routed_tokens * 2, out.indices)
    assert (out.indices is None) == (n <= 8)
    indices = out.indices
    if indices is None:
        assert torch.equal(back, 2 * x)  # every token routed, back in place
        indices = torch.arange(n, device=device).expand(out.routed_tokens.shape[:-1])
    expected = torch.zeros_like(x)
    for b in range(2):
        expected[b][indices[b]] = 2 * x[b][indices[b]]
    assert torch.equal(back, expected)


def test_route_back_none_needs_the_whole_sequence(device):
    router = CoordinateDescentRouter(DIM, device=device)
    with pytest.raises(ValueError, match=r"indices=None routes every token back in order"):
        router.route_back(torch.zeros(2, 6, DIM, device=device), torch.ones(2, 5, DIM, device=device), None)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision(device, dtype):
    router = CoordinateDescentRouter(DIM, device=device, dtype=dtype)
    x, mask = _inputs(2, 64, device)
    x = x.to(dtype).requires_grad_()
    out = router(x, num_tokens=8, mask=mask)
    assert out.scores.dtype == dtype and out.routed_tokens.dtype == dtype
    out.scores.float().sum().backward()
    assert torch.isfinite(router.routing_token.grad).all() and torch.isfinite(x.grad).all()
    # The chosen positions carry the highest soft top-k scores computed in fp32.
    s = torch.einsum("bnd,rd->brn", x.detach().float(), router.routing_token.detach().float())[:, 0]
    scores = F.coor_descent(s, n_iters=20, k=9.0, eps=0.03, eps_init=4.0, eps_decay=0.7, mask=mask)
    top = scores.topk(8, dim=-1).values[:, -1:]
    assert (scores.gather(-1, out.indices) >= top - 0.05).all()


def test_module_basics(device):
    router = CoordinateDescentRouter(DIM, num_routing_tokens=2, device=device)
    assert router.routing_token.shape == (2, DIM) and router.routing_token.device.type == torch.device(device).type
    assert "num_routing_tokens=2" in repr(router)
    before = router.routing_token.detach().clone()
    router.reset_parameters()
    assert not torch.equal(before, router.routing_token)
    model = nn.Sequential(nn.Linear(DIM, DIM), nn.ModuleDict({"router": router})).to(device)
    fresh = nn.Sequential(nn.Linear(DIM, DIM), nn.ModuleDict({"router": CoordinateDescentRouter(DIM, num_routing_tokens=2)}))
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(fresh[1]["router"].routing_token.to(device), router.routing_token)


def test_state_dict_loads_into_colt5(device):
    ours = CoordinateDescentRouter(DIM, num_routing_tokens=3, device=device)
    theirs = _colt5().CoordinateDescentRouter(DIM, num_routing_tokens=3).to(device)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert torch.equal(theirs.routing_token, ours.routing_token)


def test_bad_config_and_inputs(device):
    for kwargs in (dict(fetch_k_ratio=0.5), dict(n_iters=0), dict(num_routing_tokens=0), dict(route_block_size=0)):
        with pytest.raises(ValueError):
            CoordinateDescentRouter(DIM, **kwargs)
    router = CoordinateDescentRouter(DIM, device=device)
    x, mask = _inputs(2, 20, device)
    with pytest.raises(ValueError, match="x must be"):
        router(x[0], num_tokens=4)
    with pytest.raises(ValueError, match="mask must be"):
        router(x, num_tokens=4, mask=mask[:, :10])
    with pytest.raises(ValueError, match="num_tokens"):
        router(x, num_tokens=0)
    with pytest.raises(ValueError, match="route_block_size"):
        CoordinateDescentRouter(DIM, route_block_size=64, device=device)(x, num_tokens=4)
    with pytest.raises(TypeError):
        router(x, 4)  # num_tokens is keyword-only, as colt5-attention's
    assert math.isclose(router.fetch_k_ratio, 9 / 8)


# --- Bad inputs: a case per row of docs/API.md's table (ids as there; tests/bad_inputs.py)

def _router(**kw):
    return CoordinateDescentRouter(8, n_iters=5, device=DEVICE, **kw)


def _empty_router():
    x = bad.x_(0, 10, 8, grad=True)
    return _router()(x, num_tokens=2), x


def _check_empty_router(result):
    out, x = result
    assert tuple(out.indices.shape) == (0, 2) and tuple(out.routed_tokens.shape) == (0, 2, 8)


x_, mask_ = bad.x_, bad.mask_
BAD_INPUTS = [
    bad.Case("rt-n-iters-0", lambda: CoordinateDescentRouter(8, n_iters=0), (ValueError, r"n_iters must be an int >= 1")),
    bad.Case("rt-module-dim", lambda: CoordinateDescentRouter(0), (ValueError, r"dim must be an int >= 1, got 0")),
    bad.Case("rt-module-dim-type", lambda: CoordinateDescentRouter(True),
         (TypeError, r"dim must be an int, got True \(bool\)")),
    bad.Case("rt-module-eps", lambda: CoordinateDescentRouter(8, eps=0), (ValueError, r"eps must be positive, got 0")),
    bad.Case("rt-module-fetch-k-ratio", lambda: CoordinateDescentRouter(8, fetch_k_ratio=0.5),
         (ValueError, r"fetch_k_ratio must be >= 1, got 0.5")),
    bad.Case("rt-x-rank", lambda: _router()(x_(10, 8), num_tokens=2),
         (ValueError, r"x must be \(batch, seq, dim=8\), got shape \(10, 8\)")),
    bad.Case("rt-x-dim", lambda: _router()(x_(2, 10, 7), num_tokens=2),
         (ValueError, r"x must be \(batch, seq, dim=8\), got shape \(2, 10, 7\)")),
    bad.Case("rt-x-dtype", lambda: _router()(torch.ones(2, 10, 8, dtype=torch.int64, device=DEVICE), num_tokens=2),
         (TypeError, r"x has dtype torch.int64")),
    bad.Case("rt-dtype-mismatch", lambda: _router()(x_(2, 10, 8, dtype=torch.bfloat16), num_tokens=2),
         (TypeError, r"x has dtype torch.bfloat16 but the routing tokens have dtype torch.float32")),
    bad.Case("rt-mask-shape", lambda: _router()(x_(2, 10, 8), num_tokens=2, mask=mask_(2, 9)),
         (ValueError, r"mask must be bool of shape \(2, 10\), got torch.bool \(2, 9\)")),
    bad.Case("rt-num-tokens-0", lambda: _router()(x_(2, 10, 8), num_tokens=0),
         (ValueError, r"num_tokens must be an int >= 1, got 0")),
    bad.Case("rt-empty", _empty_router, _check_empty_router),
]
BAD_CONFIGS = [
    (CoordinateDescentRouter, (8.0,), {}, TypeError, r"dim must be an int, got 8.0 \(float\)"),
    (CoordinateDescentRouter, (8,), {"n_iters": 2.0}, TypeError, r"n_iters must be an int, got 2.0"),
    (CoordinateDescentRouter, (8,), {"num_routing_tokens": 0}, ValueError, r"num_routing_tokens must be an int >= 1"),
    (CoordinateDescentRouter, (8,), {"route_block_size": True}, TypeError, r"route_block_size must be an int"),
    (CoordinateDescentRouter, (8,), {"eps_decay": -0.7}, ValueError, r"eps_decay must be positive, got -0.7"),
    (CoordinateDescentRouter, (8,), {"eps_init": float("inf")}, ValueError, r"eps_init must be finite"),
    (CoordinateDescentRouter, (8,), {"cosine_sim_scale": 0}, ValueError, r"cosine_sim_scale must be positive"),
    (CoordinateDescentRouter, (8,), {"fetch_k_ratio": "9/8"}, TypeError, r"fetch_k_ratio must be a number"),
    (CoordinateDescentRouter, (8,), {"straight_through": "True"}, TypeError, r"straight_through must be True or False"),
    (CoordinateDescentRouter, (8,), {"learned_routing_tokens": 1}, TypeError, r"learned_routing_tokens must be True"),
    (CoordinateDescentRouter, (8,), {"cosine_sim_routing": None}, TypeError, r"cosine_sim_routing must be True"),
    (CoordinateDescentRouter, (8,), {"use_triton": "no"}, TypeError, r"use_triton must be None, True or False"),
]
test_bad_input = bad.tests_of(BAD_INPUTS)
test_bad_module_config = bad.config_tests_of(BAD_CONFIGS)
