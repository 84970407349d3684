"""Checks of the modules' constructor arguments.

The value checkers (``check_int``, ``check_number``, ``check_flag``, ``check_use_triton``) are
``_values``'s, shared with the functional ops and the references: ``TypeError`` for the wrong
kind of value, ``ValueError`` for a wrong value, each naming the argument and what was given
(never an ``assert``).
"""
from __future__ import annotations

from typing import Tuple

# The value checkers are the functional ops' own (one checker for every door into an op).
from .._values import check_flag, check_int, check_int_sequence, check_number, check_use_triton  # noqa: F401


def check_normalized_shape(value: object) -> Tuple[int, ...]:
    """An int or a non-empty sequence of ints >= 0 (not a str: "16" is not (1, 6))."""
    shape = check_int_sequence(value, "normalized_shape")
    if not shape:
        raise ValueError("normalized_shape must have at least one dim, got ()")
    if any(d < 0 for d in shape):
        raise ValueError(f"normalized_shape must be non-negative, got {shape}")
    return shape
