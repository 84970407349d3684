"""Our RMSNorm as a layer for the ``kernels`` package: transformers' own kernel hook.

transformers 5 marks its RMSNorm classes ``@use_kernel_forward_from_hub("RMSNorm")``;
``kernels.kernelize(model, mode=..., device=...)`` then replaces the ``forward`` of each such
module by the layer a mapping names for ``"RMSNorm"``. :class:`RMSNorm` is such a layer (the
``kernels`` rules: no ``__init__``, no members of its own but ``can_torch_compile`` and
``has_backward``; its state, ``weight`` and the epsilon, read from the module it runs in),
computing each module's own family of numerics (``triton_layers/_families.py``, told once per
class by running the class's own forward on probes) through our kernels, in the dtype the
module writes (autocast leaves it alone, as it leaves the module's code). It trains
(``has_backward``) and compiles (``can_torch_compile``: our custom op under torch.compile). A
class computing no family we know keeps its own forward.

    import kernels
    import triton_layers.hub

    with kernels.use_kernel_mapping(triton_layers.hub.kernel_mapping()):
        model = kernels.kernelize(model, mode=kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE)

``kernels`` is an optional dependency (``pip install triton_layers[hub]``); this module
imports it only in :func:`kernel_mapping`. transformers switches its hook on only with the
``kernels`` versions it supports (5.24: ``>=0.18.2,<0.19``); with another, ``kernelize`` leaves
every norm's forward as it was, and :func:`kernel_mapping` warns that it will.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Optional

from torch import Tensor, nn

from . import functional as F
from ._families import LAYER_FLAGS, eps_of, family_of

__all__ = ["RMSNorm", "Repository", "kernel_mapping", "transformers_hook_off"]

# The family each host class computes (None: not one of ours), told once per class and
# whether the instance holds a weight (some classes, Gemma3n's, hold none when built so).
_FAMILY_OF_CLASS: dict[tuple, Optional[str]] = {}


def _family(module: nn.Module) -> Optional[str]:
    key = (type(module), getattr(module, "weight", None) is not None)
    if key not in _FAMILY_OF_CLASS:
        _FAMILY_OF_CLASS[key] = family_of(module)
    return _FAMILY_OF_CLASS[key]


def rms_norm_forward(module: nn.Module, hidden_states: Tensor) -> Tensor:
    """What :class:`RMSNorm` computes in ``module``: the module's family through our kernels,
    or the module's own forward where it computes no family of ours."""
    family = _family(module)
    if family is None:
        return type(module).forward(module, hidden_states)
    cast_before_weight, unit_offset = LAYER_FLAGS[family]
    # (NormOptions built positionally, in its field order: a third of the keyword form's host time)
    return F._norm(hidden_states, module.weight, None, None, F.NormOptions(
        eps_of(module), None, None, None, None, True, False, unit_offset, cast_before_weight, False, False))


class RMSNorm(nn.Module):
    """The ``kernels`` layer for transformers' ``"RMSNorm"`` (see the module docstring)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: Tensor) -> Tensor:
        return rms_norm_forward(self, hidden_states)


class Repository:
    """A ``kernels`` repository holding :class:`RMSNorm` (no download: the layer is ours)."""

    def load(self) -> type:
        return RMSNorm

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Repository)

    def __hash__(self) -> int:
        return hash(Repository)

    def __repr__(self) -> str:
        return "triton_layers.hub.Repository()"


def kernel_mapping(devices: tuple = ("cuda", "cpu")) -> dict:
    """The mapping for ``kernels.use_kernel_mapping``/``register_kernel_mapping``: ``"RMSNorm"``
    to :class:`RMSNorm` on ``devices``, for every mode (training, inference, torch.compile)."""
    import kernels  # noqa: F401  (the optional dependency this mapping is for)

    off = transformers_hook_off()
    if off:
        warnings.warn(off, UserWarning, stacklevel=2)
    return {"RMSNorm": {device: Repository() for device in devices}}


def transformers_hook_off() -> Optional[str]:
    """Why transformers' kernel hook is off, so that ``kernels.kernelize`` would leave its models'
    norms as they are (the ``kernels`` installed is not a version transformers supports, or
    ``USE_HUB_KERNELS`` turns it off); None where it is on, or transformers is not imported
    (a model of another library may use ``kernels``' own hook)."""
    if "transformers" not in sys.modules:
        return None
    try:
        from transformers.utils import import_utils
    except ImportError:  # (a transformers without the hook: nothing for the mapping to do there)
        return f"transformers {sys.modules['transformers'].__version__} has no kernel hook"
    import kernels

    low, high = (getattr(import_utils, name, "?") for name in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"))
    why = None
    if not import_utils.is_kernels_available():
        why = (f"transformers {sys.modules['transformers'].__version__} switches its kernel hook on with kernels "
               f">={low},<{high}; kernels {getattr(kernels, '__version__', '?')} is installed")
    elif os.environ.get("USE_HUB_KERNELS", "YES").upper() not in getattr(import_utils, "ENV_VARS_TRUE_VALUES",
                                                                          {"1", "ON", "TRUE", "YES"}):
        why = "USE_HUB_KERNELS turns transformers' kernel hook off"
    if why is None:
        return None
    return (f"triton_layers.hub: {why}, so kernels.kernelize leaves every Hugging Face norm's forward as it is: "
            f"pip install 'kernels>={low},<{high}' (triton_layers.convert(model) replaces the norms without it)")
