"""Triton's runtime as the eager door's fast launch (calls/fast_launch.py) needs it: the current
stream, whether Triton's own switches ask for its own launch (:class:`TritonRuntime`), which
kernels may launch fast (:func:`launchable`), and how to launch a compiled kernel again
(:func:`compiled_launcher`). Bound to the fast launch once, when the kernels are imported
(``kernels/__init__.py``): ``kernels/`` is the only importer of Triton, and the hot path reads
the runtime object as it did (no call through this module per launch).
"""
from __future__ import annotations

import inspect
from typing import Callable

from ..calls import fast_launch


class TritonRuntime:
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


def compiled_launcher(compiled) -> tuple[Callable, tuple]:
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


_LAYOUTS: dict = {}  # launcher class -> whether it has Triton 3.6's layout (see compiled_launcher)


def launchable(kernel) -> bool:
    """A GPU ``@triton.jit`` function (not the interpreter's) whose constexpr parameters come last."""
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):
        return False
    flags = [p.is_constexpr for p in kernel.params]
    return flags == sorted(flags)


def bind() -> None:
    """Give calls/fast_launch.py this runtime (once, from ``kernels/__init__.py``)."""
    fast_launch.bind(fast_launch.TritonBinding(TritonRuntime, launchable, compiled_launcher))
