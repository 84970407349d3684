"""The "Bad inputs" tables (docs/API.md: one in each op's section) kept in step with their cases,
and one error for a bad value through every door.

Each row is a case in its op's own test file (``BAD_INPUTS``, run there: tests/bad_inputs.py);
here every table's ids are checked against the cases of every file, both ways, so a row without
a case or a case without a row fails. The value doors come from the cards
(tests/training_cases.py). No op is named by hand here.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from triton_layers import CausalSoftmax, CoordinateDescentRouter, TritonLayerNorm

from .training_cases import rows

TESTS = Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "API.md"
TABLE_HEAD = "| id | input | gets |"


def all_cases() -> list:
    """The ``BAD_INPUTS`` of every test file that lists some (found by its text, then imported)."""
    cases = []
    for path in sorted(TESTS.glob("test_*.py")):
        if "\nBAD_INPUTS = [" in path.read_text(encoding="utf-8"):
            cases += importlib.import_module(f"{__package__}.{path.stem}").BAD_INPUTS
    return cases


def test_good_module_configs_still_build():
    # Any int type (numpy's too), sequences of them, torch.Size; ints for float arguments.
    np = pytest.importorskip("numpy")
    assert TritonLayerNorm(np.int64(8)).normalized_shape == (8,)
    assert TritonLayerNorm([2, 4]).normalized_shape == TritonLayerNorm(torch.Size([2, 4])).normalized_shape == (2, 4)
    assert TritonLayerNorm(8, eps=0).eps == 0
    assert CausalSoftmax(scale=1).scale == 1 and CausalSoftmax(scale=None).scale is None
    router = CoordinateDescentRouter(np.int32(8), n_iters=np.int64(3), eps_init=None, route_block_size=16)
    assert (router.dim, router.n_iters, router.eps_init, router.route_block_size) == (8, 3, None, 16)
    assert type(router.dim) is int and type(router.n_iters) is int


# One value checker (triton_layers/_values.py), one rule wherever a value enters: the wrong kind of
# value (a bool or a float for an int, a bool or a non-number for a number, anything but True or
# False for a flag) is a TypeError; the right kind out of range is a ValueError.
# argument -> (its doors: name -> a call with the value, [(bad value, the exception)]): the cards'
# value_doors (tests/training_cases.py)
VALUE_DOORS = rows("value_doors")
VALUE_CASES = [(arg, value, exc) for arg, (_, bad) in VALUE_DOORS.items() for value, exc in bad]


@pytest.mark.parametrize("arg,value,exc", VALUE_CASES, ids=[f"{a}={v!r}" for a, v, _ in VALUE_CASES])
def test_a_bad_value_gets_one_error_through_every_door(arg, value, exc):
    """The functional op, the module and the reference raise the same exception type for the
    same bad value (n_iters=2.0 was a ValueError through the op and a TypeError through the
    module; eps="1e-5" a ValueError through F.layer_norm, a TypeError through TritonLayerNorm;
    the references took n_iters=0, causal="no" or a negative eps without a word)."""
    raised = {}
    for door, call in VALUE_DOORS[arg][0].items():
        try:
            call(value)
        except (TypeError, ValueError) as err:
            raised[door] = type(err)
            assert arg.split()[-1] in str(err), (door, str(err))  # the message names the argument
        else:
            raised[door] = None
    assert raised == dict.fromkeys(raised, exc)


def documented_ids() -> list[str]:
    """The ids of every table of docs/API.md headed ``| id | input | gets |``, in order: each row
    of such a table opens with a backquoted id (a row that does not is an error, not skipped)."""
    ids, in_table = [], False
    for n, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() == TABLE_HEAD:
            in_table = True
        elif in_table and line.startswith("|"):
            if not line.startswith("|---"):
                row = re.match(r"\| `([a-z0-9-]+)` \|", line)
                assert row, f"docs/API.md:{n}: a bad-inputs row without an id: {line!r}"
                ids.append(row.group(1))
        else:
            in_table = False
    return ids


def test_the_tables_list_exactly_these_cases():
    ids = documented_ids()
    assert len(ids) == len(set(ids)), "ids documented twice in docs/API.md's bad-inputs tables"
    cases = all_cases()
    assert len(cases) == len({c.id for c in cases}), "a case id listed twice among the test files' BAD_INPUTS"
    assert set(ids) == {c.id for c in cases}, (
        f"rows without a case: {sorted(set(ids) - {c.id for c in cases})}; "
        f"cases without a row: {sorted({c.id for c in cases} - set(ids))}")
