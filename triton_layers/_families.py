"""The RMSNorm families ``convert`` reproduces, and how it tells which one a module computes.

A family is what a norm class computes, written as its authors write it (Hugging Face's
modeling code), independently of our kernels and reference: where it casts, whether the
weight multiplies before or after the cast, ``1 + weight``.

- ``"llama"`` (Llama, Mistral, Qwen2/3, Mixtral, Phi3, DeepSeek-V3, Llama4 and most of
  transformers' RMSNorms): ``weight * norm(x.float()).to(x.dtype)``: the normalized value
  rounded to x's dtype, then the product, typed as torch types it (an fp32 weight gives fp32).
- ``"olmo2"`` (Olmo2 and others): ``(weight * norm(x.float())).to(x.dtype)``: the product in
  fp32, rounded once to x's dtype.
- ``"gemma"`` (Gemma, Gemma2, Gemma3, and others): ``(norm(x.float()) * (1 + weight.float())).to(x.dtype)``.

``norm(z) = z * rsqrt(mean(z^2) + eps)``.

:func:`family_of` runs a copy of a module on a few fixed probes (bf16 and fp32 inputs, bf16
and fp32 weights, random weights) and returns the family whose formula gives the same dtypes
and the same bits on all of them, so that every class transformers writes with one of these
formulas is recognized, whatever its name; a class that computes otherwise, even by one
rounding, is left alone.
"""
from __future__ import annotations

import copy
import inspect
from typing import Callable, Optional

import torch
from torch import Tensor, nn


def _normalized(x: Tensor, eps: float) -> Tensor:
    xf = x.to(torch.float32)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def _llama(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * _normalized(x, eps).to(x.dtype)


def _olmo2(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return (weight * _normalized(x, eps)).to(x.dtype)


def _gemma(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return (_normalized(x, eps) * (1.0 + weight.float())).type_as(x)


FORMULAS: dict[str, Callable[[Tensor, Tensor, float], Tensor]] = {"llama": _llama, "olmo2": _olmo2, "gemma": _gemma}
FAMILIES = tuple(FORMULAS)

# How TritonRMSNorm reproduces each: (cast_before_weight, unit_offset).
LAYER_FLAGS = {"llama": (True, False), "olmo2": (False, False), "gemma": (False, True)}

_EPS_NAMES = ("variance_epsilon", "eps", "epsilon")
_PROBE_ROWS = 5


def eps_of(module: nn.Module) -> Optional[float]:
    """The module's epsilon, under the names transformers gives it, or None."""
    for name in _EPS_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _takes_one_tensor(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes exactly one argument and nothing else: a norm called
    with a second input (a gate, a residual) computes something we do not replace."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD)


def family_of(module: nn.Module) -> Optional[str]:
    """The family whose formula ``module`` computes (see the module docstring), or None: a
    1-D ``weight``, an epsilon, a forward of one tensor, and the same dtype and bits as the
    family's formula on every probe."""
    weight = getattr(module, "weight", None)
    eps = eps_of(module)
    if not isinstance(weight, Tensor) or weight.dim() != 1 or eps is None or not _takes_one_tensor(module):
        return None
    hidden = weight.shape[0]
    try:
        # On the CPU whatever the default device and dtype (torch.set_default_device("cuda") or
        # `with torch.device("meta"):` around convert, a float64 default dtype): a CPU generator
        # cannot draw on another device, and a module built on meta holds no values to run.
        # The block also sends what the module's forward creates without a device to the CPU.
        with torch.device("cpu"), torch.no_grad(), torch.autocast("cpu", enabled=False):
            g = torch.Generator(device="cpu").manual_seed(0)
            w = 1.0 + 0.3 * torch.randn(hidden, generator=g, device="cpu", dtype=torch.float32)
            x = 3.0 * torch.randn(_PROBE_ROWS, hidden, generator=g, device="cpu", dtype=torch.float32)
            # (the weight is not copied: the probes' replace it, on the CPU; a meta one has no data)
            probe = copy.deepcopy(module, {id(weight): None})
            probe.__dict__.pop("forward", None)  # (the class's own forward, not one a kernel hook put on the instance)
            candidates = set(FAMILIES)
            for w_dtype, x_dtype in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                     (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
                wp = w.to(w_dtype)
                probe.weight = nn.Parameter(wp, requires_grad=False)
                probe.to("cpu")  # (any other tensor the module holds; one on meta raises: left alone)
                got = probe(x.to(x_dtype))
                for family in list(candidates):
                    want = FORMULAS[family](x.to(x_dtype), wp, eps)
                    if not isinstance(got, Tensor) or got.dtype != want.dtype or not torch.equal(got, want):
                        candidates.discard(family)
                if not candidates:
                    return None
    except Exception:  # a module that cannot run on the probes computes something else
        return None
    return next(f for f in FAMILIES if f in candidates)
