"""Eager launches of our Triton kernels without Triton's per-call Python binding.

``direct`` is how the eager door launches: ``direct(kernel)[grid](*args, **constexprs)``
goes through :class:`_FastLaunch`, which keeps each compiled kernel by its specialization
key (:func:`_key`) and launches it through its compiled launcher; a plan's
:class:`KernelCall` keeps the compiled kernel it found and launches it without a key.
The compiled door launches through ``wrap_triton`` instead (calls/doors.py).
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional

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


def traced(launch: Callable) -> bool:
    """Whether a launcher is not the eager door's ``direct``: the compiled door's ``wrap_triton``
    (or a recorder of launches)."""
    return launch is not direct


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
    Triton's own switches (:meth:`_Runtime.stepped_aside`) send every call through Triton.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.constexprs = tuple(p.name for p in kernel.params if p.is_constexpr)
        self.n_params = len(kernel.params)
        self.compiled: dict = {}
        self.pre_run_hooks = getattr(kernel, "pre_run_hooks", ())

    @staticmethod
    def supports(kernel) -> bool:
        """A GPU JITFunction whose constexpr parameters come last (ours all do)."""
        from triton.runtime.jit import JITFunction

        if not isinstance(kernel, JITFunction) or _triton_runtime() is None:
            return False  # the interpreter's kernels, or a Triton too different from ours
        flags = [p.is_constexpr for p in kernel.params]
        return flags == sorted(flags)

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
                self.compiled[key] = (*_launcher(compiled), compiled, values)
            return compiled
        launch, prefix, compiled, values = hit
        launch(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, runtime.stream(device),
               compiled.function, *prefix, *args, *values)
        return compiled


def _launcher(compiled) -> tuple[Callable, tuple]:
    """How to launch ``compiled`` again: ``(launch, prefix)``, called as
    ``launch(grid0, grid1, grid2, stream, function, *prefix, *args, *constexprs)``.

    Through its launcher object (``compiled.run``) as ``JITFunction.run`` does, with no
    launch hooks; or, where that object has Triton 3.6's layout (``__call__(gridX, gridY,
    gridZ, stream, function, *args)``, which only allocates the scratch buffers that kernels
    using none skip, then calls the C ``launch``), through its C ``launch`` directly: the
    Python ``__call__`` builds two closures per call (H200 host, LayerNorm's forward kernel:
    7.1-8.9 us a launch through it, 5.9-7.9 us through the C launch).
    """
    runner = compiled.run
    plain = (runner, (compiled.packed_metadata, None, None, None))
    layout = _LAYOUTS.get(type(runner))
    if layout is None:
        try:
            params = tuple(inspect.signature(type(runner).__call__).parameters)
        except (TypeError, ValueError):
            params = ()
        layout = _LAYOUTS[type(runner)] = params == ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")
    if not layout or getattr(runner, "global_scratch_size", 1) or getattr(runner, "profile_scratch_size", 1):
        return plain
    try:
        c_launch, coop, pdl = runner.launch, runner.launch_cooperative_grid, runner.launch_pdl
    except AttributeError:
        return plain
    # launch(grid, stream, function, cooperative, pdl, global scratch, profile scratch,
    #        packed metadata, launch metadata, enter hook, exit hook, *arguments)
    return c_launch, (coop, pdl, None, None, compiled.packed_metadata, None, None, None)


_LAYOUTS: dict = {}  # launcher class -> whether it has Triton 3.6's layout (see _launcher)
_WRAP_TRITON = torch.library.wrap_triton  # (the compiled door's launch: KernelCall gives it _traced)
_MISSING = object()
# torch.cuda.current_device less its lazy-initialization check, on every launch: a CUDA
# tensor in hand means CUDA is initialized. (CPU builds of torch lack it: the public one.)
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
MAX_KEYS = 4096


class _Runtime:
    """The parts of Triton's runtime the fast launch needs: the current stream, and whether
    Triton's own launch must run instead (:meth:`stepped_aside`)."""

    def __init__(self):
        from triton import knobs
        from triton.runtime.driver import driver

        self.stream = driver.active.get_current_stream
        self.read_knobs(knobs)

    def read_knobs(self, knobs) -> None:
        """Keep Triton's ``knobs`` and the environment's debug and instrumentation switches as
        they are now. Triton 3.4-3.6 read those two from the environment on every access (a
        descriptor: about a microsecond a read, two reads a launch); 3.7 and later read them once,
        at import. :meth:`stepped_aside` reads an assignment (``knobs.runtime.debug = True``,
        which lands in the knobs object's own ``__dict__`` under every version) over these
        values: the environment is read once, as the newer Triton does."""
        self._runtime_knobs = knobs.runtime
        self._compilation_knobs = knobs.compilation
        self._debug = bool(knobs.runtime.debug)
        self._instrumentation = getattr(knobs.compilation, "instrumentation_mode", "") or ""
        # What the last look found quiet (see stepped_aside): the knobs objects' assignments
        # (None: not looked yet) and the launch hooks' lists of hooks (Triton adds in place).
        self._runtime_seen = self._compilation_seen = None
        self._enter_hooks = self._exit_hooks = ()

    def stepped_aside(self, pre_run_hooks) -> bool:
        """Whether a kernel must launch through Triton's own ``JITFunction.run`` now: while
        launch hooks are set (profilers such as proton), while Triton compiles another variant
        of every kernel (``knobs.runtime.debug``, ``knobs.compilation.instrumentation_mode``,
        a stages-inspection hook), or while the kernel has pre-run hooks. A compiled kernel we
        keep was built without any of these; Triton's own launch builds and runs the variant
        they ask for (and calls the hooks), and ours resumes once they are off. ``pre_run_hooks``:
        the kernel's list of them (Triton appends to it in place), or ().

        On every eager launch, so in two steps: while nothing was assigned on the knobs objects
        since a full look (:meth:`_look`) found every switch off, and no launch hook was added to
        their lists, the answer is that look's (two dict comparisons, three list tests); else a
        full look. (Knobs that Triton reads from the environment on each access, such as 3.9's
        ``fpsan_homomorphic_casts``, are not read: set them before the first launch. Assigning on
        the knobs *classes* rather than ``triton.knobs.runtime``/``.compilation`` is not seen.)"""
        if (pre_run_hooks or self._enter_hooks or self._exit_hooks or self._runtime_knobs.__dict__ != self._runtime_seen
                or self._compilation_knobs.__dict__ != self._compilation_seen):
            return self._look(pre_run_hooks)
        return False

    def _look(self, pre_run_hooks) -> bool:
        """:meth:`stepped_aside`'s full look at every switch; when all are off, what it saw is
        kept for the fast test."""
        k = self._runtime_knobs
        enter, leave = k.launch_enter_hook, k.launch_exit_hook
        aside = bool(pre_run_hooks or k.__dict__.get("debug", self._debug)
                     or (enter is not None and getattr(enter, "calls", True))
                     or (leave is not None and getattr(leave, "calls", True))
                     or getattr(k, "add_stages_inspection_hook", None) is not None
                     or self._compilation_knobs.__dict__.get("instrumentation_mode", self._instrumentation))
        if not aside:
            self._runtime_seen, self._compilation_seen = dict(k.__dict__), dict(self._compilation_knobs.__dict__)
            self._enter_hooks, self._exit_hooks = (() if h is None else h.calls for h in (enter, leave))
        return aside


_RUNTIME: list = []


def _triton_runtime() -> Optional[_Runtime]:
    if not _RUNTIME:
        try:
            _RUNTIME.append(_Runtime())
        except (ImportError, AttributeError, RuntimeError):  # no GPU driver, or another Triton
            _RUNTIME.append(None)
    return _RUNTIME[0]


class KernelCall:
    """One launch of a ``@triton.jit`` kernel, decided by a plan: the kernel, its grid, its
    arguments after the tensors (every kernel of ours takes its tensors first), its
    constexprs and launch options, the CUDA device. Called with the launch (``direct`` or
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

    def __call__(self, launch: Callable, *tensors) -> None:
        hit = self._hit
        if hit and launch is direct:
            runtime = _RUNTIME[0]
            if not runtime.stepped_aside(self._pre_run_hooks):
                c_launch, g0, g1, g2, function, prefix, tail = hit
                c_launch(g0, g1, g2, runtime.stream(self.device), function, *prefix, *tensors, *tail)
                return
        launch(self.kernel)[self.grid](*tensors, *self.scalars,
                                       **(self._traced if launch is _WRAP_TRITON else self.constexprs))
        if hit is None and launch is direct:
            self._hit = False  # launched once: the next eager launch looks for the compiled kernel
        elif hit is False and launch is direct and self.device is not None:
            fast = _FAST.get(self.kernel)
            if isinstance(fast, _FastLaunch):
                entry = fast.compiled.get(_key(self.device, (*tensors, *self.scalars), self.constexprs))
                if entry is not None:
                    c_launch, prefix, compiled, values = entry
                    grid = (*self.grid, 1, 1)
                    self._hit = (c_launch, grid[0], grid[1], grid[2], compiled.function, prefix,
                                 (*self.scalars, *values))
