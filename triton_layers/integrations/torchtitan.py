"""torchtitan (0.3.0): its RMSNorms swapped for :class:`triton_layers.TritonRMSNorm`.

torchtitan 0.3.0 builds its models from a tree of dataclass configs (``Module.Config``)
and swaps layers by rewriting that tree before anything is built; there is no registry of
module converters by name (nor a ``--model.converters`` flag) any more. Two of its own
mechanisms take a third party's layer, and this module plugs into both:

- an **override**, :func:`rms_norm`, registered (by importing this module) with
  torchtitan's ``@override`` under its import path,
  ``triton_layers.integrations.torchtitan.rms_norm``. The trainer imports the module and
  applies it when that path is listed in ``--override.imports``::

      torchrun --nproc_per_node 2 -m torchtitan.train --module llama3 \\
          --config llama3_debugmodel --parallelism.tensor_parallel_degree 2 \\
          --override.imports triton_layers.integrations.torchtitan.rms_norm

  It runs after the model config got its sharding (``update_from_config``), so the new
  configs keep the stock norms' ``sharding_config``;
- a **model converter**, :class:`TritonRMSNormConverter` (a ``ModelConfigConverter``), for
  a config function of one's own: ``model_registry("debugmodel",
  converters=[TritonRMSNormConverter.Config()])``.

Either replaces every ``RMSNorm.Config`` of ``torchtitan.models.common`` (exactly that
class: subclasses computing something else, such as muse_glimmer's
``RMSGainCenterNorm``, are left alone) by :class:`TitanTritonRMSNorm.Config`, which copies
its fields (shape, eps, elementwise_affine, ``param_init``, ``sharding_config``). A built
model that was not parallelized yet can be converted in place too, weights kept:
:func:`convert_model`.

:class:`TitanTritonRMSNorm` is a :class:`TritonRMSNorm` that satisfies torchtitan's
``Module`` protocol, which plain ``triton_layers.convert`` output would not: the trainer
rejects non-``Module`` submodules (``verify_module_protocol``), ``init_states`` would
never initialize their weights after the meta-device build, and ``Module.parallelize``
would not shard them. Its forward's first argument keeps ``nn.RMSNorm``'s name, ``input``,
because torchtitan's sharding configs address the arguments by name.

Importing this module imports torchtitan; ``import triton_layers`` does not.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor, nn
from torchtitan.config import derive, override
from torchtitan.models.common import RMSNorm
from torchtitan.protocols.model import ModelConfigConverter
from torchtitan.protocols.module import Module

from ..layers import TritonRMSNorm

__all__ = ["OVERRIDE", "TitanTritonRMSNorm", "TritonRMSNormConverter", "convert_model", "rms_norm"]

logger = logging.getLogger("triton_layers")

#: What to list in ``--override.imports`` (the override's import path).
OVERRIDE = f"{__name__}.rms_norm"


class TitanTritonRMSNorm(TritonRMSNorm, Module):
    """:class:`TritonRMSNorm` as a torchtitan ``Module``, built from :class:`Config`.

    Computes what torchtitan's ``RMSNorm`` (``nn.RMSNorm``) computes; its ``weight`` has
    the same name and shape, so checkpoints load both ways. Set as ``convert`` sets the
    norms it makes from ``nn.RMSNorm``: under torch.compile a call runs as torch ops
    (Inductor fuses it with the adds around it; ``use_triton=True`` keeps the kernels), and
    under autocast it writes what ``nn.RMSNorm`` would.
    """

    torch_ops_when_compiled = True
    output_under_autocast = "torch"

    @dataclass(kw_only=True, slots=True)
    class Config(RMSNorm.Config):
        # A subclass of the stock config, so that code checking isinstance(cfg,
        # RMSNorm.Config) (the trainer's, a user's) still takes it for a norm.
        use_triton: Optional[bool] = None
        """``None``: the kernels where they run (CUDA; CPU under TRITON_INTERPRET=1),
        ``True``/``False``: force the kernels / the pure-torch reference."""

    def __init__(self, config: Config) -> None:
        # Parameters are created on the current default device and dtype, as nn.RMSNorm's
        # are: the trainer builds under torch.device("meta") and its training dtype.
        TritonRMSNorm.__init__(self, config.normalized_shape, eps=config.eps,
                               elementwise_affine=config.elementwise_affine, use_triton=config.use_triton)

    def forward(self, input: Tensor, *, residual: Optional[Tensor] = None,  # noqa: A002 (nn.RMSNorm's name)
                residual_in_place: bool = False) -> Union[Tensor, tuple[Tensor, Tensor]]:
        """``TritonRMSNorm.forward`` with its first argument named ``input``, as the
        sharding configs torchtitan gives its norms name it, and ``residual`` keyword-only:
        ``Module.parallelize`` wraps forward to take every positional parameter by name (an
        optional positional one left out raises there). torchtitan's blocks pass no
        residual, and its sharding configs declare none."""
        return TritonRMSNorm.forward(self, input, residual, residual_in_place=residual_in_place)


def _converted(cfg: RMSNorm.Config, use_triton: Optional[bool]) -> TitanTritonRMSNorm.Config:
    # derive copies every field the two configs share (normalized_shape, eps,
    # elementwise_affine, param_init, sharding_config), including ones a later torchtitan
    # adds to RMSNorm.Config.
    return derive(cfg, TitanTritonRMSNorm.Config, use_triton=use_triton)


@override(target=RMSNorm.Config, exact=True,
          description="triton_layers: RMSNorm -> TritonRMSNorm (Triton kernels)")
def rms_norm(cfg: RMSNorm.Config, *, use_triton: Optional[bool] = None) -> TitanTritonRMSNorm.Config:
    """The override: one stock ``RMSNorm.Config`` -> :class:`TitanTritonRMSNorm.Config`.

    Enabled with ``--override.imports triton_layers.integrations.torchtitan.rms_norm``
    (kwargs as JSON: ``'triton_layers.integrations.torchtitan.rms_norm={"use_triton": true}'``)
    or ``Trainer.Config.override.imports``. ``exact=True``: subclasses of ``RMSNorm.Config``
    may compute another norm, so they are not claimed.
    """
    return _converted(cfg, use_triton)


def _convert_config(model_config: Module.Config, use_triton: Optional[bool]) -> tuple[Module.Config, int]:
    # (list(): the tree is mutated while walked; traverse does not descend into a match.)
    count = 0
    for fqn, cfg, parent, attr in list(model_config.traverse(RMSNorm.Config)):
        if type(cfg) is not RMSNorm.Config:  # ours already, or a subclass computing something else
            continue
        new = _converted(cfg, use_triton)
        count += 1
        if parent is None:  # the root config itself is a norm
            model_config = new
        elif isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    return model_config, count


class TritonRMSNormConverter(ModelConfigConverter):
    """A torchtitan ``ModelConfigConverter``: every stock ``RMSNorm.Config`` of the model
    config -> :class:`TitanTritonRMSNorm.Config`.

    For config functions of one's own (``model_registry(flavor, converters=[...])``,
    applied when the ``ModelSpec`` is made, before ``update_from_config`` gives the norms
    their sharding, which the new configs take as the stock ones would)::

        from torchtitan.models.llama3 import model_registry
        from triton_layers.integrations.torchtitan import TritonRMSNormConverter

        spec = model_registry("debugmodel", converters=[TritonRMSNormConverter.Config()])
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        use_triton: Optional[bool] = None
        """Passed to every new norm (:class:`TitanTritonRMSNorm.Config`)."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def convert(self, model_config: Module.Config) -> Module.Config:
        model_config, count = _convert_config(model_config, self.config.use_triton)
        logger.info("TritonRMSNormConverter: %d RMSNorm config(s) -> TitanTritonRMSNorm", count)
        return model_config


def convert_model(model: nn.Module, *, use_triton: Optional[bool] = None) -> nn.Module:
    """Replace, in place, every stock torchtitan ``RMSNorm`` of a built model that was not
    parallelized yet by a :class:`TitanTritonRMSNorm` with a copy of its weight (device and
    dtype kept; a meta weight stays meta), its eps, and its ``param_init`` and
    ``sharding_config``, so that ``init_states`` and ``parallelize`` treat it as they
    would the stock norm. Returns ``model`` (or the new norm, if ``model`` is one).

    Converting the config (:func:`rms_norm`, :class:`TritonRMSNormConverter`) is the usual
    way; this is for a model already built, weights loaded.
    """

    def replacement(norm: RMSNorm) -> TitanTritonRMSNorm:
        if norm._parallelized:
            raise ValueError("convert_model: the model was parallelized already (its forward is wrapped): "
                             "convert the config instead, or convert before parallelize")
        cfg = TitanTritonRMSNorm.Config(normalized_shape=norm.normalized_shape, eps=norm.eps,
                                        elementwise_affine=norm.elementwise_affine, use_triton=use_triton)
        weight = norm.weight
        with torch.device(weight.device if weight is not None else "cpu"):
            new = cfg.build()
        if weight is not None:
            new.to(weight.dtype)
            if weight.device.type != "meta":
                with torch.no_grad():
                    new.weight.copy_(weight)
            new.weight.requires_grad_(weight.requires_grad)
        new._param_init, new._sharding_config = norm._param_init, norm._sharding_config
        return new

    if type(model) is RMSNorm:
        return replacement(model)
    done: dict[int, TitanTritonRMSNorm] = {}  # a norm shared by several parents stays shared
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) is RMSNorm:
                if id(child) not in done:
                    done[id(child)] = replacement(child)
                setattr(parent, name, done[id(child)])
    logger.info("triton_layers.integrations.torchtitan.convert_model: %d RMSNorm -> TitanTritonRMSNorm", len(done))
    return model
