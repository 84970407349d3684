"""Checks of the modules' constructor arguments.

The value checkers (``check_int``, ``check_number``, ``check_flag``, ``check_use_triton``) are
``_values``'s, shared with the functional ops and the references: ``TypeError`` for the wrong
kind of value, ``ValueError`` for a wrong value, each naming the argument and what was given
(never an ``assert``).
"""
from __future__ import annotations

from typing import Optional, Tuple

# The value checkers are the functional ops' own (one checker for every door into an op).
from .._values import check_flag, check_int, check_int_sequence, check_number, check_use_triton  # noqa: F401
from ..fp8 import FP8Recipe


def check_normalized_shape(value: object) -> Tuple[int, ...]:
    """An int or a non-empty sequence of ints >= 0 (not a str: "16" is not (1, 6))."""
    shape = check_int_sequence(value, "normalized_shape")
    if not shape:
        raise ValueError("normalized_shape must have at least one dim, got ()")
    if any(d < 0 for d in shape):
        raise ValueError(f"normalized_shape must be non-negative, got {shape}")
    return shape


def check_fp8(value: object, normalized_shape: Tuple[int, ...]) -> Optional[FP8Recipe]:
    """None or an :class:`~triton_layers.FP8Recipe` (the FP8 norms normalize one dim)."""
    if value is None:
        return None
    if not isinstance(value, FP8Recipe):
        raise TypeError(f"fp8 must be None or a triton_layers.FP8Recipe; got {type(value).__name__}")
    if len(normalized_shape) != 1:
        raise ValueError(f"the FP8 norms normalize the last dim only; got normalized_shape {normalized_shape}")
    return value


def check_fp8_call(recipe: object, normalized_shape: Tuple[int, ...], residual_in_place: bool) -> None:
    """A module's FP8 call: its recipe (an attribute, so it may have been set since) and no in-place residual."""
    check_fp8(recipe, normalized_shape)
    if residual_in_place:
        raise ValueError("residual_in_place=True is not offered with an fp8 recipe: h is returned in FP8Rows.h")
