"""Checks of the modules' constructor arguments.

The value checkers (``check_int``, ``check_number``, ``check_flag``) are ``_checks``'s, shared
with the functional ops: ``TypeError`` for the wrong kind of value, ``ValueError`` for a
wrong value, each naming the argument and what was given (never an ``assert``).
"""
from __future__ import annotations

from typing import Sequence, Tuple

# The value checkers are the functional ops' own (one checker for both doors into an op).
from .._checks import _given, _is_int, check_flag, check_int, check_number  # noqa: F401


def check_use_triton(value: object) -> Optional[bool]:
    """``use_triton`` must be None (auto), True or False."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"use_triton must be None, True or False, got {_given(value)}")
    return value


def check_normalized_shape(value: object) -> Tuple[int, ...]:
    """An int or a non-empty sequence of ints >= 0 (not a str: "16" is not (1, 6))."""
    if _is_int(value):
        value = (value,)
    elif isinstance(value, str) or not isinstance(value, Sequence) or not all(_is_int(d) for d in value):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {_given(value)}")
    shape = tuple(int(d) for d in value)
    if not shape:
        raise ValueError("normalized_shape must have at least one dim, got ()")
    if any(d < 0 for d in shape):
        raise ValueError(f"normalized_shape must be non-negative, got {shape}")
    return shape
