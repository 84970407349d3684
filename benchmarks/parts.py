"""The parts of ``python -m benchmarks``, found from the ``benchmarks/bench_*.py`` files themselves.

A bench file is a part when it declares ``PART``, a dict written as a literal (strings,
numbers, tuples, lists, dicts, booleans, None), with:

- ``order``: where the part runs among the others, and where its ops' tables come in the report;
- ``ops`` (op parts): the ops its rows hold, in their order, each ``{title, note, measure,
  kernel_ops[, targets]}``: the report's section title and the note under it (what the % of copy
  means); ``measure`` "bandwidth" (bytes-bound: % of copy in the tables and the "below" list, a
  GB/s plot against the row length) or "time" (times only, a bar plot of the times and peak
  memory); ``kernel_ops``: the kernel ops of ``triton_layers.kernels.ops`` it runs (what
  ``benchmarks.dev.registers --ops <op>`` builds); ``targets``: ``{direction: % of copy}`` where the
  op has its own target (else the report's 90%). A part of one op names the op as itself; a
  part of several (``norms``) tells its rows apart by the CSV's ``op`` column;
- ``kernel_ops`` (parts of whole training steps, which have no ``ops``): the kernel ops the
  model runs;
- ``cpu_shapes`` (op parts): the tiny shapes the CPU dry run (tests/test_benchmarks_cli.py) takes
  in place of ``QUICK_SHAPES``;
- ``plot`` (op parts, optional): ``"lines"`` (the default: each op's own figure, as its
  ``measure`` says) or ``"recipes"`` (one figure for the part, ``<name>.png``: each op's % of
  copy at each shape side by side, for ops that are variants of one computation, as the FP8
  recipes are; their own per-op figures are not drawn).

The part's name is the file's, less ``bench_``: ``bench_layernorm.py`` is ``layernorm``, runs as
``python -m benchmarks --ops layernorm`` and writes ``layernorm.csv``. So a new
``bench_<op>.py`` with a ``PART`` joins ``run_all`` (``--ops``), ``report`` (its table),
``plots`` (its figure), ``benchmarks.dev.registers`` (its names) and the tests without an edit
elsewhere; its ``host_cases(r, dev)`` join ``bench_host`` and its ``sanitize_cases(C)``
``scripts/sanitize.py`` (:func:`provided`).

``PART`` is read from the file's text (``ast.literal_eval``), not by importing the file: the
report and the plots need neither torch nor a GPU, and every bench file imports torch.
Needs no torch (but :func:`provided`, which imports the bench files).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import os
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
MEASURES = ("bandwidth", "time")
PLOTS = ("lines", "recipes")


@dataclasses.dataclass(frozen=True)
class Op:
    """One op of a part: its rows' name (``op`` column), the report's title and note, how it is
    measured, its own % of copy targets by direction, the kernel ops it runs."""

    name: str
    title: str
    note: str
    measure: str
    kernel_ops: tuple[str, ...]
    targets: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class Part:
    """A part of ``python -m benchmarks``: ``benchmarks/bench_<name>.py``, writing ``<name>.csv``."""

    name: str
    order: float
    ops: tuple[Op, ...]
    kernel_ops: tuple[str, ...]
    cpu_shapes: tuple[tuple[int, ...], ...]
    plot: str = "lines"

    @property
    def module(self) -> str:
        """The module to import for it: ``benchmarks.bench_<name>``."""
        return f"benchmarks.bench_{self.name}"


def declared(path: str) -> Optional[dict]:
    """The ``PART = {...}`` literal of a bench file, or None where it declares none."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "PART"):
            try:
                return ast.literal_eval(node.value)
            except ValueError as exc:
                raise ValueError(f"{path}: PART must be a literal (read without importing the file): {exc}") from None
    return None


def _part(name: str, spec: dict) -> Part:
    where = f"benchmarks/bench_{name}.py's PART"
    unknown = set(spec) - {"order", "ops", "kernel_ops", "cpu_shapes", "plot"}
    if unknown or "order" not in spec:
        raise ValueError(f"{where}: needs 'order'; unknown keys {sorted(unknown)}")
    if spec.get("plot", "lines") not in PLOTS:
        raise ValueError(f"{where}: plot must be one of {PLOTS}, got {spec['plot']!r}")
    ops = []
    for op, info in spec.get("ops", {}).items():
        if info.get("measure") not in MEASURES:
            raise ValueError(f"{where}: {op}'s measure must be one of {MEASURES}, got {info.get('measure')!r}")
        ops.append(Op(op, info["title"], info["note"], info["measure"], tuple(info["kernel_ops"]),
                      tuple(info.get("targets", {}).items())))
    if len(ops) == 1 and ops[0].name != name:
        raise ValueError(f"{where}: a part of one op names it as itself ({name!r}), got {ops[0].name!r}")
    kernel_ops = tuple(dict.fromkeys(k for op in ops for k in op.kernel_ops)) or tuple(spec.get("kernel_ops", ()))
    return Part(name, spec["order"], tuple(ops), kernel_ops, tuple(tuple(s) for s in spec.get("cpu_shapes", ())),
                spec.get("plot", "lines"))


@functools.lru_cache(maxsize=None)
def parts(folder: str = HERE) -> tuple[Part, ...]:
    """Every part declared by a ``bench_*.py`` file of ``folder``, in their ``order``."""
    found = []
    for file in sorted(os.listdir(folder)):
        if file.startswith("bench_") and file.endswith(".py"):
            spec = declared(os.path.join(folder, file))
            if spec is not None:
                found.append(_part(file[len("bench_"):-len(".py")], spec))
    return tuple(sorted(found, key=lambda p: p.order))


def names() -> tuple[str, ...]:
    """The parts' names, in order: what ``python -m benchmarks --ops`` takes."""
    return tuple(p.name for p in parts())


def _named(items: tuple, name: str):
    """The item of ``items`` called ``name`` (KeyError if none)."""
    for item in items:
        if item.name == name:
            return item
    raise KeyError(name)


def part(name: str) -> Part:
    """The part called ``name`` (KeyError if none)."""
    return _named(parts(), name)


def ops() -> tuple[Op, ...]:
    """Every op of every part, in the parts' order (the report's order)."""
    return tuple(op for p in parts() for op in p.ops)


def op_names() -> tuple[str, ...]:
    """The ops' names, in order."""
    return tuple(op.name for op in ops())


def op_info(name: str) -> Op:
    """The op called ``name`` (KeyError if none)."""
    return _named(ops(), name)


def csv_of(op: str) -> str:
    """The CSV (less ``.csv``) that holds ``op``'s rows: its part's name; ``op`` itself where no
    part declares it."""
    return next((p.name for p in parts() if any(o.name == op for o in p.ops)), op)


def step_parts() -> tuple[str, ...]:
    """The parts without ops of their own (whole training steps), in order."""
    return tuple(p.name for p in parts() if not p.ops)


def kernel_ops(name: str) -> tuple[str, ...]:
    """The kernel ops that a part or an op called ``name`` runs (KeyError if neither)."""
    return _named(parts() + ops(), name).kernel_ops


def provided(name: str) -> list[Callable]:
    """The function ``name`` (``host_cases``, ``sanitize_cases``) of each op part's bench file that
    defines one, in the parts' order; imports those files (and torch)."""
    found = []
    for p in parts():
        fn = getattr(importlib.import_module(p.module), name, None) if p.ops else None
        if fn is not None:
            found.append(fn)
    return found
