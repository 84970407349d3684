"""Triton's interpreter, without the re-patching it does on every device-function call.

Under ``TRITON_INTERPRET=1`` a kernel launch patches ``triton.language`` (each builtin replaced
by its interpreted form, found by ``inspect.getmembers``) for the whole grid, and restores it
after. Each call of a ``@triton.jit`` helper from inside the kernel (ours, and Triton's own
``tl.sum``, ``tl.zeros``, ...) patches the language modules of the helper's globals again, and
leaves them patched: the same modules, patched already, each call paying ``inspect.getmembers``
(our kernels call many small helpers, once per program; a quarter of a norm or softmax test's
time). :func:`install` skips that patch exactly where it would change nothing: inside a launch,
for a helper whose language modules were patched since the launch began (by the launch, or by an
earlier helper's patch, which Triton never restores). Every other call patches as Triton does.
Checked against Triton 3.6 and 3.8-3.9, whose interpreters patch alike. Tests only
(``tests/conftest.py``, and the workers of the tests that spawn ranks); where Triton's
interpreter has another shape, nothing changes.
"""
from __future__ import annotations

import inspect


def install() -> bool:
    """Wrap the interpreter's language patch as the top says; True if it was installed now or
    before, False where this Triton's interpreter does not have the parts it wraps."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    grid, patch = getattr(interpreter, "GridExecutor", None), getattr(interpreter, "_patch_lang", None)
    if grid is None or patch is None or not hasattr(interpreter, "_LangPatchScope"):
        return False
    if getattr(patch, "_skips_repatching", False):
        return True
    launch = {"depth": 0, "patched": None}  # the language modules patched since the running launch began
    found: dict = {}  # function -> the language modules its globals hold

    def languages(fn) -> frozenset:
        got = found.get(fn)
        if got is None:
            got = found[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                        if inspect.ismodule(v) and v in (tl, tl.core))
        return got

    def patch_lang(fn):
        if launch["depth"] and launch["patched"] is not None and languages(fn) <= launch["patched"]:
            return interpreter._LangPatchScope()  # (nothing to patch, so nothing to restore)
        scope = patch(fn)
        if launch["depth"]:  # (the launch's own patch, or a helper's of other modules: Triton's
            # standard library holds triton.language.core, which a helper's patch leaves patched)
            launch["patched"] = (launch["patched"] or frozenset()) | languages(fn)
        return scope

    run = grid.__call__

    def call(self, *args, **kwargs):
        outer = launch["patched"]
        launch["depth"] += 1
        launch["patched"] = None
        try:
            return run(self, *args, **kwargs)
        finally:
            launch["depth"] -= 1
            launch["patched"] = outer

    patch_lang._skips_repatching = True
    interpreter._patch_lang = patch_lang
    grid.__call__ = call
    return True
