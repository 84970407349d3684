"""A new op's checklist (docs/ARCHITECTURE.md, "The checklist, kept honest by a test") is the set
of files that name an existing op, derived here: WeightedSum stands for a new op (one kernel op,
one functional op, one module). A table that names the ops by hand, added anywhere, makes the
derived set differ from the list and fails this test; a table moved onto the cards
(tests/training_cases.py) leaves the list, and its count falls with it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OP, NAME = "weighted_sum", "WeightedSum"
NAMES_IT = re.compile(rf"{OP}|{NAME}")
# Not scanned: results a benchmark run writes, the decisions a command records, the append-only
# journal (history), the programs of examples/ (they use the ops), and this file.
NOT_SCANNED = ("benchmarks/results/", "tests/launch_decisions.json", "docs/journal/", "examples/",
               "tests/test_new_op_checklist.py")


def _checklist() -> dict[str, list[str]]:
    """ARCHITECTURE's checklist block: group header -> its files (first word of each indented line);
    each header's "(n)" must be its size."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n(new files \(\d+\)\n.*?)```", text, flags=re.S)
    assert block, "docs/ARCHITECTURE.md has no checklist block starting 'new files (n)'"
    groups: dict[str, list[str]] = {}
    header = None
    for line in block.group(1).splitlines():
        if line.startswith("  "):
            groups[header].append(line.split()[0])
        elif line.strip():
            header = line.strip()
            groups[header] = []
    for header, files in groups.items():
        stated = int(re.search(r"\((\d+)\)$", header).group(1))
        assert stated == len(files), f"ARCHITECTURE's checklist: {header!r} lists {len(files)} files"
    return groups


def _files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the files git lists)")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sorted({f for f in out.split("\0") if f and not f.startswith(NOT_SCANNED) and (ROOT / f).is_file()})


def _naming_the_op() -> set[str]:
    found = set()
    for path in _files():
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # (images and other binary files)
        if NAMES_IT.search(text):
            found.add(path)
    return found


def test_the_checklist_is_every_file_that_names_an_op():
    groups = _checklist()
    new = [f.replace("<op>", OP) for f in groups.pop(next(h for h in groups if h.startswith("new files")))]
    missing_own = [f for f in new if not (ROOT / f).is_file()]
    assert not missing_own, f"the checklist's new files do not exist for {OP}: {missing_own}"
    listed = {f for files in groups.values() for f in files}
    derived = _naming_the_op() - set(new)
    assert derived == listed, (
        f"files naming {OP}/{NAME} outside its own, against docs/ARCHITECTURE.md's checklist: "
        f"not listed {sorted(derived - listed)}; listed but naming it no more {sorted(listed - derived)} "
        f"(read the ops from the cards or kernels/ops.py instead of naming them, or list the file)")
