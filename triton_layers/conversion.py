"""Swap the norm layers of an existing model (torch's, Hugging Face's) for triton_layers modules."""
from __future__ import annotations

import logging
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from .layers import TritonLayerNorm, TritonRMSNorm

logger = logging.getLogger("triton_layers")

# Hugging Face RMSNorm classes whose numerics we reproduce: (module, class name) -> family
# ("llama": weight * norm(x).to(x.dtype); "gemma": (norm(x) * (1 + weight)).to(x.dtype)).
HF_RMS_NORMS = {
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"): "llama",
    ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm"): "llama",
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"): "llama",
    ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"): "gemma",
}


# Norm classes registered by users (register_norm): class -> family.
_REGISTERED: dict[type, str] = {}
FAMILIES = ("llama", "gemma")


def register_norm(cls: Optional[type] = None, family: Optional[str] = None):
    """Teach :func:`convert` a norm class of yours (or of a library it does not know) that
    computes as a known family does, so that it is replaced too:

    - ``"llama"``: ``weight * (x / sqrt(mean(x^2) + eps)).to(x.dtype)`` in fp32, the eps in
      ``variance_epsilon`` (``LlamaRMSNorm``'s numerics);
    - ``"gemma"``: ``(x / sqrt(mean(x^2) + eps) * (1 + weight)).to(x.dtype)`` in fp32, the eps
      in ``eps`` (``GemmaRMSNorm``'s).

    The module must hold its scale as ``weight``. Only that exact class is matched (a subclass
    may compute otherwise). Returns ``cls``, so it can decorate a class definition::

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
    """What :func:`convert` did: modules replaced and norm-like modules left alone, counted
    by class name."""

    replaced: Counter = field(default_factory=Counter)
    left_alone: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        def counts(c: Counter) -> str:
            return ", ".join(f"{n} {name}" for name, n in sorted(c.items())) or "nothing"

        text = f"replaced {counts(self.replaced)}"
        return text + (f"; left alone (unknown norms): {counts(self.left_alone)}" if self.left_alone else "")


def _hf_classes() -> dict[type, str]:
    """The known Hugging Face classes that are loaded, class -> family. A model holding one
    has imported its module, so nothing is imported here (transformers stays optional)."""
    out = {}
    for (module_name, name), family in HF_RMS_NORMS.items():
        cls = getattr(sys.modules.get(module_name), name, None)
        if isinstance(cls, type):
            out[cls] = family
    out.update(_REGISTERED)
    return out


def _replacement(module: nn.Module, hf: dict[type, str], kwargs: dict) -> Optional[nn.Module]:
    if isinstance(module, nn.LayerNorm):
        return TritonLayerNorm.from_torch(module, **kwargs)
    if isinstance(module, nn.RMSNorm):
        return TritonRMSNorm.from_torch(module, **kwargs)
    family = hf.get(type(module))  # the exact class: a subclass may compute otherwise
    return None if family is None else TritonRMSNorm.from_hf(module, family=family, **kwargs)


def _unknown_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return ("LayerNorm" in name or "RMSNorm" in name) and not isinstance(module, (TritonLayerNorm, TritonRMSNorm))


def convert(model: nn.Module, *, return_summary: bool = False, **layer_kwargs: Any):
    """Replace the norms inside ``model`` (in place) by triton_layers modules computing the same:

    - ``nn.LayerNorm`` -> :class:`TritonLayerNorm`; ``nn.RMSNorm`` -> :class:`TritonRMSNorm`;
    - Hugging Face's ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm`` and
      ``GemmaRMSNorm``, and the classes given to :func:`register_norm` -> :class:`TritonRMSNorm`
      with that family's numerics (:meth:`TritonRMSNorm.from_hf`).

    Parameters are copied under the same names, so outputs match before and after and the
    state_dict still loads into the unconverted model. ``layer_kwargs`` (e.g. ``use_triton``)
    go to each new layer. Under torch.compile the new layers run a call without a residual
    as torch ops (``torch_ops_when_compiled``), so that Inductor fuses them with the model's
    own residual adds and casts around them, which an opaque kernel would stop; eager calls
    run the kernels. ``use_triton=True`` keeps the kernels when compiled too. Other modules
    are left alone, norms we do not know included (a warning names their classes). A module
    passed as ``model`` is returned converted; a module shared by several parents stays
    shared. One log line (logger ``triton_layers``, level INFO) says what was replaced;
    ``return_summary=True`` returns ``(model, ConversionSummary)`` instead of the model.
    """
    hf = _hf_classes()
    summary = ConversionSummary()
    done: dict[int, nn.Module] = {}

    def swap(module: nn.Module) -> Optional[nn.Module]:
        if id(module) not in done:
            new = _replacement(module, hf, layer_kwargs)
            if new is not None:
                new.torch_ops_when_compiled = True  # the model's own ops surround it (layers/_compiled.py)
                summary.replaced[type(module).__name__] += 1
            done[id(module)] = new
        return done[id(module)]

    def walk(parent: nn.Module) -> None:
        # Every name (named_children skips a module's second name under one parent).
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            new = swap(child)
            if new is not None:
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
    logger.info("triton_layers.convert: %s", summary)
    if summary.left_alone:
        warnings.warn(f"triton_layers.convert left norms it does not know alone: "
                      f"{', '.join(sorted(summary.left_alone))}", stacklevel=2)
    return (root, summary) if return_summary else root
