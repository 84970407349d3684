"""Swap the norm layers of an existing model (torch's, Hugging Face's) for triton_layers modules."""
from __future__ import annotations

import logging
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from ._families import FAMILIES, family_of
from .layers import TritonLayerNorm, TritonRMSNorm

logger = logging.getLogger("triton_layers")

# Norm classes registered by users (register_norm): class -> family.
_REGISTERED: dict[type, str] = {}


def register_norm(cls: Optional[type] = None, family: Optional[str] = None):
    """Teach :func:`convert` a norm class of yours that computes as a known family does but
    that convert cannot recognize by running it (it needs other arguments, say), so that it
    is replaced too. ``family`` (``triton_layers/_families.py`` has the formulas):

    - ``"llama"``: ``weight * norm(x.float()).to(x.dtype)`` (``LlamaRMSNorm``'s numerics);
    - ``"olmo2"``: ``(weight * norm(x.float())).to(x.dtype)`` (``Olmo2RMSNorm``'s);
    - ``"gemma"``: ``(norm(x.float()) * (1 + weight.float())).to(x.dtype)`` (``GemmaRMSNorm``'s).

    The module must hold its scale as ``weight`` and its epsilon as ``variance_epsilon``,
    ``eps`` or ``epsilon``. Only that exact class is matched. Returns ``cls``, so it can
    decorate a class definition::

        @triton_layers.register_norm(family="llama")   # or register_norm(MyRMSNorm, "llama")
        class MyRMSNorm(nn.Module): ...
    """
    if cls is None:  # as a decorator: @register_norm(family=...)
        return lambda c: register_norm(c, family)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise TypeError(f"register_norm takes an nn.Module subclass, got {cls!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
    _REGISTERED[cls] = family
    return cls


@dataclass
class ConversionSummary:
    """What :func:`convert` did (or, with ``dry_run=True``, would do): modules replaced, by
    class name; the family of numerics each replaced class computes (``"layer_norm"`` and
    ``"rms_norm"`` for torch's own); norm-like modules left alone, by class name; and
    whether this was a dry run, in which case nothing was replaced.

    ``str()`` is convert's one wording of its report, the line it logs too: "replaced 2
    LlamaRMSNorm (llama); left alone (unknown norms): 1 T5LayerNorm", or for a dry run
    "would replace 2 LlamaRMSNorm (llama); would leave alone (unknown norms): ...".
    """

    replaced: Counter = field(default_factory=Counter)
    families: dict = field(default_factory=dict)
    left_alone: Counter = field(default_factory=Counter)
    dry_run: bool = False

    def __str__(self) -> str:
        def counts(c: Counter, with_family: bool) -> str:
            return ", ".join(f"{n} {name}" + (f" ({self.families[name]})" if with_family else "")
                             for name, n in sorted(c.items())) or "nothing"

        # (A dry run changed nothing: its report must not say "replaced".)
        replace, leave = ("would replace", "would leave") if self.dry_run else ("replaced", "left")
        text = f"{replace} {counts(self.replaced, True)}"
        return text + (f"; {leave} alone (unknown norms): {counts(self.left_alone, False)}" if self.left_alone else "")


def _family(module: nn.Module) -> Optional[str]:
    if isinstance(module, nn.LayerNorm):
        return "layer_norm"
    if isinstance(module, nn.RMSNorm):
        return "rms_norm"
    if type(module) in _REGISTERED:
        return _REGISTERED[type(module)]
    if isinstance(module, (TritonLayerNorm, TritonRMSNorm)) or "Norm" not in type(module).__name__:
        return None  # (only norm-like classes are run on the probes)
    return family_of(module)


def _replacement(module: nn.Module, family: str, fast_autocast: bool, kwargs: dict) -> nn.Module:
    if family == "layer_norm":
        new = TritonLayerNorm.from_torch(module, **kwargs)
    elif family == "rms_norm":
        new = TritonRMSNorm.from_torch(module, **kwargs)
    else:
        new = TritonRMSNorm.from_hf(module, family=family, **kwargs)
    new.torch_ops_when_compiled = True  # the model's own ops surround it (layers/_compiled.py)
    # What the module wrote under autocast (torch's norms: float32 on CUDA; Hugging Face's:
    # their own dtypes), unless asked for autocast's (layers/_autocast.py).
    new.output_under_autocast = "autocast" if fast_autocast else (
        "torch" if family in ("layer_norm", "rms_norm") else "unchanged")
    return new


def _unknown_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return ("LayerNorm" in name or "RMSNorm" in name) and not isinstance(module, (TritonLayerNorm, TritonRMSNorm))


def convert(model: nn.Module, *, return_summary: bool = False, dry_run: bool = False, fast_autocast: bool = False,
            **layer_kwargs: Any):
    """Replace the norms inside ``model`` (in place) by triton_layers modules computing the same:

    - ``nn.LayerNorm`` -> :class:`TritonLayerNorm`; ``nn.RMSNorm`` -> :class:`TritonRMSNorm`;
    - every RMSNorm class that computes one of the families of ``triton_layers/_families.py``
      (Llama's, Olmo2's, Gemma's numerics: nearly all of transformers' RMSNorms, Qwen3,
      Gemma2/3, Phi3, Olmo2, Llama4, Mixtral and DeepSeek-V3 among them), found by running
      a copy of each on fixed probes and comparing bits with the family's formula, and the
      classes given to :func:`register_norm` -> :class:`TritonRMSNorm` with that family's
      numerics (:meth:`TritonRMSNorm.from_hf`).

    Parameters are copied under the same names, so outputs match before and after and the
    state_dict still loads into the unconverted model. ``layer_kwargs`` (e.g. ``use_triton``)
    go to each new layer.

    Dtypes under autocast are the replaced module's by default: torch's norms write float32
    under CUDA autocast, Hugging Face's RMSNorms their own dtype. ``fast_autocast=True``
    writes autocast's dtype instead (bf16, say: one less cast for the next matmul): exact
    in a pre-norm decoder, whose norm outputs go straight into a matmul (Llama, Qwen,
    Mistral), but in a post-norm model (BERT; Gemma2/3's post-norms) the norm's output is
    added into the residual stream, which it would move to bf16.

    Under torch.compile the new layers run a call without a residual as torch ops
    (``torch_ops_when_compiled``), so that Inductor fuses them with the model's own residual
    adds and casts around them, which an opaque kernel would stop; eager calls run the
    kernels. ``use_triton=True`` keeps the kernels when compiled too. Other modules are left
    alone, norms we do not know included (a warning names their classes). A module passed as
    ``model`` is returned converted; a module shared by several parents stays shared.

    The report: one log line (logger ``triton_layers``, level INFO; nothing is printed, so
    it shows where logging is set to show INFO) says what was replaced, per class and
    family, in the words of ``str(ConversionSummary)``; ``return_summary=True`` returns
    ``(model, ConversionSummary)`` instead of the model. ``dry_run=True`` changes nothing,
    logs the same line in the conditional ("would replace ...") and returns that summary.
    """
    summary = ConversionSummary(dry_run=dry_run)
    done: dict[int, Optional[nn.Module]] = {}

    def swap(module: nn.Module) -> Optional[nn.Module]:
        if id(module) not in done:
            family = _family(module)
            new = None
            if family is not None:
                new = module if dry_run else _replacement(module, family, fast_autocast, layer_kwargs)
                summary.replaced[type(module).__name__] += 1
                summary.families[type(module).__name__] = family
            done[id(module)] = new
        return done[id(module)]

    def walk(parent: nn.Module) -> None:
        # Every name (named_children skips a module's second name under one parent).
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            new = swap(child)
            if new is not None:
                if not dry_run:
                    setattr(parent, name, new)
            elif id(child) not in walked:
                walked.add(id(child))
                if _unknown_norm(child):
                    summary.left_alone[type(child).__name__] += 1
                walk(child)

    walked: set[int] = set()
    root = swap(model)
    if root is None:
        walk(model)
        root = model
    # The report goes to logging, never to stdout: a library's user decides what is shown
    # (logging.basicConfig(level=logging.INFO), or a handler on the "triton_layers" logger).
    logger.info("triton_layers.convert: %s", summary)
    if dry_run:
        return summary
    if summary.left_alone:
        warnings.warn(f"triton_layers.convert left norms it does not know alone: "
                      f"{', '.join(sorted(summary.left_alone))}", stacklevel=2)
    return (root, summary) if return_summary else root
