"""The one checker of the ops' and modules' plain values (counts, numbers, flags, shapes).

Wherever a value enters (a functional op, a module's constructor or call, a reference in
``reference.py``), the same bad value gets the same exception, by one rule:

- the wrong kind of value is a ``TypeError``: a bool or a float where an int is required, a
  bool or a non-number where a number is, anything but True or False where a flag is;
- a value of the right kind out of its range is a ``ValueError``: an int under its minimum,
  a number that is negative, zero or not finite where the argument forbids it.

Ints are ``numbers.Integral`` (numpy ints too) but not bool; numbers are ``numbers.Real``
(ints and numpy floats too) but not bool. Each message names the argument and what was given.
Imports nothing of the package, so that ``reference`` (which the kernels import) can use it.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence


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


def check_k_within_row(k: float, shape: Sequence[int]) -> None:
    """coor_descent's number ``k`` must not exceed ``n = shape[-1]``: every score lies in
    [0, 1], so a row of n entries cannot sum to more than n and k > n has no answer (the
    iterations stop at some sum under n). ``k == n`` (every entry chosen) is allowed, as the
    router's ``min(k, n)``. A row of no entries (n = 0) has nothing to score: any k.
    (A tensor k is not checked: reading its values would sync the host on every call.)"""
    n = shape[-1]
    if n > 0 and k > n:
        raise ValueError(
            f"k={k!r} is more than the {n} entries of each row of s (shape {tuple(shape)}): the soft "
            f"top-k's scores lie in [0, 1], so a row cannot sum to k; pass k <= {n} (min(k, s.shape[-1]), "
            f"as CoordinateDescentRouter does)")


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


def check_int_sequence(value: object, name: str) -> tuple[int, ...]:
    """An int or a sequence of ints (not a str: "16" is not (1, 6)), as a tuple; the caller
    checks the values."""
    if _is_int(value):
        return (int(value),)
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(_is_int(d) for d in value):
        raise TypeError(f"{name} must be an int or a sequence of ints, got {_given(value)}")
    return tuple(int(d) for d in value)
