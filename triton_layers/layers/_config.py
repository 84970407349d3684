"""Checks of the modules' constructor arguments.

As the functional ops' input checks: ``TypeError`` for the wrong kind of value,
``ValueError`` for a wrong value, each naming the argument and what was given (never an
``assert``). Ints are ``numbers.Integral`` (numpy ints too) but not bool; numbers are
``numbers.Real`` but not bool.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple


def _given(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value: object, name: str, minimum: int) -> int:
    """``value`` must be an int >= ``minimum``."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {_given(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_number(
    value: object, name: str, *, positive: bool = False, minimum: Optional[float] = None,
    allow_none: bool = False,
) -> Optional[float]:
    """``value`` must be a finite real number (``> 0`` with ``positive``, ``>= minimum``
    with ``minimum``), or None when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number{' or None' if allow_none else ''}, got {_given(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if minimum is not None and not value >= minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


def check_flag(value: object, name: str) -> bool:
    """``value`` must be True or False (a string such as "False" would be truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_given(value)}")
    return value


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
