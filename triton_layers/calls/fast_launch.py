"""Eager launches of our Triton kernels without Triton's per-call Python binding.

``direct`` is how the eager door launches: ``direct(kernel)[grid](*args, **constexprs)``
goes through :class:`_FastLaunch`, which keeps each compiled kernel by its specialization
key (:func:`_key`) and launches it through its compiled launcher; a plan's
:class:`KernelCall` keeps the compiled kernel it found and launches it without a key.
The compiled door launches through ``wrap_triton`` instead (calls/doors.py).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import torch
from torch import Tensor


def direct(kernel):
    """How the eager door launches ``kernel`` (the compiled door passes ``wrap_triton``):
    on a GPU through the compiled kernel's own launcher (:class:`_FastLaunch`), under the
    Triton interpreter as is."""
    fast = _FAST.get(kernel)
    if fast is None:
        fast = _FAST[kernel] = _FastLaunch(kernel) if _FastLaunch.supports(kernel) else _Quiet(kernel)
    return fast


def traced(launcher: Callable) -> bool:
    """Whether a launcher is not the eager door's ``direct``: the compiled door's ``wrap_triton``
    (or a recorder of launches)."""
    return launcher is not direct


class _Quiet:
    """A kernel launched as it is (the Triton interpreter's), with numpy's floating-point
    warnings off: the interpreter computes in numpy, which warns where the GPU computes IEEE
    results silently (an inf in a row, eps=0 on a constant row): the same values, no noise."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def quiet(*args, **kwargs):
            import numpy as np  # (the interpreter's own dependency)

            with np.errstate(all="ignore"):
                return launch(*args, **kwargs)
        return quiet


_FAST: dict = {}


def _key(device: int, args: tuple, kwargs: dict) -> tuple:
    """What the compiled kernel for ``args`` depends on, or finer: each tensor's dtype and
    16-byte alignment, every other argument's value and type (Triton specializes ints on
    being 1, a multiple of 16, 32-bit; a value is finer), the constexprs and options by
    name, the device. One flat tuple: building and hashing it for LayerNorm's forward (14
    arguments, 11 constexprs and options) took 4.7 us on a CPU against 7.9 us with a tuple
    per argument; it is most of a cached launch's Python. An aligned tensor stands as its
    dtype alone (no pair built: 3.6 against 4.8 us a key on a CPU), a misaligned one as
    ``(dtype, False)``."""
    return (device, *[(a.dtype if not a.data_ptr() & 15 else (a.dtype, False)) if isinstance(a, Tensor) else a
                      for a in args],
            *map(type, args), *kwargs.items())


class _FastLaunch:
    """Eager launches of one ``@triton.jit`` kernel without Triton's per-call binding.

    ``kernel[grid](*args, **constexprs)`` through ``JITFunction.run`` binds and specializes
    every argument in Python on each call: on an H200 host (Triton 3.6, LayerNorm's forward,
    ``python -m benchmarks.bench_host --parts``) 24-35 us a launch, against 14-18 us through
    this class (of which the key 3.5-5.4 us and the C launch 6-8 us). The first call with a given
    specialization key (:func:`_key`) goes through Triton, which compiles or finds the
    kernel; later calls launch that compiled kernel directly, as ``JITFunction.run`` does.
    Triton's own switches (the runtime's ``stepped_aside``: kernels/_launcher.py) send every call
    through Triton.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.constexprs = tuple(p.name for p in kernel.params if p.is_constexpr)
        self.n_params = len(kernel.params)
        self.compiled: dict = {}
        self.pre_run_hooks = getattr(kernel, "pre_run_hooks", ())

    @staticmethod
    def supports(kernel) -> bool:
        """A GPU JITFunction whose constexpr parameters come last (ours all do), where Triton's
        runtime is bound and has a GPU driver."""
        # (not: the interpreter's kernels, or a Triton too different from ours)
        return bool(_BINDING) and _BINDING[0].launchable(kernel) and _triton_runtime() is not None

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        runtime = _RUNTIME[0]  # (set: every _FastLaunch passed supports(), which asked _triton_runtime())
        if runtime.stepped_aside(self.pre_run_hooks):
            return self.kernel[grid](*args, **kwargs)
        device = current_device()
        key = _key(device, args, kwargs)
        hit = self.compiled.get(key)
        if hit is None:
            if len(self.compiled) >= MAX_KEYS:  # ints are keyed by value: bound the shapes kept
                self.compiled.clear()
            compiled = self.kernel[grid](*args, **kwargs)  # compiles (or finds) and launches
            values = tuple(kwargs.get(name, _MISSING) for name in self.constexprs)
            if compiled is not None and _MISSING not in values and len(args) + len(values) == self.n_params:
                self.compiled[key] = (*_BINDING[0].launcher(compiled), compiled, values)
            return compiled
        launch, prefix, compiled, values = hit
        launch(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, runtime.stream(device),
               compiled.function, *prefix, *args, *values)
        return compiled


_WRAP_TRITON = torch.library.wrap_triton  # (the compiled door's launch: KernelCall gives it _traced)
_MISSING = object()
# torch.cuda.current_device less its lazy-initialization check, on every launch: a CUDA
# tensor in hand means CUDA is initialized. (CPU builds of torch lack it: the public one.)
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
MAX_KEYS = 4096


class TritonBinding(NamedTuple):
    """What the fast launch asks of Triton's runtime, given by the kernels when they are imported
    (kernels/_launcher.py), so that only ``kernels/`` imports Triton."""

    runtime: Callable[[], Any]
    """Makes the runtime object (once, at the first fast launch): ``stream(device)``, the current
    stream, and ``stepped_aside(pre_run_hooks)``, whether Triton's own launch must run instead.
    Raises ImportError, AttributeError or RuntimeError where there is none (no GPU driver)."""
    launchable: Callable[[Any], bool]
    """Whether a kernel is a GPU ``@triton.jit`` function whose constexpr parameters come last."""
    launcher: Callable[[Any], tuple]
    """``(launch, prefix)`` of a compiled kernel, called as ``launch(grid0, grid1, grid2, stream,
    function, *prefix, *args, *constexprs)``."""


_BINDING: list = []  # the TritonBinding bind() was given
_RUNTIME: list = []  # the runtime object it made, or None where it could not


def bind(binding: TritonBinding) -> None:
    """Give the fast launch Triton's runtime (kernels/_launcher.py, at import)."""
    _BINDING[:] = [binding]
    _RUNTIME.clear()


def _triton_runtime():
    if not _RUNTIME:
        try:
            _RUNTIME.append(_BINDING[0].runtime())
        except (ImportError, AttributeError, RuntimeError):  # no GPU driver, or another Triton
            _RUNTIME.append(None)
    return _RUNTIME[0]


class KernelCall:
    """One launch of a ``@triton.jit`` kernel, decided by a plan: the kernel, its grid, its
    arguments after the tensors (every kernel of ours takes its tensors first), its
    constexprs and launch options, the CUDA device. Called with the launcher (``direct`` or
    ``wrap_triton``) and the tensors.

    Eagerly on a GPU, a call launches through :class:`_FastLaunch` until the call has found
    the compiled kernel there (on its second launch: a signature met once, as when shapes
    change on every call, pays no more than an unplanned launch); later calls launch that
    directly, without the specialization key :func:`_key` builds per launch (the plan's own
    key fixes everything that key reads: the tensors' dtypes, alignment and None-ness, every
    other argument's value)."""

    __slots__ = ("kernel", "grid", "scalars", "constexprs", "device", "_hit", "_pre_run_hooks", "_traced")

    def __init__(self, kernel, grid: tuple, scalars: tuple, constexprs: dict, device: Optional[int]):
        self.kernel, self.grid, self.scalars, self.constexprs, self.device = kernel, grid, scalars, constexprs, device
        self._hit = None
        self._pre_run_hooks = getattr(kernel, "pre_run_hooks", ())  # (Triton's list, appended to in place)
        # What the compiled door (wrap_triton) is given: no programmatic dependent launch (no
        # launch_pdl, USE_PDL False). Inductor decides the launch attributes of what it launches,
        # and its mutation analysis reads the kernel's grid-dependency wait as a write to every
        # pointer argument, so that it would copy inputs the kernel only reads.
        self._traced = {k: (False if k == "USE_PDL" else v) for k, v in constexprs.items() if k != "launch_pdl"}

    def _decisions(self) -> tuple:
        return (self.kernel, self.grid, self.scalars, self.constexprs, self.device)

    def __eq__(self, other) -> bool:
        """Two calls are equal when they would launch alike (the compiled kernel found is not compared):
        how ``TRITON_LAYERS_CHECK_PLANS`` compares a cached plan with one made anew."""
        return isinstance(other, KernelCall) and self._decisions() == other._decisions()

    def __hash__(self) -> int:
        return hash((self.kernel, self.grid, self.scalars, tuple(self.constexprs.items()), self.device))

    def __repr__(self) -> str:
        name = getattr(self.kernel, "__name__", None) or getattr(getattr(self.kernel, "fn", None), "__name__", "?")
        return f"KernelCall({name}, grid={self.grid}, scalars={self.scalars}, constexprs={self.constexprs})"

    def __call__(self, launcher: Callable, *tensors) -> None:
        hit = self._hit
        if hit and launcher is direct:
            runtime = _RUNTIME[0]
            if not runtime.stepped_aside(self._pre_run_hooks):
                c_launch, g0, g1, g2, function, prefix, tail = hit
                c_launch(g0, g1, g2, runtime.stream(self.device), function, *prefix, *tensors, *tail)
                return
        launcher(self.kernel)[self.grid](*tensors, *self.scalars,
                                         **(self._traced if launcher is _WRAP_TRITON else self.constexprs))
        if hit is None and launcher is direct:
            self._hit = False  # launched once: the next eager launch looks for the compiled kernel
        elif hit is False and launcher is direct and self.device is not None:
            fast = _FAST.get(self.kernel)
            if isinstance(fast, _FastLaunch):
                entry = fast.compiled.get(_key(self.device, (*tensors, *self.scalars), self.constexprs))
                if entry is not None:
                    c_launch, prefix, compiled, values = entry
                    grid = (*self.grid, 1, 1)
                    self._hit = (c_launch, grid[0], grid[1], grid[2], compiled.function, prefix,
                                 (*self.scalars, *values))
